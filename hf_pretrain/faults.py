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
- `hold`: the loop waits before the step, its background work (uploads, sealing, the store's
  heartbeat) going on, until a file named for the step (`9` for `hold:9`) appears in the folder
  `HF_PRETRAIN_RELEASE` names, or until the process dies. A signal during the hold is recorded as
  always and acted on once released. A test's certain point to kill, cut or signal at: the run
  cannot get past it however fast or loaded the machine is (issue 49). `hold:0` holds the start-up,
  before the model is built.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

ENV_VAR = "HF_PRETRAIN_FAULTS"
RELEASE_VAR = "HF_PRETRAIN_RELEASE"


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


def hold_if_asked(step: int, process: int, say: Callable[[str], None]) -> None:
    """The `hold` fault: wait before `step` until the step's release file appears."""
    if not fault_active("hold", step, process):
        return
    release = os.path.join(os.environ.get(RELEASE_VAR, "<HF_PRETRAIN_RELEASE unset>"), str(step))
    say(f"injected fault: holding before step {step} until {release} exists")
    while not os.path.exists(release):
        time.sleep(0.05)
