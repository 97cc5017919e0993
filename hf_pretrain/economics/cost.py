"""Money: cost so far, $ per billion tokens, and cost per loss point for each named phase.

Everything here is a pure function of metrics records (`metrics.jsonl`) and a price, so the
training loop, `hf-pretrain report` and the tests compute the same numbers the same way.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hf_pretrain.run_folder.run_dir import RunDir


@dataclass
class Phase:
    """A named range of optimizer steps, (start_step, end_step]."""

    name: str
    start_step: int
    end_step: int


@dataclass
class PhaseRow:
    name: str
    start_step: int
    end_step: int
    loss_start: float
    loss_end: float
    loss_drop: float
    hours: float
    cost: float
    cost_per_loss_point: float | None  # None when the loss did not fall

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def phases_from_recipe(phase_ends: dict[str, int]) -> list[Phase]:
    """`{"smoke": 200, "proof-of-life": 10000, ...}` (end steps, in order) -> consecutive phases."""
    phases, start = [], 0
    for name, end in sorted(phase_ends.items(), key=lambda item: item[1]):
        phases.append(Phase(name, start, end))
        start = end
    return phases


def dollars(hours: float, price_per_hour: float) -> float:
    return hours * price_per_hour


def dollars_per_billion_tokens(tokens_per_s: float, price_per_hour: float) -> float:
    """What a billion tokens cost at this throughput: the number to compare GPUs by, not $/hour."""
    if tokens_per_s <= 0:
        return float("inf")
    return price_per_hour * 1e9 / tokens_per_s / 3600


def _loss_near(train_records: list[dict[str, Any]], step: int) -> float:
    """The logged training loss at the last log line at or before `step` (the first one if none)."""
    before = [r for r in train_records if r["step"] <= step]
    return (before[-1] if before else train_records[0])["loss"]


def _elapsed_at(train_records: list[dict[str, Any]], step: int) -> float:
    if step <= 0:
        return 0.0
    before = [r for r in train_records if r["step"] <= step]
    return before[-1]["elapsed"] if before else 0.0


def phase_row(records: list[dict[str, Any]], phase: Phase, price_per_hour: float) -> PhaseRow:
    """Loss at the start and end of a phase, its cost, and the cost of each loss point it bought.

    The start loss is the first logged loss of the run for the first phase (the loss of the
    untrained model, roughly), else the last logged loss at or before the phase's start.
    """
    train = [r for r in records if r.get("kind", "train") == "train"]
    loss_start = train[0]["loss"] if phase.start_step == 0 else _loss_near(train, phase.start_step)
    loss_end = _loss_near(train, phase.end_step)
    hours = (_elapsed_at(train, phase.end_step) - _elapsed_at(train, phase.start_step)) / 3600
    cost = dollars(hours, price_per_hour)
    drop = loss_start - loss_end
    return PhaseRow(
        phase.name,
        phase.start_step,
        phase.end_step,
        loss_start,
        loss_end,
        drop,
        hours,
        cost,
        cost / drop if drop > 0 else None,
    )


def window_cost_per_loss_point(records: list[dict[str, Any]], window_steps: int, price_per_hour: float) -> float | None:
    """Cost per loss point over the last `window_steps` steps: infinite when the loss did not
    fall at all, None while there are too few records to tell."""
    train = [r for r in records if r.get("kind", "train") == "train"]
    if len(train) < 2 or train[-1]["step"] - train[0]["step"] < window_steps:
        return None
    end = train[-1]["step"]
    row = phase_row(train, Phase("window", end - window_steps, end), price_per_hour)
    return row.cost_per_loss_point if row.loss_drop > 0 else math.inf


def markdown_table(rows: list[PhaseRow]) -> str:
    lines = [
        "| phase | steps | loss start | loss end | drop | hours | cost ($) | $ per loss point |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per_point = f"{r.cost_per_loss_point:,.2f}" if r.cost_per_loss_point is not None else "n/a (no drop)"
        lines.append(
            f"| {r.name} | {r.start_step}-{r.end_step} | {r.loss_start:.3f} | {r.loss_end:.3f} | "
            f"{r.loss_drop:.3f} | {r.hours:.3f} | {r.cost:,.2f} | {per_point} |"
        )
    return "\n".join(lines) + "\n"


def cost_record(record: dict[str, Any], *, price_per_hour: float, max_steps: int) -> dict[str, float]:
    """The money fields of a metrics record: spent so far, $ per billion tokens now, projected total
    (the price and the run's length are all of the recipe they read)."""
    spent = dollars(record["elapsed"] / 3600, price_per_hour)
    return {
        "cost": spent,
        "usd_per_billion_tokens": dollars_per_billion_tokens(record["tokens_per_s"], price_per_hour),
        "projected_cost": spent / record["step"] * max_steps,
    }


def write_phase_table(out: Path, records: list[dict[str, Any]], phases: list[Phase], price_per_hour: float) -> str:
    """Rows for the phases that have ended, kept as phases.json and phases.md of the run folder `out`;
    returns the table."""
    rows = [phase_row(records, phase, price_per_hour) for phase in phases]
    run = RunDir(out)
    run.phases_json.write_text(json.dumps([r.to_dict() for r in rows], indent=1))
    table = markdown_table(rows)
    run.phases_md.write_text(table)
    return table
