"""The optimizer (AdamW; or Muon on the matrices, AdamW on the rest) with decay only where it
belongs, and the learning-rate schedule in optimizer steps.

Two schedules (`lr_schedule`):
- `cosine`: linear warmup, then a cosine from the peak to `min_lr_ratio` of it at `max_steps`.
  Every step's rate depends on `max_steps`, so a run stopped early never finished its decay, and
  a run extended later jumps back up the curve.
- `wsd` (warmup, stable, decay): linear warmup, the peak held, and a decay over the last
  `decay_fraction` of `max_steps` (`decay_shape` linear or 1-sqrt). Until the decay starts the rate
  does not depend on `max_steps`, so the run can stop with a finished model at any step (a
  `Cooldown`: decay from here), or go further from its last checkpoint before the decay.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from hf_pretrain.config import OptimConfig

if TYPE_CHECKING:  # the schedule is arithmetic: `plan`, `report` and `stop` read it without importing torch
    import torch


def build_optimizer(model: torch.nn.Module, optim: OptimConfig, fused: bool) -> torch.optim.Optimizer:
    """AdamW where matrices decay and norms and biases (1-D tensors) do not; with `optimizer: muon`,
    Muon takes the decoder's matrices (`muon.py`) and AdamW the rest, with the same split of decay."""
    import torch

    from hf_pretrain.optim.muon import MuonAdamW, is_muon_matrix

    named = [(name, param) for name, param in model.named_parameters() if param.requires_grad]
    matrices = [p for name, p in named if optim.optimizer == "muon" and is_muon_matrix(name, p)]
    on_muon = {id(p) for p in matrices}
    rest = [p for _, p in named if id(p) not in on_muon]
    # The embedding (tied to the head) is 2-D and decays, as it always has here; norms never do.
    groups = [
        {"params": [p for p in rest if p.ndim >= 2], "weight_decay": optim.weight_decay},
        {"params": [p for p in rest if p.ndim < 2], "weight_decay": 0.0},
    ]
    betas = (optim.adam_beta1, optim.adam_beta2)
    if optim.optimizer == "muon":
        return MuonAdamW(
            matrices,
            groups,
            lr=optim.learning_rate,
            muon_lr_scale=(optim.muon_learning_rate or optim.learning_rate) / optim.learning_rate,
            weight_decay=optim.weight_decay,
            momentum=optim.muon_momentum,
            betas=betas,
            eps=optim.adam_eps,
            fused=fused,
        )
    return torch.optim.AdamW(groups, lr=optim.learning_rate, betas=betas, eps=optim.adam_eps, fused=fused)


@dataclass(frozen=True)
class Cooldown:
    """A decay the run began on request (`hf-pretrain stop`, early stopping): steps `start + 1` to
    `end` fall from the rate step `start` had to the schedule's floor. `start == end`: stopped at once."""

    start: int
    end: int
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, saved: dict[str, Any] | None) -> Cooldown | None:
        return cls(**saved) if saved else None


class Schedule:
    """The learning rate of every optimizer step of a run; steps are counted from 1.

    Built from the optim section and the run's length (`Schedule(recipe.optim, max_steps=...)`):
    nothing else shapes the curve, and `resume` asks what another `max_steps` would do without
    rebuilding a recipe. Counted in optimizer steps, so the schedule is the same on 1 process or 64.
    """

    def __init__(self, optim: OptimConfig, *, max_steps: int):
        self.optim = optim
        self.kind = optim.lr_schedule
        self.peak = optim.learning_rate
        self.floor = optim.learning_rate * optim.min_lr_ratio
        self.max_steps = max_steps
        self.warmup = optim.warmup_within(max_steps)
        # wsd: the final decay takes the last `decay_fraction` of the steps, never the warmup's
        self.decay_steps = min(round(optim.decay_fraction * self.max_steps), self.max_steps - self.warmup)

    def lr(self, step: int, cooldown: Cooldown | None = None) -> float:
        if cooldown is not None and step > cooldown.start:
            start_lr = self.lr(cooldown.start)
            return self._decayed(start_lr, (step - cooldown.start) / max(1, cooldown.end - cooldown.start))
        if step <= self.warmup:
            return self.peak * step / self.warmup
        if self.kind == "cosine":
            progress = min(1.0, (step - 1 - self.warmup) / max(1, self.max_steps - self.warmup))
            return self.floor + 0.5 * (self.peak - self.floor) * (1.0 + math.cos(math.pi * progress))
        start = self.max_steps - self.decay_steps
        if step <= start:
            return self.peak
        return self._decayed(self.peak, (step - start) / self.decay_steps)

    def _decayed(self, start_lr: float, progress: float) -> float:
        """From `start_lr` (progress 0) to the floor (progress 1) in the recipe's decay shape."""
        progress = min(1.0, progress)
        remaining = 1.0 - progress if self.optim.decay_shape == "linear" else 1.0 - math.sqrt(progress)
        return self.floor + (start_lr - self.floor) * remaining

    def end(self, cooldown: Cooldown | None = None) -> int:
        """The last step of the run: `max_steps`, or the end of a cooldown."""
        return cooldown.end if cooldown is not None else self.max_steps

    def decay_start(self, cooldown: Cooldown | None = None) -> int | None:
        """The last step before the final decay (the checkpoint a run goes further from); None for a
        cosine, which decays from the end of its warmup on."""
        if cooldown is not None:
            return cooldown.start
        if self.kind == "wsd" and self.decay_steps > 0:
            return self.max_steps - self.decay_steps
        return None

    def left_decay_unfinished(self, step: int, lr: float) -> bool:
        """Whether a run that ended at `step` with learning rate `lr` stopped above its floor. A
        cosine's last step is its end wherever its value sits; a wsd run without a decay
        (decay_fraction 0, or warmed up over the whole run) ends at the peak: unfinished."""
        if self.kind == "cosine" and step >= self.max_steps:
            return False
        return lr > self.floor * 1.01

    def stable_steps(self, cooldown: Cooldown | None = None) -> tuple[int, int]:
        """(first, last) steps after the warmup and before any decay: where the loss follows the
        data alone, so a power law fits it (for a cosine, every step after the warmup)."""
        last = self.decay_start(cooldown)
        return self.warmup + 1, self.end(cooldown) if last is None else last

    def cools_down_on_stop(self) -> bool:
        """Whether a stop request decays before it stops by default: a wsd run at its peak would
        otherwise leave an unfinished model; a cosine is already somewhere down its curve."""
        return self.kind == "wsd"

    def default_cooldown_steps(self, step: int) -> int:
        """The recipe's decay fraction of the steps done so far."""
        return max(1, round(self.optim.decay_fraction * step)) if self.cools_down_on_stop() else 0

    def cooldown(self, step: int, steps: int, reason: str) -> Cooldown:
        """A decay of `steps` steps after `step`, never past `max_steps`."""
        return Cooldown(step, min(step + max(0, steps), max(step, self.max_steps)), reason)

    def describe(self) -> str:
        """One line for the log and the model card."""
        floor = f"{self.optim.min_lr_ratio:g} x peak"
        if self.kind == "cosine":
            return f"{self.warmup:,} warmup steps, cosine to {floor} over {self.max_steps:,} steps"
        return (
            f"wsd: {self.warmup:,} warmup steps, the peak held to step {self.max_steps - self.decay_steps:,}, "
            f"{self.optim.decay_shape} decay to {floor} over the last {self.decay_steps:,} steps"
        )


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's rate on every group, times the group's own scale (Muon's matrices may differ)."""
    from hf_pretrain.optim.muon import LR_SCALE

    for group in optimizer.param_groups:
        group["lr"] = lr * group.get(LR_SCALE, 1.0)
