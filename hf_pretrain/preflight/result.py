"""What a preflight check reports, the table that shows it, and the error that stops a run."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Status = Literal["pass", "warn", "fail", "skip"]
# Upper case for what needs attention, so it stands out in a long table.
STATUS_LABEL: dict[str, str] = {"pass": "pass", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict: `reason` says what was found, `fix` what to do about it."""

    name: str
    status: Status
    reason: str
    fix: str = ""


class PreflightError(RuntimeError):
    """The run would die: at least one check failed. `results` holds every check's verdict."""

    def __init__(self, results: list[CheckResult]) -> None:
        self.results = results
        failed = [r for r in results if r.status == "fail"]
        lines = [f"preflight: {len(failed)} check(s) failed, the run would not survive:"]
        for r in failed:
            lines.append(f"  {r.name}: {r.reason}" + (f"\n    fix: {r.fix}" if r.fix else ""))
        super().__init__("\n".join(lines))


def format_table(results: Iterable[CheckResult], finished: str | None = None) -> str:
    """One row per check; a fix goes on its own line under anything that is not a pass. `finished` (a run
    that completed: what it says) replaces the verdict: such a run is not "ready to train"."""
    results = list(results)
    width = max([len("check")] + [len(r.name) for r in results])
    rows = [f"{'check'.ljust(width)}  status  result"]
    for r in results:
        rows.append(f"{r.name.ljust(width)}  {STATUS_LABEL[r.status].ljust(6)}  {r.reason}")
        if r.fix and r.status != "pass":
            rows.append(f"{''.ljust(width)}          fix: {r.fix}")
    counts = {s: sum(r.status == s for r in results) for s in STATUS_LABEL}
    verdict = "fix the failures before training." if counts["fail"] else finished or "ready to train."
    rows.append(
        f"\n{counts['pass']} passed, {counts['warn']} warning(s), {counts['fail']} failed, "
        f"{counts['skip']} skipped: {verdict}"
    )
    return "\n".join(rows)
