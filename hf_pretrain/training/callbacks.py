"""How training reaches the work that is not training: publishing and scoring, as callbacks.

The loop calls these on the main process only, and no other process waits for them: a callback
must return at once and do slow work (uploads, benchmarks) in the background. `wait` is the one
place the run blocks on that work, at its very end. Training never imports publish/ or
evaluation/, and they never import training: `Callback` is a protocol, which publish/side_jobs.py's
`SideJobs` meets without naming it, and `hf_pretrain/train.py` hands it in.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from hf_pretrain.run_folder.run_dir import RunDir


class Callback(Protocol):
    """A side job of a run: the three calls the loop makes."""

    def on_checkpoint_saved(self, path: Path, step: int) -> None:
        """A complete checkpoint of `step` is at `path` (it may be pruned later; pin it to keep reading)."""

    def on_train_end(self, run: RunDir) -> None:
        """The schedule is complete (the last step, or early stopping) and its last checkpoint saved."""

    def wait(self) -> None:
        """Return when the work started in the background has finished; called once, at every exit."""


def halt_of(callback: Callback) -> str | None:
    """A callback's reason the run must stop now, if it has one (optional: `halt()`, a run in a store whose
    lease another machine took over); None goes on."""
    halt = getattr(callback, "halt", None)
    return halt() if halt is not None else None


class CallbackList:
    """Several callbacks called in order, as one."""

    def __init__(self, callbacks: Sequence[Callback]):
        self.callbacks = list(callbacks)

    def on_checkpoint_saved(self, path: Path, step: int) -> None:
        for callback in self.callbacks:
            callback.on_checkpoint_saved(path, step)

    def on_train_end(self, run: RunDir) -> None:
        for callback in self.callbacks:
            callback.on_train_end(run)

    def wait(self) -> None:
        for callback in self.callbacks:
            callback.wait()

    def halt(self) -> str | None:
        """The first callback's reason to stop training now (asked each step), else None."""
        return next((reason for c in self.callbacks if (reason := halt_of(c))), None)
