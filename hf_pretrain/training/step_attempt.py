"""One optimizer step as the loop attempts it: a data read that failed ends the run as a preemption
does, and the session's first step is put on record.

- The data's store (a `data_dir` URL, store/data/) bounds every read it makes (store/store_calls.py:
  the client's timeouts and tries, then a deadline on the whole read); what still fails is a `StoreError`
  naming the URL the user gave. Before the loop it refuses the start (exit 78: nothing was started, the
  line names the fix). Inside the loop it is not the user's input that is wrong but a store that stopped
  answering for a while: the step in progress is dropped (its micro-batches change nothing before the
  optimizer's update), the last finished step is checkpointed, and the run exits 75 (`preempted`,
  `rerun` true), the code an engine relaunches on (hf_pretrain/engines/); never 78, which tells a
  scheduler not to try again. One process's failure: the others stop at their next collective, where
  the watchdog (`hang_timeout_s`) ends them.
- After the first step of the session, the run's ledger (run_folder/sessions.py) records how long the
  session took to get there, and what that time went to.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hf_pretrain.exit_codes import EXIT_PREEMPTED
from hf_pretrain.run_folder.sessions import note_first_step
from hf_pretrain.store.store_calls import StoreError
from hf_pretrain.training.guards import CHECKPOINT, Stop
from hf_pretrain.training.step import StepResult


class StepAttempt:
    """`result, stop = attempt(n)`: step n's result, or None and the stop of a data read that failed."""

    def __init__(self, train_step: Callable[[int], StepResult], device: str):
        self.train_step, self.device = train_step, device
        self.began, self.noted = time.monotonic(), False

    def __call__(self, step: int) -> tuple[StepResult | None, Stop | None]:
        try:
            result = self.train_step(step)
        except StoreError as exc:  # the data's store failed within its bounds
            return None, data_store_stop(step - 1, exc)
        if not self.noted:  # sessions.jsonl: this session's time to its first step, and what it went to
            self.noted = note_first_step(step, self.device, self.began)
        return result, None


def data_store_stop(step: int, error: StoreError) -> Stop:
    """The stop after `step` for a data read that failed: a checkpoint, exit 75, the store's line."""
    line = str(error).strip().splitlines()[-1]  # raised in a loader worker: the worker's traceback before it
    line = line.split(f"{type(error).__name__}: ", 1)[-1]
    return Stop(
        EXIT_PREEMPTED,
        f"stopped after step {step}: the data could not be read: {line}; checkpoint {CHECKPOINT}. Rerun the same "
        f"command to resume once the store answers (an engine relaunches on this exit code)",
    )
