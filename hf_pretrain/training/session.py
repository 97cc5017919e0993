"""One session of a run: this process's hold on the run folder, from its lock to its `status.json`.

- One session at a time writes a run folder (run_lock.py): a second one is refused, naming the
  holder's host, pid and start, and touches nothing in the folder.
- `status.json` says how the session ended where the exit code cannot: `accelerate launch` turns
  every failure into exit code 1. It reads `running` while the session runs (a `running` status
  whose pid is gone is a session that was killed: SIGKILL, the OOM killer), then the exit code, the
  reason, whether rerunning the same command goes on (`rerun`), and what to do next.
- Under a launcher, the session follows it: the launcher's exit stops the run with a checkpoint.

Only the job's first process (RANK 0) locks and writes, with one exception: the ending of a hung
run, which the watchdog of any process may record (`record_ending`, training/watchdog.py), since the
first process may be the one that hung. Every process follows its launcher.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from hf_pretrain.checkpoints.manifest import CheckpointError
from hf_pretrain.checkpoints.resume_plan import ResumeRefused
from hf_pretrain.checkpoints.store import newest_sound_checkpoint, remove_unfinished_writes
from hf_pretrain.exit_codes import (
    EXIT_CRASHED,
    EXIT_DIVERGED,
    EXIT_HUNG,
    EXIT_INTERRUPTED,
    EXIT_LOCKED,
    EXIT_PREEMPTED,
    EXIT_PREFLIGHT,
    EXIT_SAVE_FAILED,
)
from hf_pretrain.model.initialisation import InitFromError
from hf_pretrain.preflight.result import PreflightError
from hf_pretrain.processes import follow_launcher, launcher
from hf_pretrain.run_folder.run_dir import RunDir, last_train_record, read_status, update_status
from hf_pretrain.run_folder.run_lock import RunDirUnusable, RunLock, RunLocked, command_line, now
from hf_pretrain.run_folder.sessions import Ledger, RelaunchStorm, sessions, set_current, storm_refusal
from hf_pretrain.store.store_calls import StoreError
from hf_pretrain.training.start_up import StartUpSignals, StoppedDuringStartUp, record_exits_with


@dataclass(frozen=True)
class Ending:
    """What an exit code means to whoever restarts the job: a name, whether the same command goes on."""

    state: str
    rerun: bool
    next: str


ENDINGS = {
    EXIT_PREEMPTED: Ending("preempted", True, "rerun the same command: it resumes from the checkpoint"),
    EXIT_SAVE_FAILED: Ending(
        "save_failed",
        False,
        "free space where the checkpoints go, then rerun the same command: it resumes from the previous checkpoint",
    ),
    EXIT_DIVERGED: Ending(
        "diverged",
        False,
        "lower learning_rate or raise warmup_steps, then rerun the same command: it resumes from the checkpoint",
    ),
    EXIT_PREFLIGHT: Ending(
        "refused",
        False,
        "fix what the reason names (`hf-pretrain doctor` runs the same checks), then rerun; nothing was started",
    ),
    EXIT_INTERRUPTED: Ending("interrupted", False, "rerun the same command when you want to go on"),
    # a URL run whose lease another machine took over mid-run (store/run/lease.py): the run goes on there
    EXIT_LOCKED: Ending(
        "lost",
        False,
        "nothing here: another machine trains the run now (`hf-pretrain status URL` says where it stands)",
    ),
    EXIT_HUNG: Ending(
        "hung",
        True,
        "read the stacks in the run folder's hangs/ (where each process waited); a process that did not answer "
        "may sit on a failed GPU or network card: check its machine (nvidia-smi, dmesg), then rerun the same "
        "command: it resumes from the newest checkpoint",
    ),
}
FINISHED = Ending("finished", False, "nothing: the run is complete (`hf-pretrain report`, `hf-pretrain export`)")
STOPPED = Ending("stopped", True, "rerun the same command to continue")
CRASHED = Ending(
    "crashed",
    False,
    "read the error in the log and fix its cause; then the same command resumes from the newest checkpoint",
)
RUNNING = Ending(
    "running",
    False,
    "wait; if its pid is gone, it was killed (SIGKILL, out of memory): rerun the same command to resume",
)

KEPT_SECTIONS = ("store",)  # status.json sections others keep up to date (store/run/run_sync.py)

# Failures that stop a session before it trained, said in a line (the reason is the whole story) and
# ended with an exit code of their own; anything else is a crash, with its traceback.
# StoreError: data_dir's store is unreachable, refuses, or holds a shard whose bytes fail their checksum
REFUSALS = (PreflightError, ResumeRefused, CheckpointError, InitFromError, RunDirUnusable, StoreError)


def exit_code_of(error: BaseException) -> int:
    if isinstance(error, StoppedDuringStartUp):
        return EXIT_PREEMPTED
    if isinstance(error, RunLocked):
        return EXIT_LOCKED
    if isinstance(error, REFUSALS):
        return EXIT_PREFLIGHT
    if isinstance(error, SystemExit):
        return error.code if isinstance(error.code, int) else EXIT_CRASHED
    if isinstance(error, KeyboardInterrupt):  # Ctrl-C before the loop began (inside it, it stops the run)
        return EXIT_INTERRUPTED
    return EXIT_CRASHED


def describe(error: BaseException) -> str:
    """A refusal or a crash in a line: what failed, without the traceback."""
    if isinstance(error, PreflightError):
        return f"preflight failed, nothing was started:\n{error}"
    if isinstance(error, (ResumeRefused, CheckpointError)):
        return f"cannot go on from the run folder's checkpoint, nothing was started: {error}"
    if isinstance(error, InitFromError):
        return f"cannot start from the base model, nothing was started: {error}"
    if isinstance(error, (RunLocked, StoppedDuringStartUp)):
        return str(error)
    if isinstance(error, RunDirUnusable):
        return f"refused, nothing was started: {error}"
    if isinstance(error, StoreError):  # raised in a loader worker, its message carries the worker's traceback
        line = str(error).strip().splitlines()[-1]
        return line.split(f"{type(error).__name__}: ", 1)[-1]
    return f"crashed: {type(error).__name__}: {error}"


def killed_session(run: RunDir) -> str | None:
    """What happened to the last session, when it was killed (its status.json still says `running` while
    nobody holds the lock): its pid, the last step it logged and its newest checkpoint. Call with the lock held."""
    status = read_status(run.path)
    if status.get("state") != "running":
        return None
    step = _last_logged_step(run.metrics)
    newest = newest_sound_checkpoint(run.path)
    # the last step it logged, not where it was killed: it may have trained and saved past it (step 20 logged,
    # step 25 saved read as "killed at step 20 ... newest checkpoint step 25")
    at = f"after logging step {step:,}" if step is not None else "before it logged a step"
    saved = f"its newest checkpoint is step {newest.step:,}" if newest else "it saved no checkpoint"
    return (
        f"the last run was killed {at} (pid {status.get('pid')} on {status.get('host')} gone, started "
        f"{status.get('started')}; SIGKILL or out of memory): {saved}, and the steps after it are trained again"
    )


def _last_logged_step(metrics: Path) -> int | None:
    record = last_train_record(metrics)
    return int(record["step"]) if record else None


class Session:
    """`with Session(output_dir) as session: ...; session.ended(code, message, finished)`: the lock is held
    inside the block; an exception leaving it is recorded in status.json, then raised on. The session is
    also a line of the run's ledger (run_folder/sessions.py), priced at `price_per_hour`; a start after
    `max_fruitless_sessions` sessions in a row that saved no new checkpoint is refused (0: never)."""

    def __init__(self, output_dir: str | Path, *, price_per_hour: float = 0.0, max_fruitless_sessions: int = 0):
        self.dir = RunDir(output_dir)
        self.ledger = Ledger(self.dir.path, price_per_hour)
        self.max_fruitless = max_fruitless_sessions
        self.first = os.environ.get("RANK", "0") == "0"  # the job's first process; alone when unlaunched
        self.lock = RunLock(self.dir)
        self.started = now()
        self._holding = False
        self._ended_with: int | None = None  # the exit code `ended` recorded
        self.signals = StartUpSignals()  # SIGTERM before the loop: `preempted`, not a `running` left behind

    def __enter__(self) -> Session:
        follow_launcher()
        self.signals.__enter__()
        try:
            if self.first:
                self.lock.acquire()
                self._holding = True
                killed = killed_session(self.dir)  # the lock was free: a `running` status is a session that was killed
                if killed:
                    print(f"note: {killed}", flush=True)
                if self.lock.held:  # nobody else writes here now: a `.tmp` left is a killed save's
                    self._clean_unfinished_saves()
                self._begin_in_the_ledger()
                self._write(None, RUNNING, "training" + (f"; {killed}" if killed else ""))
                record_exits_with(self._exited_at_once)
        except BaseException as exc:  # refused or stopped here: recorded if the lock was held, signals as they were
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def _begin_in_the_ledger(self) -> None:
        """The sessions killed before this one closed in the ledger, a relaunch storm refused (RelaunchStorm),
        then this session's start recorded."""
        newest = newest_sound_checkpoint(self.dir.path)
        step = newest.step if newest else None
        self.dir.path.mkdir(parents=True, exist_ok=True)
        self.ledger.close_the_killed(step)
        refusal = storm_refusal(sessions(self.dir.path), step, self.max_fruitless, self.dir.shown_as())
        if refusal:
            raise RelaunchStorm(refusal)
        self.ledger.begin(step)
        set_current(self.ledger)

    def _end_in_the_ledger(self, exit_code: int, ending: Ending) -> None:
        newest = newest_sound_checkpoint(self.dir.path)
        self.ledger.ended(exit_code, ending.state, newest.step if newest else None)
        set_current(None)

    def _clean_unfinished_saves(self) -> None:
        removed, left = remove_unfinished_writes(self.dir.path)
        if removed:
            names = ", ".join(p.name for p in removed)
            print(f"note: removed {names}: the unfinished save of a session that was killed while saving", flush=True)
        for folder in left:
            print(f"note: {folder} holds files no save writes: left as it is; delete it if it is not yours", flush=True)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None:
            code = exit_code_of(exc)
            self._write(code, ENDINGS.get(code, CRASHED), describe(exc))
            if self._holding:
                self._end_in_the_ledger(code, ENDINGS.get(code, CRASHED))
            self._ended_with = code
        if self._holding:
            record_exits_with(None)
            self.lock.release()
            self._holding = False
        self.signals.__exit__(exc_type, exc, tb)

    def ended(self, exit_code: int, message: str, finished: bool, **details) -> None:
        """Record how the session ended; `details` (those not None) are fields of their own beside it."""
        ending = (FINISHED if finished else STOPPED) if exit_code == 0 else ENDINGS.get(exit_code, CRASHED)
        self._write(exit_code, ending, message, {k: v for k, v in details.items() if v is not None})
        if self._holding:
            self._end_in_the_ledger(exit_code, ending)
        self._ended_with = exit_code

    def _exited_at_once(self, exit_code: int, reason: str) -> int:
        """A signal sent twice ends the process now (start_up.exit_at_once): recorded, unless the session
        has recorded its ending already (then that stays true, and its code is the exit code)."""
        if self._ended_with is not None:
            return self._ended_with
        self._write(exit_code, ENDINGS[exit_code], reason)
        self._end_in_the_ledger(exit_code, ENDINGS[exit_code])
        return exit_code

    def _write(self, exit_code: int | None, ending: Ending, reason: str, details: dict | None = None) -> None:
        if not self._holding:
            return
        fields = {
            **_ending_fields(self.dir, exit_code, ending, reason),
            **(details or {}),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "launcher": launcher(),
            "started": self.started,
            "updated": now(),
            "command": command_line(),
        }
        # a folder deleted under the run (guards.py stopped it) gets its status.json back: the next start, and
        # a URL run's store (which mirrors it), read how the session ended, not "killed"
        self.dir.path.mkdir(parents=True, exist_ok=True)
        # the sections another side of the run writes (a URL run's uploads) kept, under the one lock
        update_status(self.dir.path, lambda old: {**{k: v for k, v in old.items() if k in KEPT_SECTIONS}, **fields})


def record_ending(output_dir: str | Path, exit_code: int, reason: str, **details) -> None:
    """status.json of a session ended by one of its processes that may not be the first, the one that
    holds the lock (the watchdog: the first process may be the one that hung). The session's own
    fields (its pid, start, command) are kept; its ending is replaced, with `details` beside it."""
    run = RunDir(output_dir)
    ending = ENDINGS.get(exit_code, CRASHED)

    def change(status: dict) -> dict:
        if not status:  # none yet, or unreadable: the ending alone still says what happened
            status = {"pid": None, "host": None, "launcher": launcher(), "started": None, "command": command_line()}
        return {**status, **_ending_fields(run, exit_code, ending, reason), **details, "updated": now()}

    update_status(run.path, change)


def _ending_fields(run: RunDir, exit_code: int | None, ending: Ending, reason: str) -> dict:
    newest = newest_sound_checkpoint(run.path)  # never one that failed its verification
    return {
        "state": ending.state,
        "exit_code": exit_code,
        "rerun": ending.rerun,
        "reason": reason,
        "next": ending.next,
        "checkpoint_step": newest.step if newest else None,
        "checkpoint": str(newest.path) if newest else None,
    }
