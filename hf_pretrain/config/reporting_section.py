"""The recipe's `reporting:` section."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import key


@dataclass
class ReportingConfig:
    """What a run records and what it costs: the metrics' interval, the trackers, the price, the phases
    (`training/metrics.py` and `economics/cost.py` own it).
    """

    log_interval: int = key(10, "a metrics.jsonl record every this many steps", math=False, ge=1)
    report_to: str = key(
        "none",
        "experiment trackers, comma-separated: any Accelerate supports (`tensorboard`, `trackio`, `wandb`, "
        "`mlflow`, ...), `all` (every one installed) or `none`",
        math=False,
    )
    price_per_hour: float = key(
        0.0, "rental price of the whole job in $/hour (all GPUs), for cost figures (0 = unknown)", math=False, ge=0
    )
    expected_tokens_per_s: float = key(
        0.0,
        "expected tokens/s of the whole job, for time and cost estimates before "
        "the run (0 = unknown; `hf-pretrain bench` measures it)",
        math=False,
        ge=0,
    )
    phases: dict[str, int] = key(
        factory=dict,
        math=False,
        help="named phases by their last step, e.g. {smoke: 200, proof-of-life: 10000}: each "
        "gets a row (loss drop, cost, cost per loss point) in phases.md when it ends",
    )
