"""What spot's preemptions add to a run: each one costs the relaunch (a new machine's time to its first step),
the work since the last checkpoint (half a save interval on average) and, where the new machine is away from
the store, the egress of the newest checkpoint. Spot's price is only cheaper where these leave it so.

With `r` preemptions an hour and `lost` hours lost to each, a run of `W` hours of work takes `T` hours of wall
clock with `T = W + r T lost`, so `T = W / (1 - r lost)`; at `r lost >= 1` it never finishes (every machine is
taken back before it gets further). Every term is a parameter, so each can be switched off (0) and checked.
The default rates are estimates per cloud (spot.yaml beside this module), said as such where they are used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

SPOT_TABLE_FILE = Path(__file__).with_name("spot.yaml")
# A relaunch when the run has measured none of its own, the middle of each stage of docs/engines.md's table
# (an estimate, said as such; tests/test_skypilot_plan.py holds the two equal): the engine notices (1 min),
# provisions a machine (2-5 min), the task installs the project (1-3 min, through uv) and runs the pod check
# (5 min), the step compiles (1 min); the checkpoint's pull comes on top at PULL_GB_PER_S.
RELAUNCH_STAGES_S = {"notice": 60, "provision": 210, "install": 120, "pod check": 300, "compile": 60}
RELAUNCH_ESTIMATE_S = sum(RELAUNCH_STAGES_S.values())
PULL_GB_PER_S = 0.25  # a cloud machine reading a bucket in another region (docs/engines.md: 0.2-1 GB/s)


@dataclass(frozen=True)
class PreemptionRate:
    per_hour: float
    source: str


@cache
def _rates() -> dict[str, PreemptionRate]:
    raw = yaml.safe_load(SPOT_TABLE_FILE.read_text())
    return {cloud: PreemptionRate(float(e["preemptions_per_hour"]), str(e["source"])) for cloud, e in raw.items()}


def preemption_rate(cloud: str, override: float | None = None) -> PreemptionRate:
    """Preemptions an hour of a spot machine of `cloud`: `override` (the command line's) where given, else
    spot.yaml's row for the cloud, else its default row."""
    if override is not None:
        return PreemptionRate(override, "--preemptions_per_hour")
    rates = _rates()
    return rates.get(cloud, rates["default"])


@dataclass(frozen=True)
class PreemptionCost:
    """What one preemption costs the run."""

    relaunch_s: float  # a new machine's time to its first step
    lost_work_s: float  # the steps since the last checkpoint, trained again: half a save interval on average
    egress_usd: float  # the newest checkpoint pulled out of the store's cloud or region (0 where it is not)


@dataclass(frozen=True)
class ExpectedRun:
    hours: float  # wall clock, relaunches and lost work included (inf: it never finishes)
    usd: float
    preemptions: float

    @property
    def finishes(self) -> bool:
        return math.isfinite(self.hours)


def expected_run(work_hours: float, price_per_hour: float, per_hour: float, cost: PreemptionCost) -> ExpectedRun:
    """The expected wall clock and dollars of `work_hours` of training on a machine preempted `per_hour`
    times an hour (0: on-demand), each preemption costing `cost`."""
    lost_hours = (cost.relaunch_s + cost.lost_work_s) / 3600
    share = per_hour * lost_hours  # of each wall-clock hour, what goes to relaunching and training again
    if share >= 1:
        return ExpectedRun(math.inf, math.inf, math.inf)
    hours = work_hours / (1 - share)
    preemptions = per_hour * hours
    return ExpectedRun(hours, hours * price_per_hour + preemptions * cost.egress_usd, preemptions)


# What the trainer cannot time of a relaunch, so a run's own time to its first step leaves it out: the engine
# noticing the preemption, provisioning and installing (RELAUNCH_STAGES_S's first three)
BEFORE_THE_PROCESS_S = sum(RELAUNCH_STAGES_S[stage] for stage in ("notice", "provision", "install"))


def measured_relaunch_s(starts_s: list[float]) -> float | None:
    """A relaunch from a run's own records (the time to the first step of each session after the first, from
    its ledger): their median, and the engine's part the process never sees; None without one."""
    if not starts_s:
        return None
    ordered = sorted(starts_s)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return BEFORE_THE_PROCESS_S + median


def relaunch_estimate_s(checkpoint_gb: float) -> float:
    """A relaunch's time to the first step where the run has measured none: provisioning, install and
    compile (RELAUNCH_ESTIMATE_S) and the checkpoint's pull."""
    return RELAUNCH_ESTIMATE_S + checkpoint_gb / PULL_GB_PER_S
