"""What `plan` is asked: the model (a recipe or a parameter count), its token budget, the GPU and its price,
the link between GPUs; checked as a whole when built (`PlanRequest`), with the defaults of what is left unset."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hf_pretrain.config import Recipe
from hf_pretrain.economics.memory import GRADIENT_BYTES
from hf_pretrain.economics.planning.data_parallel import INTERCONNECT_GBPS

# Share of the datasheet peak a well-tuned ~1B Llama reaches with SDPA and torch.compile (TinyLlama
# reports ~56% on A100s with fused kernels); used only when no measured tokens/s is given.
DEFAULT_MFU = 0.40
# Tokens per optimizer step when no recipe says otherwise (the `1b` recipe's batch).
DEFAULT_GLOBAL_BATCH_TOKENS = 131_072
ALL_GPUS = "all"
# Recipe keys that, given on the command line, are kept in every row instead of searched for.
FIT_KEYS = ("micro_batch_size", "gradient_checkpointing", "checkpointed_layers")


@dataclass(frozen=True)
class PlanRequest:
    """What to plan: the model (a recipe, or a bare parameter count) and how it would be run.

    The fields are the command's flags; unset ones come from the recipe where it says (token budget,
    throughput, price), else from the defaults above. Contradictions raise ValueError naming the flag.
    """

    recipe: Recipe | None = None  # parameters and FLOPs of its model, its token budget, batch, rate, price
    params: float | None = None  # without a recipe: the parameter count (FLOPs per token then 6N)
    tokens: float | None = None  # token budget (unset: the recipe's, else Chinchilla's 20 per parameter)
    global_batch_tokens: int | None = None  # without a recipe: tokens per optimizer step (a recipe has its own)
    gpu: str | None = None  # a GPU of the price table: its price and datasheet peak
    prices: str | None = None  # price table YAML (unset: the shipped one)
    price_per_gpu_hour: float | None = None
    tokens_per_s: float | None = None  # measured tokens/s of one GPU
    mfu: float | None = None  # with --params and a GPU: assume this share of its peak (else DEFAULT_MFU)
    pinned: tuple[str, ...] = ()  # FIT_KEYS given on the command line: kept in every GPU row
    max_gpus: int = 8
    interconnect: str = "nvlink"
    interconnect_gbps: float | None = None  # overrides `interconnect`
    gradient_bytes: float = GRADIENT_BYTES  # bytes per parameter all-reduced each step
    catalog: str | None = None  # with --gpu all: SkyPilot's catalog folder (unset: ~/.sky's where it is; `none`)
    preemptions_per_hour: float | None = None  # one spot rate for every cloud (unset: economics/spot.yaml's)
    relaunch_s: float | None = None  # a relaunch's time to the first step (unset: the estimate, spot.py)
    store: str | None = None  # PROVIDER[:REGION] of egress.yaml (unset: the recipe's output_dir scheme's)

    @property
    def sections(self) -> dict[str, Any]:
        """What a GPU's row reads of the recipe (gpu_ranking.gpu_row): its model, data, run and step as written."""
        r = self.recipe
        if r is None:  # --gpu all and a named GPU's row need a recipe; __post_init__ refuses the first without one
            raise ValueError("a GPU's row fits and models a recipe's model: give --recipe NAME")
        return {"model": r.model, "data": r.data, "train": r.train, "written": r.step_as_written}

    def __post_init__(self) -> None:
        if (self.recipe is None) == (self.params is None):
            raise ValueError("plan a recipe (--recipe) or a parameter count (--params): one of them")
        if self.recipe is not None and self.global_batch_tokens is not None:
            raise ValueError("a recipe's batch is its own: override its global_batch_tokens key instead")
        for name in (
            "params",
            "tokens",
            "global_batch_tokens",
            "price_per_gpu_hour",
            "tokens_per_s",
            "mfu",
            "interconnect_gbps",
            "gradient_bytes",
            "relaunch_s",
        ):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"--{name} must be positive")
        if self.preemptions_per_hour is not None and self.preemptions_per_hour < 0:
            raise ValueError("--preemptions_per_hour must be 0 or more")
        catalog_flags = [
            f"--{n}" for n in ("catalog", "preemptions_per_hour", "relaunch_s", "store") if getattr(self, n) is not None
        ]
        if catalog_flags and self.gpu != ALL_GPUS:
            raise ValueError(f"{' and '.join(catalog_flags)} price the catalog's offers: add --gpu all")
        if self.max_gpus < 1:
            raise ValueError("--max_gpus must be at least 1")
        if self.interconnect not in INTERCONNECT_GBPS:
            raise ValueError(f"--interconnect must be one of {', '.join(sorted(INTERCONNECT_GBPS))}")
        if self.gpu == ALL_GPUS:
            if self.recipe is None:
                raise ValueError("--gpu all fits and models a recipe's model: give --recipe NAME")
            if self.price_per_gpu_hour is not None:
                raise ValueError("--price_per_gpu_hour prices one GPU: with --gpu all, give --prices FILE")
