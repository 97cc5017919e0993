"""The trackers `report_to` names, installed: Accelerate skips a missing one with no more than a debug
line, so a run would go on without the dashboard it was asked for."""

from __future__ import annotations

from importlib.util import find_spec

import accelerate
from accelerate.tracking import get_available_trackers

from hf_pretrain.config import ReportingConfig, tracker_names
from hf_pretrain.preflight.result import CheckResult


def check_trackers(reporting: ReportingConfig) -> CheckResult:
    """Fail when a named tracker is missing (with its `pip install`) or installed in a version Accelerate
    cannot use; `all` takes whatever is installed, so it only warns when that is nothing."""
    names = tracker_names(reporting.report_to)
    if not names:
        return CheckResult("trackers", "skip", "report_to is none")
    usable = [tracker.value for tracker in get_available_trackers()]  # Accelerate's own is_*_available
    missing = [name for name in names if name != "all" and name not in usable]
    absent = [name for name in missing if find_spec(name) is None]  # a tracker's module is its pip name
    unusable = [name for name in missing if name not in absent]  # e.g. aim 4, which Accelerate refuses
    if absent:
        return CheckResult(
            "trackers",
            "fail",
            f"report_to names {', '.join(absent)}, not installed",
            f"pip install {' '.join(absent)}",
        )
    if unusable:
        return CheckResult(
            "trackers",
            "fail",
            f"{', '.join(unusable)} installed, in a version Accelerate {accelerate.__version__} cannot use",
            f"install a version Accelerate supports, or take {', '.join(unusable)} out of report_to",
        )
    if "all" in names and not usable:
        return CheckResult(
            "trackers",
            "warn",
            "report_to=all, but no tracker Accelerate supports is installed: metrics.jsonl only",
            "pip install tensorboard (or trackio, wandb, mlflow, ...)",
        )
    return CheckResult("trackers", "pass", ", ".join(usable if "all" in names else names))
