"""A run folder's stop request (`stop_request.json`): what `hf-pretrain stop` (stop_command.py, beside
this file) writes, the running job reads at each step (training/guards.py) and answers, and the
doctor shows with its age.

    {"cooldown_steps": 500, "requested_at": "2026-11-23T10:02:11+0000", "requested_at_epoch": 1795...,
     "answered_at_step": 4200, "answer": "began its cooldown: steps 4201-4700"}

A request is pending until the job answers it. The answer stays in the file until the run has
finished: a session killed before its cooldown reached a checkpoint resumes from an earlier one and
reads the request again. A request written before a start that goes further (another max_steps) is
set aside, said in the log, not applied: it was about the old plan (`at_start`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from hf_pretrain.formatting import human_duration
from hf_pretrain.run_folder.json_files import write_json_atomically
from hf_pretrain.run_folder.run_dir import RunDir


@dataclass(frozen=True)
class StopRequest:
    cooldown_steps: int | None  # None: the recipe's default (decay_fraction x the steps done; 0 for a cosine)
    requested_at: float | None = None  # seconds since the epoch; the file's mtime when it does not say
    answered_at_step: int | None = None  # the step at which the job answered it
    answer: str | None = None  # how: a cooldown begun, or refused because one was running

    @property
    def answered(self) -> bool:
        return self.answered_at_step is not None

    def age_s(self) -> float | None:
        return None if self.requested_at is None else max(0.0, time.time() - self.requested_at)

    def describe(self) -> str:
        """`a stop request of 12.0 min ago (cooldown 500 steps)`."""
        age = self.age_s()
        when = f" of {human_duration(age)} ago" if age is not None else ""
        steps = "the default cooldown" if self.cooldown_steps is None else f"cooldown {self.cooldown_steps:,} steps"
        return f"a stop request{when} ({steps})"


def request_stop(run_dir: str | Path, cooldown_steps: int | None = None) -> Path:
    """Write a new request, whole or not at all (a job reading it meanwhile never sees half of it);
    it replaces any request already there."""
    path = RunDir(run_dir).stop_request
    write_json_atomically(
        path,
        {
            "cooldown_steps": cooldown_steps,
            "requested_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "requested_at_epoch": time.time(),
        },
    )
    return path


def read_stop_request(run_dir: str | Path) -> StopRequest | None:
    """The request, if any. A file that cannot be read still asks to stop, with the default
    cooldown: whoever wrote it wanted the run to finish."""
    path = RunDir(run_dir).stop_request
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    try:
        saved = json.loads(path.read_text())
        steps = saved.get("cooldown_steps")
        steps = int(steps) if steps is not None and int(steps) >= 0 else None
    except (OSError, ValueError, TypeError, AttributeError):
        return StopRequest(None, mtime)
    at = saved.get("requested_at_epoch")
    answered = saved.get("answered_at_step")
    return StopRequest(
        steps,
        float(at) if isinstance(at, (int, float)) else mtime,
        int(answered) if isinstance(answered, int) else None,
        saved.get("answer"),
    )


def answer_stop_request(run_dir: str | Path, step: int, answer: str) -> None:
    """Record in the file that the job has read the request at `step`, and what it did (main process only)."""
    path = RunDir(run_dir).stop_request
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict):
            raise ValueError
    except (OSError, ValueError):
        saved = {"cooldown_steps": None}
    try:
        write_json_atomically(path, {**saved, "answered_at_step": step, "answer": answer})
    except OSError:  # the request was still answered; the file just does not say so
        pass


def clear_stop_request(run_dir: str | Path) -> None:
    RunDir(run_dir).stop_request.unlink(missing_ok=True)


def at_start(request: StopRequest, max_steps_changed: bool, cooldown_end: int | None) -> tuple[bool, str]:
    """Whether a request found when a run starts applies to it, and the line that says so: it does, at
    the first step, unless this start goes further (another max_steps: a new plan the request was not
    about, so it is set aside) or resumes a cooldown (`cooldown_end`) that already answers it."""
    if max_steps_changed:
        return False, (
            f"{request.describe()} was written before this start, for the old plan: set aside, not applied, "
            f"since this start changes max_steps (`hf-pretrain stop` again to finish this run early)"
        )
    if cooldown_end is not None:
        return False, f"{request.describe()}: the run resumes the cooldown that ends it at step {cooldown_end:,}"
    if request.answered:
        return True, (
            f"{request.describe()}, answered at step {request.answered_at_step:,} by a session that ended before "
            f"its cooldown reached a checkpoint: applied again at the first step"
        )
    return True, f"{request.describe()}, written while no training ran: applied at the first step"
