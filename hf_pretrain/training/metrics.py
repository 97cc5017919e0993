"""What a run reports: metrics.jsonl and samples.jsonl records, the trackers, the progress bar,
the phase tables, the throughput (tokens/s, MFU) of each logging window, the forecast of where the
loss is heading (economics/forecast.py), and each pass over the training data."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from tqdm.auto import tqdm

from hf_pretrain.config import SECTIONS, Recipe, ReportingConfig, TrainConfig, tracker_names
from hf_pretrain.economics.cost import cost_record, phases_from_recipe, write_phase_table
from hf_pretrain.economics.forecast import forecast_fields
from hf_pretrain.economics.measurements import record_training_run
from hf_pretrain.economics.performance import slow_node_warning
from hf_pretrain.economics.resolved_run import ResolvedRun
from hf_pretrain.machine.hardware import peak_memory_gib
from hf_pretrain.machine.run_profile import Machine
from hf_pretrain.redaction import redact
from hf_pretrain.run_folder.run_dir import JsonlWriter, RunDir, read_jsonl
from hf_pretrain.training.compiling import CompileWatch
from hf_pretrain.training.state import TrainState
from hf_pretrain.training.step import StepResult


class ThroughputMeter:
    """Tokens/s and MFU over the window since the last `read`, for the whole job (all processes)."""

    def __init__(self, flops_per_token: float, peak_flops_per_process: float | None, num_processes: int):
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops_per_process * num_processes if peak_flops_per_process else None
        self.window_start = time.perf_counter()
        self.window_tokens = 0

    def add(self, tokens: int) -> None:
        self.window_tokens += tokens

    def pause(self) -> float:
        """Time since the last read; used to leave evaluation and checkpoints out of the rate."""
        return time.perf_counter() - self.window_start

    def skip(self, seconds: float) -> None:
        self.window_start += seconds

    def read(self) -> tuple[float, float | None]:
        now = time.perf_counter()
        seconds = max(now - self.window_start, 1e-9)
        tokens_per_s = self.window_tokens / seconds
        mfu = tokens_per_s * self.flops_per_token / self.peak_flops if self.peak_flops else None
        self.window_start, self.window_tokens = now, 0
        return tokens_per_s, mfu


class DivergenceWatch:
    """Whether the training loss has diverged, from the logged records: the mean of the last WINDOW
    above the run's first logged loss (it ended worse than a random model), or RISE x the lowest mean
    of WINDOW records the run reached (it is climbing back). A warning, not a stop: a finished run
    still exits 0 (its weights are what was asked for), and the log, status.json (through the last
    line) and the model card (through the train state) say it."""

    WINDOW = 10  # records: with log_interval 10, the last 100 steps
    RISE = 1.2  # far above the noise of a mean over WINDOW records

    def __init__(self, history: list[dict[str, Any]]):
        self.start: float | None = None
        self.best = float("inf")
        self.recent: list[float] = []
        self.verdict: str | None = None
        for record in history:  # a resumed run picks up where its records stand
            self.observe(record)

    def observe(self, record: dict[str, Any]) -> str | None:
        """Take one train record; the verdict when it has just turned to diverged, else None."""
        loss = record.get("loss")
        if not isinstance(loss, (int, float)) or not math.isfinite(loss):
            return None
        self.start = loss if self.start is None else self.start
        self.recent = (self.recent + [loss])[-self.WINDOW :]
        if len(self.recent) < self.WINDOW:
            return None
        mean = sum(self.recent) / len(self.recent)
        self.best = min(self.best, mean)
        was = self.verdict
        if mean > self.start:
            self.verdict = (
                f"the loss diverged: {mean:.3f} over the last {self.WINDOW} records (to step {record['step']}) is "
                f"above its start, {self.start:.3f}"
            )
        elif mean > self.RISE * self.best:
            self.verdict = (
                f"the loss diverged: {mean:.3f} over the last {self.WINDOW} records (to step {record['step']}) has "
                f"risen {mean / self.best - 1:.0%} above the lowest mean it reached, {self.best:.3f}"
            )
        else:
            self.verdict = None  # recovered: the run's end is what counts
        return self.verdict if self.verdict and not was else None


class BackgroundForecast:
    """The forecast fit (economics/forecast.py), off the training thread.

    A fit takes ~10 ms here (8.5-9.8 ms at 3,000-7,000 records on a 2-core CPU; 55-67 ms in issue 26's
    reading); on the training thread, right after the record's host read, the GPU would wait that long
    each record. Here each record starts a fit of the records
    so far in a worker thread and carries the newest fit that has finished: the previous record's, or
    an older one while a fit still runs (a record never queues a second fit). A fit that raises
    raises in the training thread, at the next record, as it did inline.
    """

    def __init__(self, fit: Callable[..., dict[str, Any]] = forecast_fields):
        self.fit = fit
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forecast")
        self.running: Future | None = None
        self.latest: dict[str, Any] = {}

    def submit(self, records: list[dict[str, Any]], *args: Any) -> dict[str, Any]:
        """Start a fit of `records` unless one is running; the newest finished fit's fields."""
        if self.running is not None and self.running.done():
            self.latest, self.running = self.running.result(), None
        if self.running is None:
            self.running = self.pool.submit(self.fit, records, *args)
        return self.latest

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def trackers_for(report_to: str) -> list[str]:
    """Accelerate's `log_with` for the recipe's `report_to`. Each name is one Accelerate knows (checked with
    the recipe) and is installed (checked by preflight, before any work): Accelerate itself would skip a
    missing tracker with no more than a debug line."""
    return tracker_names(report_to)


def flat_config(recipe: Recipe) -> dict[str, Any]:
    """The recipe as one flat dict of scalars, the shape trackers accept; its text redacted, as the
    resolved recipe is (the trackers write it into files of the run, or send it away)."""
    flat = {}
    for section in SECTIONS:
        for key, value in recipe.to_dict()[section].items():
            flat[key] = value if isinstance(value, (int, float, bool)) else redact(str(value))
    return flat


class RunEconomics:
    """What the run's records are priced and judged by: the money spent so far, the performance model's rate
    for this GPU (the slow-node check) and the measurement `plan` and the doctor read later. All of them of
    the run's own step on its own card: the door's answer (training/loop.py's setup), never a card assumed."""

    def __init__(self, resolved: ResolvedRun, train: TrainConfig, reporting: ReportingConfig):
        self.resolved, self.train, self.reporting = resolved, train, reporting

    @property
    def machine(self) -> Machine:
        """The card the run is on (its bf16 peak: MFU; its name: the slow-node check and a measurement's key)."""
        return self.resolved.profile.machine

    def cost(self, record: dict[str, Any]) -> dict[str, float]:
        return cost_record(record, price_per_hour=self.reporting.price_per_hour, max_steps=self.train.max_steps)

    def slow_node(self, tokens_per_s_per_gpu: float, device_name: str) -> str | None:
        return slow_node_warning(tokens_per_s_per_gpu, device_name, self.resolved.workload)

    def record_session(self, records: list[dict[str, Any]], peak_gib: float | None) -> None:
        """This session's records as the measurement of the run's configuration on its card (none on a CPU)."""
        record_training_run(self.resolved.key, self.machine.gpu_name, records, peak_gib)


class RunLogger:
    """The run's records and its logging window, built from the `reporting:` section with what the run
    knows at start-up by keyword. Every process calls it alike (the window's mean loss is averaged over
    all of them); only the main process writes files and prints."""

    def __init__(
        self,
        reporting: ReportingConfig,
        *,
        accelerator: Accelerator,
        run: RunDir,
        state: TrainState,
        flops_per_token: float,
        global_batch_tokens: int,
        compiled: bool,
        phases: dict[str, int],
        tracker_config: dict[str, Any],
        economics: RunEconomics,
        epochs_after: Callable[[int], int] | None = None,
        source_tokens: Callable[[int], dict[str, int]] | None = None,
    ):
        self.accelerator, self.reporting, self.run, self.economics = accelerator, reporting, run, economics
        self.global_batch_tokens = global_batch_tokens
        self.main = accelerator.is_main_process
        self.metrics = JsonlWriter(run.metrics, self.main)
        self.samples = JsonlWriter(run.samples, self.main)
        accelerator.init_trackers("hf-pretrain", config=tracker_config)
        machine = economics.machine  # the door's: its bf16 peak (MFU), its name (the slow-node check)
        self.meter = ThroughputMeter(flops_per_token, machine.peak_flops, accelerator.num_processes)
        self.machine = machine
        self.compile_watch = CompileWatch() if compiled else None  # what compiling cost, how often
        self.history = [r for r in read_jsonl(run.metrics) if r["kind"] == "train"]  # for cost per phase
        self.session_start = len(self.history)  # the records before are earlier sessions' (maybe another GPU)
        self.phases = phases_from_recipe(phases)
        # this process's step losses since the last record; a checkpoint keeps them (state_dict), so the
        # first record after a resume averages the same steps as the uninterrupted run's
        self.window_losses: list[float] = []
        self.data_wait = 0.0  # seconds spent waiting for batches since the last record
        self.epochs_after = epochs_after  # passes over the training data completed after a step
        self.epochs_done = epochs_after(state.step) if epochs_after else 0
        self.source_tokens = source_tokens  # tokens drawn from each source of the mixture after a step
        self.forecast: dict[str, Any] = {}  # the newest forecast fields (economics/forecast.py)
        self.forecaster = BackgroundForecast() if self.main else None
        self.divergence = DivergenceWatch(self.history)
        self.windows, self.slow_node = 0, None  # the node check after the warm-up window
        self.progress = tqdm(
            total=state.end, initial=state.step, disable=not self.main, desc="train", dynamic_ncols=True
        )

    def state_dict(self) -> dict[str, Any]:
        """The logging window, for the checkpoint: each step's loss averaged over the processes (every
        process calls this; the average is what the record would have used, whatever the world size)."""
        windows = gather_object([self.window_losses]) if self.accelerator.num_processes > 1 else [self.window_losses]
        return {
            "log_window": [sum(losses) / len(losses) for losses in zip(*windows, strict=False)],
            "divergence": self.divergence.verdict,  # the model card says it
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.window_losses = list(saved.get("log_window", []))

    def say(self, text: str, every_process: bool = False) -> None:
        """Print once per machine (as `accelerator.print`); with `every_process`, every other process
        prints it too, marked with its index, so each process's log says why it ended."""
        if self.accelerator.is_local_main_process:
            print(text)
        elif every_process:
            print(f"[process {self.accelerator.process_index}] {text}", flush=True)

    def record(self, record: dict[str, Any]) -> None:
        self.metrics.write(record)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Leave the time spent inside (evaluation, checkpoints) out of tokens/s."""
        started = self.meter.pause()
        try:
            yield
        finally:
            paused = self.meter.pause() - started
            self.meter.skip(paused)
            if self.compile_watch:
                self.compile_watch.skip(paused)

    def step(self, state: TrainState, result: StepResult) -> None:
        """After each step: the progress bar, the window, a train record every `log_interval` steps
        and at the last one, a phase table when a phase ends. A skipped step has no loss to add."""
        if self._folder_gone():
            return
        self.meter.add(self.global_batch_tokens)
        self.progress.total = state.end  # a cooldown moves the end
        self.data_wait += result.data_wait
        if self.compile_watch and (line := self.compile_watch.step(result.data_wait)):
            self.say(line)
        self._epoch(state)
        if result.finite:
            self.window_losses.append(result.loss)
            if state.step % self.reporting.log_interval == 0 or state.step == state.end:
                self._train_record(state, result)
        # after the record: one refresh shows this step's count with this step's loss (a bar moved first
        # showed step N with step N-1's figures, a line of its own in a log)
        self.progress.update(1)
        if not result.finite:
            return
        # a phase that ends before the first record has no loss yet: its row comes with the next table
        if self.main and self.history and any(phase.end_step == state.step for phase in self.phases):
            ended = [p for p in self.phases if p.end_step <= state.step]
            self.say(write_phase_table(self.run.path, self.history, ended, self.reporting.price_per_hour))

    def _train_record(self, state: TrainState, result: StepResult) -> None:
        device = self.accelerator.device
        mean_loss = self.accelerator.reduce(
            torch.tensor(sum(self.window_losses) / len(self.window_losses), device=device), "mean"
        ).item()
        self.window_losses.clear()
        window_seconds = self.meter.pause()
        tokens_per_s, mfu = self.meter.read()
        record = {
            "kind": "train",
            "step": state.step,
            "tokens": state.tokens_seen,
            "loss": mean_loss,
            "lr": result.lr,
            "grad_norm": result.grad_norm,
            "tokens_per_s": tokens_per_s,
            "elapsed": state.elapsed(),
            "data_wait_share": min(1.0, self.data_wait / max(window_seconds, 1e-9)),
        }
        self.data_wait = 0.0
        if self.source_tokens is not None:
            record["source_tokens"] = self.source_tokens(state.step)
        if mfu is not None:
            record["mfu"] = mfu
            record["peak_memory_gib"] = peak_memory_gib(device)
        if self.reporting.price_per_hour:
            record.update(self.economics.cost(record))
        if self.forecaster:  # a fit of the curve so far, in a worker thread: only the main process writes it
            # the history's records are final; the new one is copied, as this thread adds to it below
            self.forecast = self.forecaster.submit(
                self.history + [dict(record)],
                state.schedule.stable_steps(state.cooldown),
                state.end,
                self.phases,
                self.reporting.price_per_hour,
            )
            record.update(self.forecast)
        if self.compile_watch:
            record.update(self.compile_watch.record())
        self.metrics.write(record)
        self.history.append(record)
        self.windows += 1
        if self.windows == 2 and self.main and device.type == "cuda":  # the first window holds the warm-up
            per_gpu = tokens_per_s / self.accelerator.num_processes
            self.slow_node = self.economics.slow_node(per_gpu, self.machine.name or device.type)
            if self.slow_node:
                self.metrics.write({"kind": "slow_node", "step": state.step, "reason": self.slow_node})
                self.say(f"step {state.step}: warning: {self.slow_node}")
        if diverged := self.divergence.observe(record):
            self.metrics.write({"kind": "divergence", "step": state.step, "reason": diverged})
            self.say(
                f"step {state.step}: warning: {diverged}; lower learning_rate or raise warmup_steps (the run goes "
                f"on: a diverged run that finishes still exits 0, and its status.json and model card say this)"
            )
        scalars = {f"train/{k}": v for k, v in record.items() if k not in ("kind", "step", "source_tokens")}
        scalars.update({f"train/tokens_{name}": n for name, n in record.get("source_tokens", {}).items()})
        self.accelerator.log(scalars, step=state.step)
        self.progress.set_postfix(
            refresh=False,  # the step's `update` draws it
            loss=f"{mean_loss:.3f}",
            lr=f"{result.lr:.2e}",
            tok_s=f"{tokens_per_s:,.0f}",
            **({"mfu": f"{mfu:.1%}"} if mfu is not None else {}),
        )

    def _folder_gone(self) -> bool:
        """The run folder was deleted under the run (a cache cleaned): nothing can be written into it, and
        the guards stop the run after this step. (Only the main process writes, so a machine whose copy
        alone went skips the window's exchange; the watchdog ends what waits on it.)"""
        return not self.run.path.is_dir()

    def evaluation(self, state: TrainState, val_loss: float, samples: list[tuple[str, str]]) -> None:
        if self._folder_gone():
            return
        self.metrics.write(
            {
                "kind": "eval",
                "step": state.step,
                "tokens": state.tokens_seen,
                "val_loss": val_loss,
                **(self.compile_watch.record() if self.compile_watch else {}),
            }
        )
        self.accelerator.log({"val/loss": val_loss}, step=state.step)
        for prompt, text in samples:
            self.samples.write({"step": state.step, "tokens": state.tokens_seen, "prompt": prompt, "completion": text})
        self.say(f"step {state.step}: val_loss {val_loss:.4f}" + self._forecast_text(state))

    def _forecast_text(self, state: TrainState) -> str:
        f = self.forecast
        if "forecast_loss" not in f:
            return ""
        text = f" | forecast: train loss {f['forecast_loss']:.3f} +/- {2 * f['forecast_loss_sd']:.3f} at step {state.end:,}"
        if state.decay_start is not None and state.step <= state.decay_start:
            text += " before the final decay"
        if "usd_left" in f:
            text += f", ${f['usd_left']:,.2f} left"
        if "next_phase_usd_per_loss_point" in f:
            text += f"; next phase ({f['next_phase']}): ${f['next_phase_usd_per_loss_point']:,.2f} per loss point"
        return text

    def _epoch(self, state: TrainState) -> None:
        """A record and a line each time the run finishes a pass over its training data."""
        if self.epochs_after is None:
            return
        done = self.epochs_after(state.step)
        if done > self.epochs_done:
            self.epochs_done = done
            self.metrics.write({"kind": "epoch", "step": state.step, "tokens": state.tokens_seen, "epochs": done})
            self.say(
                f"step {state.step}: finished pass {done} over the training data; the next pass reads it "
                f"again, in a new order"
            )

    def close(self) -> None:
        self.progress.close()
        if self.main:  # on a GPU, this session's tokens/s and peak memory for `plan` and the doctor (a CPU: nothing)
            peak = peak_memory_gib(self.accelerator.device)
            self.economics.record_session(self.history[self.session_start :], peak)
        if self.forecaster:
            self.forecaster.close()
