"""SIGTERM before the training loop runs: the session ends at once, and says so.

The loop's guards (guards.py) turn SIGTERM into a stop with a checkpoint, but only once the loop
runs; before that a session spends seconds to minutes in its preflight, building the model, loading
a checkpoint, starting the data workers. A scheduler that preempts the job then must not leave a
`status.json` that reads `running` and an exit code of 143: `StartUpSignals` (held by the session,
training/session.py) turns that SIGTERM into `StoppedDuringStartUp`, recorded as `preempted` (75):
nothing of this session was trained, so nothing is lost, and the same command goes on.

Once the loop has ended (`loop_ended`, said by the guards) the session is on its way out with its
ending decided: a signal then changes nothing, and is said so; a second one exits at once.

A second stop signal, at any moment (here or in the loop's guards), exits at once (`exit_at_once`):
with a documented code (75 for SIGTERM or the launcher's exit, 130 for SIGINT) and a status.json
that says so, not `running` and 143.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from hf_pretrain.exit_codes import EXIT_INTERRUPTED, EXIT_PREEMPTED
from hf_pretrain.processes import LAUNCHER_GONE, followed_launcher, launcher_gone


class StoppedDuringStartUp(BaseException):
    """A BaseException, as KeyboardInterrupt is: no `except Exception` on the way (a preflight check
    that reports its own crash) may swallow it."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name

    def __str__(self) -> str:
        return (
            f"stopped by {self.signal_name} during start-up, before the first step of this session: nothing "
            f"was lost. Rerun the same command to resume"
        )


_active: StartUpSignals | None = None
# The session's status.json writer while it holds the run folder: (exit code, reason) -> the exit code
# to use (the session's own, if it has recorded its ending already).
_record_exit: Callable[[int, str], int] | None = None


def record_exits_with(record: Callable[[int, str], int] | None) -> None:
    """Said by the session: how a signal that exits at once records the session's ending (None: not at all)."""
    global _record_exit
    _record_exit = record


def exit_at_once(name: str, signum: int, lost: str) -> NoReturn:
    """A stop signal sent again: exit now, saying so on stderr and in status.json, with 75 (SIGTERM, the
    launcher's exit: rerun to resume from the newest checkpoint) or 130 (SIGINT)."""
    code = EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_PREEMPTED
    os.write(2, f"\n{name} again: exiting now, {lost}\n".encode())
    if _record_exit is not None:
        try:
            code = _record_exit(code, f"stopped by {name} sent twice: exited at once, {lost}")
        except BaseException as exc:  # a full disk, say: the process must still end at once
            os.write(2, f"status.json could not be written: {exc}\n".encode())
    os._exit(code)


class StartUpSignals:
    """`with StartUpSignals(): ...`: SIGTERM (and, under a launcher, its exit) raises StoppedDuringStartUp
    until the loop's guards take over; after the loop, a signal is noted and the session ends as decided."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}
        self.loop_over = False
        self.late_signal: str | None = None

    def __enter__(self) -> StartUpSignals:
        global _active
        signals = [signal.SIGTERM] + ([LAUNCHER_GONE] if followed_launcher() is not None else [])
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        _active = self
        return self

    def __exit__(self, *exc) -> None:
        global _active
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        _active = None

    def _handle(self, signum: int, frame) -> None:
        if signum == LAUNCHER_GONE and not launcher_gone():
            return  # the kernel also sends it when the launcher's thread that started us ends (guards.py)
        name = "the exit of its launcher" if signum == LAUNCHER_GONE else signal.Signals(signum).name
        if self.late_signal is not None:
            exit_at_once(name, signum, "before the session had recorded its ending")
        if self.loop_over:  # the ending is decided and being written: changing it now would only lie
            self.late_signal = name
            print(f"{name} received: the session is already ending (send it again to exit at once)", file=sys.stderr)
            return
        self.late_signal = name  # a second one, while the session records this one, exits at once
        raise StoppedDuringStartUp(name)


def loop_ended() -> None:
    """Said by the loop's guards as they hand the signals back: from now on, the session is ending."""
    if _active is not None:
        _active.loop_over = True
