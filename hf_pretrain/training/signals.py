"""Stop on SIGTERM/SIGINT at the next step boundary, with a checkpoint; a second signal exits at once."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import torch
from accelerate import Accelerator

# Exit codes a job scheduler or wrapper script can act on.
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped on a signal with a good checkpoint; rerun to resume
EXIT_SAVE_FAILED = 74  # EX_IOERR: a checkpoint could not be written; the previous one is intact
EXIT_DIVERGED = 65  # EX_DATAERR: too many non-finite steps in a row
EXIT_PREFLIGHT = 78  # EX_CONFIG: a preflight check failed; nothing was started


class GracefulStop:
    """Records the first SIGTERM/SIGINT; the loop asks `requested(accelerator)` after each step."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.signal_name: str | None = None
        self._previous = {}

    def __enter__(self) -> GracefulStop:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal_name is not None:
            os.write(2, f"\n{name} again: exiting now, without a checkpoint\n".encode())
            os._exit(128 + signum)
        self.signal_name = name
        self.log(f"\n{name} received: finishing this step and writing a checkpoint (send it again to exit at once)")

    def requested(self, accelerator: Accelerator) -> bool:
        """True on every process once any process got a signal, so they all stop at the same step."""
        return any_process(accelerator, self.signal_name is not None)


def any_process(accelerator: Accelerator, flag: bool) -> bool:
    """True on every process when `flag` is true on at least one: a decision they all take together."""
    if accelerator.num_processes == 1:
        return flag
    return bool(accelerator.reduce(torch.tensor(float(flag), device=accelerator.device), "max").item())
