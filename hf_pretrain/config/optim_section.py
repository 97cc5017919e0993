"""The recipe's `optim:` section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .keys import key


@dataclass
class OptimConfig:
    """The optimizer and the learning-rate schedule (`hf_pretrain/optim/build.py` owns it: AdamW or Muon, cosine
    or wsd).
    """

    learning_rate: float = key(1e-3, "peak learning rate", gt=0, le=1)
    min_lr_ratio: float = key(0.1, "the schedule (and any cooldown) decays to learning_rate * min_lr_ratio", ge=0, le=1)
    warmup_steps: int = key(
        10, "linear warmup steps (at or above max_steps: the whole run warms up, with a warning)", ge=0
    )
    lr_schedule: Literal["cosine", "wsd"] = key(
        "cosine",
        "`cosine` (warmup, then a cosine over max_steps) or `wsd` (warmup, the peak held, "
        "a final decay): a wsd run can stop with a finished model at any step and go "
        "further later",
    )
    decay_fraction: float = key(
        0.2,
        "wsd: share of max_steps spent in the final decay; also the default cooldown of "
        "`hf-pretrain stop`, as a share of the steps done",
        ge=0,
        le=1,
    )
    decay_shape: Literal["linear", "1-sqrt"] = key(
        "1-sqrt", "wsd decay and cooldowns: `linear` or `1-sqrt` (falls fast, then flattens)"
    )
    # Muon (orthogonalised momentum) on the decoder's 2-D matrices, AdamW on the rest: nanochat's split.
    optimizer: Literal["adamw", "muon"] = key(
        "adamw",
        "`adamw` for every tensor, or `muon`: torch.optim.Muon on the decoder's 2-D weight matrices "
        "(attention and MLP projections), AdamW on the embedding, head and norms",
    )
    muon_learning_rate: float = key(
        0.0,
        "muon: the matrices' peak rate (0 = learning_rate; Muon's updates are scaled to AdamW's RMS, "
        "so AdamW's rate carries over); the schedule scales both rates alike",
        ge=0,
        le=1,
    )
    muon_momentum: float = key(0.95, "muon: momentum of the matrices (Nesterov)", ge=0, lt=1)
    weight_decay: float = key(0.1, "decoupled decay on matrices only (AdamW's and Muon's alike)", ge=0)
    adam_beta1: float = key(0.9, "AdamW first-moment decay", ge=0, lt=1)
    adam_beta2: float = key(0.95, "AdamW second-moment decay", ge=0, lt=1)
    adam_eps: float = key(1e-8, "AdamW denominator epsilon", gt=0)
    grad_clip: float = key(1.0, "clip the global gradient norm to this (0 = off)", ge=0)

    def warmup_within(self, max_steps: int) -> int:
        """The warmup of a run of `max_steps` steps: `warmup_steps`, or the whole run when it is not
        shorter (the recipe notes it). One rule for the schedule and the recipe's own figures."""
        return min(self.warmup_steps, max_steps)
