"""The watchdog: a process that stops answering ends the run, with every process's stacks, instead of
holding the job (and its bill) forever.

A stuck NCCL collective, a dead network card or a GPU that fell off the bus all look the same from
the other processes: they wait at the next collective. Each process runs a thread that expects
progress (an optimizer step, a checkpoint save or an evaluation completing: `beat`, `paused`) at
least every `hang_timeout_s`. When none comes, the thread

1. writes its threads' stacks (`faulthandler`) and a report (its step, what it was doing) into
   `hangs/<session start>/` in the run folder;
2. waits up to REPORT_WAIT_S for the other processes' reports: they all wait on the same thing, so
   they fire together, and a process without a report is one that stopped answering (stopped,
   frozen, or on a machine that failed);
3. if it is the lowest-numbered process that reported, records status.json `hung` (session.py) with the step,
   the processes that did not answer and what to do;
4. exits with EXIT_HUNG (69); the launcher then ends the rest (torchrun gives them 30 s).

The process group's collective timeout is set from the same key, COLLECTIVE_MARGIN_S later, so that
the watchdog always speaks first and the timeout only ends what it could not. A process frozen with
its interpreter lock held cannot run the thread: faulthandler's own timer, which needs no lock,
dumps its stacks to stderr and ends it BACKSTOP_S past the deadline (exit 1).

A stop signal (SIGTERM, the launcher's exit) cannot reach a process blocked in a collective: its
handler runs only when the wait returns, and a launcher kills its processes a fixed time after it
asked (torchrun's TORCH_ELASTIC_SHUTDOWN_TIMEOUT and Slurm's KillWait, both 30 s by default). So
with more than one process the watchdog hears the signal itself (`signal.set_wakeup_fd`) and gives
the run until REPORT_WAIT_S + 5 s before that kill to save and exit; past it, it reports as above,
and status.json says the run was stopped by the signal while a process did not answer.
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from accelerate import Accelerator
from accelerate.utils import gather_object

from hf_pretrain.exit_codes import EXIT_HUNG, EXIT_PREEMPTED
from hf_pretrain.processes import LAUNCHER_GONE, launcher_gone
from hf_pretrain.run_folder.json_files import write_json_atomically
from hf_pretrain.run_folder.run_dir import RunDir
from hf_pretrain.training.session import record_ending

REPORT_WAIT_S = 5.0  # how long a process that saw the hang waits for the others' reports
COLLECTIVE_MARGIN_S = 60.0  # the collective timeout is hang_timeout_s + this: the watchdog reports first
BACKSTOP_S = 60.0  # faulthandler ends a process whose watchdog thread could not run, this long past its deadline
LAUNCHER_PATIENCE_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"  # torchrun's seconds between SIGTERM and SIGKILL
LAUNCHER_PATIENCE_S = 30.0  # its default, and Slurm's KillWait
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, LAUNCHER_GONE)


def process_group_kwargs(hang_timeout_s: float) -> dict[str, timedelta]:
    """The process group's settings (`PartialState(**)`, `InitProcessGroupKwargs(**)`): collectives give
    up COLLECTIVE_MARGIN_S after the watchdog would have reported; none when it is off (the defaults)."""
    return {"timeout": timedelta(seconds=hang_timeout_s + COLLECTIVE_MARGIN_S)} if hang_timeout_s else {}


def stop_grace_s() -> float:
    """Seconds a multi-process run has, after a stop signal, to save and exit before the watchdog reports:
    enough left before the launcher's kill to write the reports and status.json."""
    try:
        patience = float(os.environ.get(LAUNCHER_PATIENCE_ENV, LAUNCHER_PATIENCE_S))
    except ValueError:
        patience = LAUNCHER_PATIENCE_S
    return max(1.0, patience - REPORT_WAIT_S - 5.0)


class Watchdog:
    """`with Watchdog(hang_timeout_s, accelerator, run_dir) as watchdog:` around the steps; `beat(step)`
    after each optimizer step, `with watchdog.paused("a checkpoint save"):` around a save or an
    evaluation (each gets `hang_timeout_s` of its own); `stop()` when the steps are over. Every process
    enters it together (it gathers who is who: host and pid of each process)."""

    def __init__(self, hang_timeout_s: float, accelerator: Accelerator, run_dir: RunDir):
        self.timeout = float(hang_timeout_s)
        self.run_dir = run_dir
        self.rank, self.world = accelerator.process_index, accelerator.num_processes
        self.fired = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._step = 0  # the last optimizer step completed
        self._progress = (0.0, "the first step")  # (deadline, what this process is doing): one tuple, one write
        self._signal: tuple[str, float] | None = None  # (name, when) of the first stop signal heard
        self._wakeup: tuple[int, int] | None = None  # the pipe the signal handlers write to
        self._previous_wakeup = -1
        self._backstop = False

    # ------------------------------------------------------------------ the training thread's side
    def __enter__(self) -> Watchdog:
        if not self.timeout:
            return self
        me = {"process": self.rank, "host": socket.gethostname(), "pid": os.getpid()}
        me["session"] = time.strftime("%Y%m%d-%H%M%S")
        self.roster = gather_object([me]) if self.world > 1 else [me]
        self.folder = self.run_dir.hangs / self.roster[0]["session"]  # the first process's clock names it
        self._listen_for_signals()
        self._backstop = _arm_backstop(self.timeout + BACKSTOP_S)
        self._progress = (time.monotonic() + self.timeout, "step 1")
        self._thread = threading.Thread(target=self._watch, name="hf-pretrain-watchdog", daemon=True)
        self._thread.start()
        return self

    def beat(self, step: int) -> None:
        """Optimizer step `step` completed."""
        self._step = step
        self._expect_progress(f"step {step + 1}")

    @contextmanager
    def paused(self, what: str) -> Iterator[None]:
        """A save or an evaluation: it has `hang_timeout_s` of its own, and so has the step after it."""
        self._expect_progress(f"{what} after step {self._step}")
        try:
            yield
        finally:
            self._expect_progress(f"step {self._step + 1}")

    def stop(self) -> None:
        """The steps are over: the watchdog stands down (the final/ and side-job waits are not steps)."""
        if self.fired.is_set():
            self._let_the_report_end_the_process()
        if self._thread is None:
            return
        self._stopped.set()
        if self._wakeup is not None:
            os.write(self._wakeup[1], b"\0")  # not a signal: wakes the thread from its wait at once
        self._thread.join()
        self._thread = None
        if self._backstop:
            faulthandler.cancel_dump_traceback_later()
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None

    def __exit__(self, *exc) -> None:
        # After the watchdog fired, an error in the training thread is its consequence (a peer that
        # exited closes the connection): the report must not be overwritten by a `crashed` ending.
        self.stop()

    def _expect_progress(self, doing: str) -> None:
        if self._thread is None:
            return
        self._progress = (time.monotonic() + self.timeout, doing)
        if self._backstop:
            _arm_backstop(self.timeout + BACKSTOP_S)

    def _listen_for_signals(self) -> None:
        """Have the signal handlers' C half write each signal's number to a pipe the thread reads: it
        hears a signal even while the training thread is blocked in a collective."""
        if self.world == 1:
            return  # nothing to wait on but itself: the signal's own path (guards.py) decides
        read, write = os.pipe()
        os.set_blocking(write, False)
        try:
            self._previous_wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:  # not the main thread: no signal is heard early, the timeout still holds
            os.close(read)
            os.close(write)
            return
        self._wakeup = (read, write)

    @staticmethod
    def _let_the_report_end_the_process() -> None:
        threading.Event().wait()  # the watchdog thread ends the process with os._exit

    # ------------------------------------------------------------------ the watchdog thread's side
    def _watch(self) -> None:
        poll = min(1.0, self.timeout / 8)
        while not self._stopped.is_set():
            if self._wakeup is not None:
                ready, _, _ = select.select([self._wakeup[0]], [], [], poll)
                if ready:
                    self._heard(os.read(self._wakeup[0], 64))
            else:
                self._stopped.wait(poll)
            deadline, _ = self._progress
            if self._signal is not None:
                deadline = min(deadline, self._signal[1] + stop_grace_s())
            if time.monotonic() >= deadline and not self._stopped.is_set():
                self.fired.set()
                code = EXIT_HUNG
                try:
                    code = self._report()
                except BaseException as exc:  # a full disk, say: the process must still end, and say so
                    _say(f"[process {self.rank}] the watchdog could not report: {type(exc).__name__}: {exc}")
                finally:
                    os._exit(code)

    def _heard(self, signals: bytes) -> None:
        for number in signals:
            if self._signal is None and number in STOP_SIGNALS:
                if number == LAUNCHER_GONE and not launcher_gone():
                    continue  # the launcher's thread that started us ended, not the launcher (processes.py)
                self._signal = (signal.Signals(number).name, time.monotonic())

    def _report(self) -> int:
        """Stacks and report of this process, the others' reports, status.json; the exit code."""
        deadline, doing = self._progress
        silent = time.monotonic() - (deadline - self.timeout)
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / f"process_{self.rank}_stacks.txt").open("w") as f:
            f.write(f"process {self.rank} (pid {os.getpid()} on {socket.gethostname()}), in {doing}:\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        report = {
            "process": self.rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "step": self._step,
            "doing": doing,
            "silent_s": round(silent, 1),
            "signal": self._signal[0] if self._signal else None,
        }
        write_json_atomically(self.folder / f"process_{self.rank}.json", report)  # never half a report
        _say(f"\n[process {self.rank}] no progress for {silent:.0f}s in {doing}: stacks in {self._stacks_at()}")
        reports = self._gather_reports()
        silent_ones = [p for p in self.roster if p["process"] not in reports]
        code, reason = self._ending(reports, silent_ones)
        if min(reports) == self.rank:  # the first process that answered speaks for the run
            record_ending(
                self.run_dir.path,
                code,
                reason,
                hung_step=max(r["step"] for r in reports.values()),
                not_answering=[p["process"] for p in silent_ones],
                stacks=str(self.folder),
            )
            _say(reason)
        return code

    def _gather_reports(self) -> dict[int, dict[str, Any]]:
        until = time.monotonic() + REPORT_WAIT_S
        while True:
            reports = {}
            for path in self.folder.glob("process_*.json"):
                try:
                    report = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue  # being written
                reports[report["process"]] = report
            if len(reports) >= self.world or time.monotonic() >= until:
                return reports
            time.sleep(0.2)

    def _stacks_at(self) -> str:
        """The stacks' folder, and for a URL run that it is this machine's working copy in the cache: hangs/ is
        not uploaded (the process ends at once), so the URL alone would name a place without them."""
        shown = self.run_dir.shown_as()
        if shown == str(self.run_dir.path):
            return str(self.folder)
        return f"{self.folder} (on this machine only: the cache's working copy of {shown})"

    def _ending(self, reports: dict[int, dict[str, Any]], silent_ones: list[dict[str, Any]]) -> tuple[int, str]:
        """The exit code and status.json's reason: the step, who did not answer, where the others waited."""
        step = max(r["step"] for r in reports.values())
        waits = ", ".join(f"process {p} in {r['doing']}" for p, r in sorted(reports.items()))
        silent = ", ".join(f"process {p['process']} (pid {p['pid']} on {p['host']})" for p in silent_ones)
        silent += " did not answer (stopped, frozen, or on a machine that failed)"
        stacks = f"Stacks: {self._stacks_at()}"
        if self._signal is None:
            if silent_ones:
                return (
                    EXIT_HUNG,
                    f"hung after step {step}: {silent} while {waits} waited {self.timeout:g}s (hang_timeout_s). {stacks}",
                )
            return EXIT_HUNG, (
                f"hung after step {step}: no progress for {self.timeout:g}s (hang_timeout_s) although every process "
                f"answered ({waits}): their stacks show where each waited. {stacks}"
            )
        name, grace = self._signal[0], stop_grace_s()
        if silent_ones:
            return EXIT_HUNG, (
                f"hung: stopped by {name} after step {step}, but {silent} while {waits} waited, so no checkpoint "
                f"was written on the way out; the newest one is where a rerun resumes. {stacks}"
            )
        return EXIT_PREEMPTED, (  # slow, not hung: the launcher would have killed it a few seconds later
            f"stopped by {name} after step {step}, but the checkpoint on the way out was not written within "
            f"{grace:.0f}s of it, before the launcher's kill ({waits}; every process answered: slow, not hung). "
            f"Rerun the same command to resume from the newest checkpoint. {stacks}"
        )


def _arm_backstop(seconds: float) -> bool:
    """faulthandler's timer: stacks to stderr and exit, should the watchdog thread never get to run."""
    try:
        faulthandler.dump_traceback_later(seconds, exit=True, file=sys.__stderr__)
        return True
    except (ValueError, AttributeError, OSError, RuntimeError):  # no usable stderr (embedded, captured)
        return False


def _say(text: str) -> None:
    os.write(2, (text + "\n").encode())  # no lock to wait for: the training thread may hold print's
