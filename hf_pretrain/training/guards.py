"""When a run stops: non-finite steps, loss spikes, SIGTERM/SIGINT, early stopping, the schedule.

Every process must stop at the same step. Non-finite steps, `stop_at_step` and `max_steps` need no
exchange (every process sees the same synchronised gradient norm and the same step); a signal can
reach one process only, and early stopping is decided on the main process, so those two flags are
combined in one all-reduce per step (`Guards.decide`).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate import Accelerator

from hf_pretrain.config import TrainConfig
from hf_pretrain.economics.cost import window_cost_per_loss_point

if TYPE_CHECKING:
    from hf_pretrain.training.metrics import RunLogger
    from hf_pretrain.training.step import StepResult

# Exit codes a job scheduler or wrapper script can act on.
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped on a signal with a good checkpoint; rerun to resume
EXIT_SAVE_FAILED = 74  # EX_IOERR: a checkpoint could not be written; the previous one is intact
EXIT_DIVERGED = 65  # EX_DATAERR: too many non-finite steps in a row
EXIT_PREFLIGHT = 78  # EX_CONFIG: a preflight check failed; nothing was started

CHECKPOINT = "{checkpoint}"  # stands in a stop message for the checkpoint saved on the way out


@dataclass
class Stop:
    """Why and how the run ends. Every stop saves a checkpoint first; a finished schedule (the last
    step, or early stopping) also gets its side jobs' `on_train_end` (final/)."""

    exit_code: int
    reason: str = ""
    finished: bool = False

    def message(self, checkpoint: Path | None) -> str:
        return self.reason.replace(CHECKPOINT, str(checkpoint))


def agree(accelerator: Accelerator, *flags: bool) -> list[bool]:
    """Each flag, true on every process when it is true on at least one: one all-reduce for all of them."""
    if accelerator.num_processes == 1:
        return list(flags)
    together = accelerator.reduce(torch.tensor([float(f) for f in flags], device=accelerator.device), "max")
    return [bool(v) for v in together.tolist()]


class GracefulStop:
    """Records the first SIGTERM/SIGINT so the loop can stop at the next step boundary with a
    checkpoint; a second signal exits at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

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


class EarlyStop:
    """When to stop paying: cost per loss point over a window, or validation loss that stopped
    improving. Both rules are off unless the recipe sets them; `reason` says which fired, and why."""

    def __init__(self, train: TrainConfig):
        self.train = train
        self.reason: str | None = None
        self.best_val_loss = float("inf")
        self.evals_without_improvement = 0

    def observe_cost(self, history: list[dict[str, Any]]) -> None:
        limit = self.train.early_stop_cost_per_loss_point
        if not limit or self.reason:
            return
        cost = window_cost_per_loss_point(history, self.train.early_stop_window, self.train.price_per_hour)
        if cost is not None and cost > limit:
            self.reason = (f"the last {self.train.early_stop_window} steps cost ${cost:,.2f} per loss point, "
                           f"above early_stop_cost_per_loss_point=${limit:,.2f}")

    def observe_val_loss(self, val_loss: float) -> None:
        patience = self.train.early_stop_patience
        if not patience or self.reason:
            return
        if val_loss < self.best_val_loss - self.train.early_stop_min_delta:
            self.best_val_loss, self.evals_without_improvement = val_loss, 0
            return
        self.evals_without_improvement += 1
        if self.evals_without_improvement >= patience:
            self.reason = (f"validation loss has not improved by {self.train.early_stop_min_delta} for {patience} "
                           f"evaluations (best {self.best_val_loss:.4f}, now {val_loss:.4f})")


class Guards:
    """The run's health and its stop decision, step by step. Use as a context manager: inside it,
    SIGTERM/SIGINT ask for a graceful stop instead of killing the process."""

    def __init__(self, train: TrainConfig, accelerator: Accelerator, log: RunLogger):
        self.train = train
        self.accelerator = accelerator
        self.log = log
        self.signals = GracefulStop(log.say)
        self.early_stop = EarlyStop(train)
        self.bad_in_a_row = 0
        self.recent_loss: float | None = None  # running average, for spike detection
        self.last_step_healthy = True

    def __enter__(self) -> Guards:
        self.signals.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.signals.__exit__(*exc)

    def check(self, step: int, result: StepResult) -> bool:
        """False for a non-finite step (the optimizer skipped it, weights untouched); logs loss spikes."""
        loss, grad_norm = result.loss, result.grad_norm
        self.last_step_healthy = result.finite
        if not self.last_step_healthy:
            self.bad_in_a_row += 1
            self.log.record({"kind": "skipped", "step": step, "loss": str(loss), "grad_norm": str(grad_norm)})
            self.log.say(f"step {step}: non-finite loss {loss} / grad norm {grad_norm}: step skipped, weights "
                         f"untouched ({self.bad_in_a_row} in a row, stop at {self.train.max_bad_steps})")
            return False
        self.bad_in_a_row = 0
        if self.recent_loss is not None and loss > self.train.loss_spike_factor * self.recent_loss:
            self.log.record({"kind": "spike", "step": step, "loss": loss, "recent_loss": self.recent_loss})
            self.log.say(f"step {step}: loss spike {loss:.3f} against a recent average of {self.recent_loss:.3f}")
        self.recent_loss = loss if self.recent_loss is None else 0.9 * self.recent_loss + 0.1 * loss
        return True

    def observe_val_loss(self, val_loss: float) -> None:
        self.early_stop.observe_val_loss(val_loss)

    def decide(self, step: int, history: list[dict[str, Any]]) -> Stop | None:
        """Whether the run stops after `step`, the same answer on every process."""
        if self.last_step_healthy and step % self.train.log_interval == 0:
            self.early_stop.observe_cost(history)
        # the step's one exchange: a signal may have reached any process; early stopping is the main one's call
        signalled, stop_early = agree(self.accelerator, self.signals.signal_name is not None,
                                      self.early_stop.reason is not None and self.accelerator.is_main_process)
        if self.bad_in_a_row >= self.train.max_bad_steps:
            return Stop(EXIT_DIVERGED,
                        f"stopped: {self.bad_in_a_row} non-finite steps in a row. {CHECKPOINT} holds the weights from "
                        f"before step {step - self.bad_in_a_row + 1} (skipped steps change nothing) with the data "
                        f"position past the bad batches; lower learning_rate or raise warmup_steps, then rerun to "
                        f"resume.")
        if signalled:
            return Stop(EXIT_PREEMPTED, f"stopped by {self.signals.signal_name or 'a signal to another process'} "
                                        f"after step {step}; checkpoint {CHECKPOINT}. Rerun the same command to resume.")
        if step == self.train.stop_at_step:
            return Stop(0, f"stopped at step {step} as asked (stop_at_step); rerun the same command to continue")
        if stop_early:
            return Stop(0, f"early stop at step {step}: {self.early_stop.reason or 'decided on the main process'}",
                        finished=True)
        if step >= self.train.max_steps:
            return Stop(0, finished=True)
        return None
