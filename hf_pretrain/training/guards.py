"""When a run stops: non-finite steps, loss spikes, SIGTERM/SIGINT, early stopping, a stop request,
the schedule.

Every process must stop at the same step. Non-finite steps, `stop_at_step` and `max_steps` need no
exchange (every process sees the same synchronised gradient norm and the same step); a signal can
reach one process only, and early stopping and `hf-pretrain stop` are seen on the main process, so
those are combined in one all-reduce per step (`Guards.decide`).

Finishing early (a stop request, early stopping) does not cut a wsd run: it begins a cooldown, a
decay from the rate of the moment (training/state.py keeps it), and the run ends, with final/, when
the cooldown does. A cosine run stops at once, and says that its decay is unfinished.

A stop request found when a session starts (written while no training ran, or answered by a session
that ended before its cooldown was saved) is taken up here too (`take_up_at_start`): applied at the
first step, or set aside when this start is a new plan; the request file is hf_pretrain/run_folder/stop_request.py.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate import Accelerator

from hf_pretrain.config.reporting_section import ReportingConfig
from hf_pretrain.config.stopping_section import StoppingConfig
from hf_pretrain.economics.cost import window_cost_per_loss_point
from hf_pretrain.exit_codes import EXIT_DIVERGED, EXIT_LOCKED, EXIT_PREEMPTED, EXIT_WRITE_FAILED
from hf_pretrain.processes import LAUNCHER_GONE, followed_launcher, launcher_gone
from hf_pretrain.run_folder.run_dir import RunDir
from hf_pretrain.run_folder.stop_request import (
    StopRequest,
    answer_stop_request,
    at_start,
    clear_stop_request,
    read_stop_request,
)
from hf_pretrain.training.start_up import exit_at_once, loop_ended

if TYPE_CHECKING:
    from hf_pretrain.optim.build import Cooldown
    from hf_pretrain.training.metrics import RunLogger
    from hf_pretrain.training.state import TrainState
    from hf_pretrain.training.step import StepResult

CHECKPOINT = "{checkpoint}"  # stands in a stop message for the checkpoint saved on the way out


@dataclass
class Stop:
    """Why and how the run ends. Every stop saves a checkpoint first, unless there is nowhere to save it
    (`saves`: the run folder was deleted); a finished schedule (the last step, or early stopping) also
    gets its side jobs' `on_train_end` (final/)."""

    exit_code: int
    reason: str = ""
    finished: bool = False
    saves: bool = True

    def message(self, checkpoint: Path | str | None) -> str:
        return self.reason.replace(CHECKPOINT, str(checkpoint))


def agree(accelerator: Accelerator, *values: float) -> list[float]:
    """Each value's maximum over the processes (a flag: true on every process when it is true on at
    least one): one all-reduce for all of them."""
    if accelerator.num_processes == 1:
        return [float(v) for v in values]
    together = accelerator.reduce(torch.tensor([float(v) for v in values], device=accelerator.device), "max")
    return together.tolist()


class GracefulStop:
    """Records the first SIGTERM/SIGINT so the loop can stop at the next step boundary with a
    checkpoint; a second signal exits at once. Under a launcher, the launcher's exit (its signal,
    or our parent pid changing) stops the run the same way (processes.py), and is never a signal sent
    twice, in either order: a machine's shutdown sends SIGTERM to every process, so the launcher may end
    before this process's own SIGTERM is handled; both are the one stop, and it ends with a checkpoint."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.signal_name: str | None = None
        self.signals_received = 0  # SIGTERM/SIGINT: the second exits at once, the launcher's exit aside
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> GracefulStop:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        if followed_launcher() is not None:
            self._previous[LAUNCHER_GONE] = signal.signal(LAUNCHER_GONE, self._launcher_exited)
        return self

    def stopping(self) -> bool:
        """Whether a stop was asked for; polls the launcher too, where no signal tells of its exit."""
        if self.signal_name is None and launcher_gone():
            self._launcher_exited(LAUNCHER_GONE, None)
        return self.signal_name is not None

    def _launcher_exited(self, signum: int, frame) -> None:
        # The kernel also sends it when the launcher's thread that started us ends: only a new parent counts.
        # Never a second signal either: a launcher may forward SIGTERM first, then exit.
        if self.signal_name is None and launcher_gone():
            self.signal_name = f"the exit of its launcher (pid {followed_launcher()})"
            self.log(f"\nthe launcher (pid {followed_launcher()}) exited: finishing this step and writing a checkpoint")

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        loop_ended()  # the session's start-up handler is back: a signal now no longer changes the ending

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        self.signals_received += 1
        if self.signals_received > 1:
            exit_at_once(
                name, signum, "without a checkpoint of the steps since the newest one (the rerun resumes there)"
            )
        self.signal_name = self.signal_name or name  # the launcher's exit may have come first: the same stop
        self.log(f"\n{name} received: finishing this step and writing a checkpoint (send it again to exit at once)")


class EarlyStop:
    """When to stop paying: cost per loss point over a window, or validation loss that stopped
    improving. Both rules are off unless the recipe sets them; `reason` says which fired, and why."""

    def __init__(self, stopping: StoppingConfig, reporting: ReportingConfig):
        self.stopping, self.reporting = stopping, reporting
        self.reason: str | None = None
        self.best_val_loss = float("inf")
        self.evals_without_improvement = 0

    def observe_cost(self, history: list[dict[str, Any]]) -> None:
        limit = self.stopping.early_stop_cost_per_loss_point
        if not limit or self.reason:
            return
        cost = window_cost_per_loss_point(history, self.stopping.early_stop_window, self.reporting.price_per_hour)
        if cost is not None and cost > limit:
            self.reason = (
                f"the last {self.stopping.early_stop_window} steps cost ${cost:,.2f} per loss point, "
                f"above early_stop_cost_per_loss_point=${limit:,.2f}"
            )

    def observe_val_loss(self, val_loss: float) -> None:
        patience = self.stopping.early_stop_patience
        if not patience or self.reason:
            return
        if val_loss < self.best_val_loss - self.stopping.early_stop_min_delta:
            self.best_val_loss, self.evals_without_improvement = val_loss, 0
            return
        self.evals_without_improvement += 1
        if self.evals_without_improvement >= patience:
            self.reason = (
                f"validation loss has not improved by {self.stopping.early_stop_min_delta} for {patience} "
                f"evaluations (best {self.best_val_loss:.4f}, now {val_loss:.4f})"
            )


class Guards:
    """The run's health and its stop decision, step by step. Use as a context manager: inside it,
    SIGTERM/SIGINT ask for a graceful stop instead of killing the process."""

    def __init__(
        self,
        stopping: StoppingConfig,
        reporting: ReportingConfig,
        *,
        output_dir: str | Path,
        accelerator: Accelerator,
        log: RunLogger,
    ):
        """Built from the recipe's `stopping` and `reporting` sections, with the run's folder (stop requests
        arrive there), the accelerator (the processes agree) and the logger by keyword."""
        self.output_dir, self.stopping, self.reporting = output_dir, stopping, reporting
        self.accelerator = accelerator
        self.log = log
        self.signals = GracefulStop(log.say)
        self.early_stop = EarlyStop(stopping, reporting)
        self.bad_in_a_row = 0
        self.recent_loss: float | None = None  # running average, for spike detection
        self.last_step_healthy = True
        self.run_shown_as = RunDir(self.output_dir).shown_as()  # read now: the folder may go (a stop's line)

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
            self.log.say(
                f"step {step}: non-finite loss {loss} / grad norm {grad_norm}: step skipped, weights "
                f"untouched ({self.bad_in_a_row} in a row, stop at {self.stopping.max_bad_steps})"
            )
            return False
        self.bad_in_a_row = 0
        if self.recent_loss is not None and loss > self.stopping.loss_spike_factor * self.recent_loss:
            self.log.record({"kind": "spike", "step": step, "loss": loss, "recent_loss": self.recent_loss})
            self.log.say(f"step {step}: loss spike {loss:.3f} against a recent average of {self.recent_loss:.3f}")
        self.recent_loss = loss if self.recent_loss is None else 0.9 * self.recent_loss + 0.1 * loss
        return True

    def observe_val_loss(self, val_loss: float) -> None:
        self.early_stop.observe_val_loss(val_loss)

    def _folder_gone(self, step: int) -> str:
        """The stop's line when the run folder vanished: no checkpoint can be written, so say what is left."""
        folder = Path(self.output_dir)
        if self.run_shown_as != str(folder):  # a run URL's working copy: the store keeps what reached it
            return (
                f"stopped after step {step}: the local copy of {self.run_shown_as} ({folder}) was deleted "
                f"while the run trained, so this step cannot be saved. The store keeps every checkpoint that "
                f"reached it: rerun the same command to go on from the newest there."
            )
        return (
            f"stopped after step {step}: the run folder {folder} was deleted while the run trained, so "
            f"this step cannot be saved, and the checkpoints went with the folder. Rerun the same command to "
            f"train it again from the start."
        )

    def decide(self, state: TrainState, history: list[dict[str, Any]], halt: str | None = None) -> Stop | None:
        """Whether the run stops after `state.step` (or begins its cooldown), the same answer on every process.
        `halt`: the main process's side jobs' reason to stop at once (another machine holds the run's lease)."""
        step, main = state.step, self.accelerator.is_main_process
        if self.last_step_healthy and step % self.reporting.log_interval == 0:
            self.early_stop.observe_cost(history)
        request = self._stop_request(state) if main else None
        # the step's one exchange: a signal may have reached any process; early stopping and stop requests
        # are the main one's call (a request's cooldown travels as steps + 1, 0 for the default)
        signalled, stop_early, requested, cooldown_code, folder_gone, halted = agree(
            self.accelerator,
            self.signals.stopping(),
            self.early_stop.reason is not None and main,
            request is not None,
            request.cooldown_steps + 1 if request and request.cooldown_steps is not None else 0,
            not Path(self.output_dir).is_dir(),  # a stat a step: deleted under the run (a cache cleaned)
            halt is not None,
        )
        if halted:  # no checkpoint: the run is another machine's, and what this one saves no one resumes
            return Stop(
                EXIT_LOCKED,
                f"stopped after step {step}: {halt or 'the first process lost the run to another machine'} "
                f"(exit {EXIT_LOCKED})",
                saves=False,
            )
        if folder_gone:
            return Stop(EXIT_WRITE_FAILED, self._folder_gone(step), saves=False)
        if self.bad_in_a_row >= self.stopping.max_bad_steps:
            return Stop(
                EXIT_DIVERGED,
                f"stopped: {self.bad_in_a_row} non-finite steps in a row. {CHECKPOINT} holds the weights from "
                f"before step {step - self.bad_in_a_row + 1} (skipped steps change nothing) with the data "
                f"position past the bad batches; lower learning_rate or raise warmup_steps, then rerun to "
                f"resume.",
            )
        if signalled:
            return Stop(
                EXIT_PREEMPTED,
                f"stopped by {self.signals.signal_name or 'a signal to another process'} "
                f"after step {step}; checkpoint {CHECKPOINT}. Rerun the same command to resume.",
            )
        if step == self.stopping.stop_at_step:
            return Stop(0, f"stopped at step {step} as asked (stop_at_step); rerun the same command to continue")
        if (requested or stop_early) and state.cooldown is None:
            if requested:
                reason, steps = "stop requested (hf-pretrain stop)", int(cooldown_code) - 1 if cooldown_code else None
            else:
                reason, steps = f"early stop: {self.early_stop.reason or 'decided on the main process'}", None
            stop = self._finish(state, reason, steps)
            if stop is not None:
                return stop
            if requested and main:  # answered: a second request is refused (`hf-pretrain stop` reads this)
                answer_stop_request(self.output_dir, step, f"began its cooldown to step {state.cooldown.end}")
        if step >= state.end:
            if main:
                clear_stop_request(self.output_dir)  # it was answered; a later run must not read it
            cooldown = state.cooldown
            return Stop(
                0,
                f"finished at step {step}: {cooldown.reason}; the learning rate decayed from step {cooldown.start} on"
                if cooldown
                else "",
                finished=True,
            )
        return None

    def _stop_request(self, state: TrainState) -> StopRequest | None:
        """The request to act on at this step (main process): none during a cooldown, where a new one is
        refused in the log and in the file (the decay under way already finishes the run)."""
        request = read_stop_request(self.output_dir)
        if request is None or state.cooldown is None:
            return request  # an answered one, after a resume from before its cooldown, is applied again
        if not request.answered:
            answer = (
                f"refused: the run is already in its cooldown ({state.cooldown.reason}), which ends it at step "
                f"{state.cooldown.end}; SIGTERM stops it sooner, with a checkpoint that resumes the cooldown"
            )
            self.log.say(f"step {state.step}: stop request {answer}")
            answer_stop_request(self.output_dir, state.step, answer)
        return None

    def _finish(self, state: TrainState, reason: str, cooldown_steps: int | None) -> Stop | None:
        """Begin the cooldown that finishes the run (None: go on), or stop now when there is none to run."""
        step, schedule = state.step, state.schedule
        steps = schedule.default_cooldown_steps(step) if cooldown_steps is None else cooldown_steps
        state.cooldown = schedule.cooldown(step, steps, reason)
        if state.cooldown.end > step:
            self.log.record({"kind": "cooldown", "step": step, "end": state.cooldown.end, "reason": reason})
            cut = state.cooldown.end - step < steps  # never past max_steps (optim.Schedule.cooldown)
            self.log.say(
                f"step {step}: {reason}: the learning rate decays from {state.lr(step):.3g} to "
                f"{schedule.floor:.3g} over steps {step + 1}-{state.cooldown.end} ({schedule.optim.decay_shape}"
                + (f"; {steps:,} steps were asked, {state.cooldown.end - step:,} are left to max_steps" if cut else "")
                + "), then the run saves and writes final/"
            )
            return None
        if self.accelerator.is_main_process:
            clear_stop_request(self.output_dir)
        return Stop(0, f"{reason}: stopped at step {step}. {unfinished_decay(state) or ''}".rstrip(), finished=True)


def unfinished_decay(state: TrainState) -> str | None:
    """What the log and the model card say when the run stopped above its schedule's floor."""
    lr, schedule = state.lr(state.step), state.schedule
    if not schedule.left_decay_unfinished(state.step, lr):
        return None
    how = (
        f"its cosine decays until max_steps={schedule.max_steps:,}"
        if schedule.kind == "cosine"
        else "no cooldown was run"
    )
    return (
        f"The model did not finish its decay: the learning rate was {lr:.3g} ({lr / schedule.peak:.0%} of the "
        f"peak) when it stopped ({how}). A wsd schedule stops with a finished model."
    )


def take_up_at_start(
    run_dir: str | Path, max_steps_changed: bool, cooldown: Cooldown | None, say: Callable[[str], None]
) -> None:
    """A request found when a run starts (main process): say it, and set aside one this start does not
    apply (a new max_steps, or a cooldown resumed that already answers it)."""
    request = read_stop_request(run_dir)
    if request is None:
        return
    applies, line = at_start(request, max_steps_changed, cooldown.end if cooldown else None)
    say(f"stop request: {line}")
    if not applies:
        clear_stop_request(run_dir)
