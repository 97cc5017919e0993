"""Fault injection for the survival tests: make a run fail at a chosen point, on purpose.

`HF_PRETRAIN_FAULTS` holds comma-separated `name:STEP` or `name:FIRST-LAST` entries, e.g.
`kill-during-save:8,nan-loss:5-7`; `name@P:STEP` limits one to process P (its index in the job),
e.g. `disk-full@0:8`. Unset (always, outside tests) it costs one dict lookup.

- `kill-during-save`: SIGKILL the main process after the checkpoint's state files are written
  but before its manifest, i.e. a torn checkpoint.
- `disk-full`: the checkpoint write fails with ENOSPC halfway.
- `nan-loss`: the loss of these steps becomes NaN.
- `crash`: an uncaught exception in the step (a bug, a bad batch): the process must still end.
- `hang`: the process stops itself (SIGSTOP) at the start of the step, as a frozen GPU or a dead
  network card would leave it: the others wait at the next collective (training/watchdog.py).
"""

from __future__ import annotations

import os

ENV_VAR = "HF_PRETRAIN_FAULTS"


def fault_active(name: str, step: int, process: int | None = None) -> bool:
    """Whether fault `name` fires at `step` in this process (`process`: its index; an entry that
    names a process fires only there)."""
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return False
    for entry in spec.split(","):
        fault, _, steps = entry.strip().partition(":")
        fault, _, only = fault.partition("@")
        if fault != name or (only and (process is None or int(only) != process)):
            continue
        first, _, last = steps.partition("-")
        if int(first) <= step <= int(last or first):
            return True
    return False
