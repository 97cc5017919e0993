"""data_dir as `prepare` holds it: one `prepare` at a time (a lock, and the cluster jobs it submitted
while they run), a record of exactly which paths it created (the only ones it may ever remove), and its
inputs kept out of the places it writes.

A folder is someone's: a corpus may sit in `corpus/sources/`, a tokenizer in `dd/tokenizer/`. So
`prepare` writes `prepare_progress.json` before it creates anything, naming what it is about to
create; a later run with other settings removes those paths and nothing else, and a folder that
holds, where `prepare` writes, something no record names is refused, never emptied.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hf_pretrain.config import DataConfig, SourceConfig
from hf_pretrain.data.prepared import LOGS_DIR, META_FILE, SOURCES_DIR, DataMismatchError
from hf_pretrain.data.sources import SourceError, expand_globs
from hf_pretrain.data.tokenizer import TOKENIZER_DIR
from hf_pretrain.data.verify import VERIFIED_FILE
from hf_pretrain.run_folder.json_files import write_json_atomically
from hf_pretrain.run_folder.run_lock import RunDirUnusable, RunLock, RunLocked

PROGRESS_FILE = "prepare_progress.json"
LOCK_FILE = "prepare.lock"
# Held (shared) by every worker of a local `prepare` for as long as it lives: prepare.lock dies with
# `prepare`, a worker a moment later (processes.die_with), and it may write until then.
WORKERS_LOCK_FILE = "prepare.workers.lock"
ORPHAN_GRACE_S = 5.0
# Every path `prepare` writes in data_dir, besides its own two records above.
OUTPUT_NAMES = (TOKENIZER_DIR, SOURCES_DIR, LOGS_DIR, META_FILE, VERIFIED_FILE)
# What a run creates before its first source: these, removed whole when its work is discarded.
CREATED_NAMES = (TOKENIZER_DIR, SOURCES_DIR, LOGS_DIR)


class PrepareLocked(RuntimeError):
    """Another `prepare` is writing into the same data_dir."""


def own_folder_hint(data_dir: Path) -> str:
    """A data_dir of its own next to this one, that does not exist yet: what a refusal suggests."""
    base = data_dir.resolve()
    candidate, n = base.with_name(f"{base.name}-prepared"), 2
    while candidate.exists():
        candidate, n = base.with_name(f"{base.name}-prepared-{n}"), n + 1
    return f"set data_dir to a folder of its own, e.g. `--data_dir {candidate}`"


def writable(folder: Path) -> bool:
    """Whether a folder can be created at `folder`, tried: a probe folder made and removed in its nearest
    existing ancestor (a read-only mount, /proc, a root-owned folder all fail it, whatever their modes say)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        with tempfile.TemporaryDirectory(dir=existing, prefix=".hf-pretrain-probe-"):
            return True
    except OSError:
        return False


def unusable_data_dir(data_dir: Path) -> str:
    """Why `prepare` cannot create or write `data_dir`, and a fix that works when pasted: a dangling link
    named as one, a read-only disk answered with a folder on another disk (one next to it would be on the
    same), anything else (a file in the way) with a folder of its own beside it."""
    if data_dir.is_symlink() and not data_dir.exists():
        target = Path(os.readlink(data_dir))
        target = target if target.is_absolute() else data_dir.parent / target
        return (
            f"data_dir {data_dir} is a symbolic link to {target}, which does not exist: create it "
            f"(`mkdir -p {target}`), or set data_dir to another folder"
        )
    if not writable(data_dir):
        elsewhere = [Path.home() / "hf_pretrain_data" / data_dir.name, Path(tempfile.gettempdir()) / data_dir.name]
        fix = next((f"e.g. `--data_dir {c}`" for c in elsewhere if writable(c)), "a folder on another disk")
        return (
            f"cannot write into {data_dir}: its disk is read-only or not writable by this user; set data_dir to {fix}"
        )
    return f"cannot write into {data_dir} (a file is in the way?); {own_folder_hint(data_dir)}"


# ---------------------------------------------------------------------- one at a time
@dataclasses.dataclass
class _LockedFolder:  # what RunLock needs of a folder: where it is, and its lock file
    path: Path

    @property
    def lock(self) -> Path:
        return self.path / LOCK_FILE


class PrepareLock(RunLock):
    """The run folder's lock (run_lock.py: flock, dies with the process, names its holder) on data_dir."""

    def __init__(self, data_dir: Path):
        super().__init__(_LockedFolder(Path(data_dir)))  # type: ignore[arg-type]

    def acquire(self) -> None:
        # A killed prepare's forked children share its lock until the kernel has ended them too
        # (pipeline.py arms them to die with it): a holder named in the file that is gone already
        # is waited for, briefly; so are its workers, which end as soon as they see it gone.
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while True:
            try:
                super().acquire()
                return self._wait_for_workers(deadline)
            except RunLocked as exc:
                if time.monotonic() > deadline or not self._holder_is_gone():
                    raise PrepareLocked(str(exc)) from None
                time.sleep(0.1)
            except RunDirUnusable:
                break
        raise DataMismatchError(unusable_data_dir(self.run_dir.path))

    def _wait_for_workers(self, deadline: float) -> None:
        """Holding prepare.lock, wait (until `deadline`) for the workers of an earlier prepare to end;
        refuse, naming them, if they are still writing by then."""
        while (workers := workers_alive(self.run_dir.path)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if workers:
            self.release()
            pids = " ".join(map(str, workers))
            raise PrepareLocked(
                f"{self.run_dir.path} is still being written by the workers of an earlier `hf-pretrain prepare` "
                f"that has ended (pid {pids.replace(' ', ', ')}); wait for them to end, or end them "
                f"(`kill {pids}`), then run this command again"
            )

    def _holder_is_gone(self) -> bool:
        try:
            holder = json.loads(self.run_dir.lock.read_text() or "{}")
        except (OSError, ValueError):
            return False
        if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
            return False
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False

    def _refusal(self, holder: dict[str, Any]) -> str:
        who = (
            f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')} ({holder.get('command')})"
            if holder
            else "a prepare that is just starting"
        )
        if self._holder_is_gone():  # an older prepare's orphaned workers, still alive (not Linux, say)
            who += f"; that process has exited but processes it started still hold {LOCK_FILE}: end them"
        return (
            f"{self.run_dir.path} is being prepared by another `hf-pretrain prepare`: {who}. Two prepares in one "
            f"folder would mix their token files; wait for it to end (then this command finds the folder "
            f"prepared or goes on where it stopped), stop it, or {own_folder_hint(self.run_dir.path)}"
        )


_worker_lock_fd: int | None = None  # a worker's shared lock on WORKERS_LOCK_FILE, held until it exits


def hold_as_worker(data_dir: str | Path) -> None:
    """In a worker of `prepare`: hold a shared lock on data_dir's WORKERS_LOCK_FILE for the rest of
    this process's life, so a later `prepare` sees the folder busy until this worker has ended. Where
    the filesystem has no locks, nothing is held."""
    global _worker_lock_fd
    if _worker_lock_fd is not None:
        return
    try:
        fd = os.open(Path(data_dir) / WORKERS_LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # only a checking `prepare` holds it exclusively, and only briefly
    except OSError:
        os.close(fd)
        return
    _worker_lock_fd = fd


def workers_alive(data_dir: Path) -> list[int] | None:
    """The pids of workers still holding data_dir's WORKERS_LOCK_FILE ([0] where they cannot be
    named), None if none do."""
    path = Path(data_dir) / WORKERS_LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return _lock_holders(os.fstat(fd)) or [0]
        return None
    else:
        return None  # nobody holds it (closing the descriptor drops this check's own lock)
    finally:
        os.close(fd)


def _lock_holders(stat: os.stat_result) -> list[int]:
    """The pids that hold a lock on the file `stat` describes, from /proc/locks (Linux; [] elsewhere)."""
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    pids = set()
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] != "->" and fields[5] == device and fields[4].isdigit():
            pids.add(int(fields[4]))
    return sorted(pids)


# ---------------------------------------------------------------------- inputs
def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_inputs_outside_outputs(data: DataConfig) -> None:
    """No input (a source's file, the tokenizer) lies where `prepare` writes or removes: it would be
    overwritten or deleted."""
    data_dir = Path(data.data_dir).resolve()
    outputs = [data_dir / name for name in OUTPUT_NAMES]
    inputs: list[tuple[str, Path]] = []
    for i, source in enumerate(data.sources):
        if source.kind == "files":
            inputs += [(f"sources[{i}]", p.resolve()) for p in expand_globs(source.paths)]
    if data.tokenizer != "train" and Path(data.tokenizer).exists():
        inputs.append(("tokenizer", Path(data.tokenizer).resolve()))
    for what, path in inputs:
        for output in outputs:
            if _inside(path, output):
                raise SourceError(
                    f"{what}: {path} lies in {output}, where `prepare` writes its own output (it would be "
                    f"overwritten); {own_folder_hint(data_dir)}"
                )


def check_no_duplicate_sources(sources: list[SourceConfig]) -> None:
    """The same corpus twice would be tokenized twice (hours at scale) and drawn twice as often: refused."""
    seen: dict[Any, int] = {}
    for i, source in enumerate(sources):
        if source.kind == "files":
            keys = [("file", p.resolve()) for p in expand_globs(source.paths)]
        else:
            keys = [(source.kind, source.name, source.config, source.split, source.column)]
        for key in keys:
            first = seen.setdefault(key, i)
            if first != i:
                what = f"the file {key[1]}" if key[0] == "file" else f"the {source.kind} corpus `{source.name}`"
                raise SourceError(
                    f"sources[{first}] and sources[{i}] both read {what}: it would be tokenized twice and drawn "
                    f"twice as often; list it once (its `weight` sets its share)"
                )


# ---------------------------------------------------------------------- what prepare owns
def read_progress(data_dir: Path) -> dict[str, Any] | None:
    path = data_dir / PROGRESS_FILE
    if not path.is_file():
        return None
    try:
        progress = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # written atomically by `prepare`, so not ours: nothing in it is trusted
    return progress if isinstance(progress, dict) else {}


def write_progress(data_dir: Path, progress: dict[str, Any]) -> None:
    write_json_atomically(data_dir / PROGRESS_FILE, progress, indent=2)


def _what_differs(old: dict[str, Any], new: dict[str, Any]) -> str:
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(keys) or "the settings"


def records_what_it_created(progress: dict[str, Any] | None) -> bool:
    """A progress record of `prepare`'s own, naming what it created (only names it creates)."""
    created = progress.get("created") if progress else None
    return isinstance(created, list) and all(name in CREATED_NAMES for name in created)


def refuse_foreign(data_dir: Path) -> None:
    """Refuse a folder that holds, where `prepare` writes, anything no record of its own names (called
    before the lock is taken too, so that a refused folder is left exactly as it was)."""
    if records_what_it_created(read_progress(data_dir)) or (data_dir / META_FILE).is_file():
        return
    foreign = [name for name in (*OUTPUT_NAMES, PROGRESS_FILE) if (data_dir / name).exists()]
    if foreign:
        raise DataMismatchError(
            f"{data_dir} already holds {', '.join(foreign)}, where `prepare` writes, and no record of its own says "
            f"it wrote them: it never removes what it did not write; move them away, or {own_folder_hint(data_dir)}"
        )


def discard_or_refuse(
    data_dir: Path, progress: dict[str, Any] | None, settings: dict[str, Any], fingerprint: str, log: Callable
) -> None:
    """Before a fresh start: remove what an interrupted `prepare` recorded it created (saying so and why);
    refuse a folder that holds, where `prepare` writes, anything no record of its own names."""
    if records_what_it_created(progress):
        created = progress["created"]
        if progress.get("data_fingerprint") != fingerprint:
            why = f"it was made with other data settings ({_what_differs(progress.get('settings') or {}, settings)} differ)"
        elif not progress.get("tokenizer_hash"):
            why = "it stopped before its tokenizer was saved"
        else:
            why = f"its saved tokenizer in {data_dir / TOKENIZER_DIR} is not the one its token files were made with"
        gone = [name for name in created if (data_dir / name).exists()]
        log(
            f"discarding the partial work of an interrupted prepare in {data_dir}: {why}; removing what it "
            f"wrote: {', '.join(gone) or 'nothing left'}"
        )
        for name in gone:
            path = data_dir / name
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        (data_dir / PROGRESS_FILE).unlink()
    refuse_foreign(data_dir)


# ---------------------------------------------------------------------- cluster jobs
# A Slurm job that `prepare` submitted keeps writing after `prepare` returns (and its lock is gone): the
# progress record names it, and a later `prepare` in the folder is refused while the job still runs.
JOBS_KEY = "jobs"


def record_jobs(data_dir: Path, jobs: list[dict[str, Any]]) -> None:
    """Add the jobs just submitted ({"source", "job_id", "tasks"}) to the progress record."""
    progress = read_progress(data_dir) or {}
    submitted = time.strftime("%Y-%m-%d %H:%M:%S")
    write_progress(data_dir, progress | {JOBS_KEY: [job | {"submitted_at": submitted} for job in jobs]})


def slurm_job_state(job_id: str) -> str | None:
    """The job's state as squeue shows it (PENDING, RUNNING ...; an array job: its first task's), None once
    Slurm no longer lists it."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True, timeout=60
        )
    except FileNotFoundError:
        raise PrepareLocked(
            f"Slurm job {job_id}, submitted by an earlier `prepare`, may still be writing into this folder, and "
            f"`squeue` is not here to ask: run this command where Slurm's commands are (the login node)"
        ) from None
    except subprocess.TimeoutExpired:
        raise PrepareLocked(f"`squeue -j {job_id}` did not answer in 60 s: run this command again") from None
    states = out.stdout.split() if out.returncode == 0 else []
    return states[0] if states else None


def refuse_while_jobs_run(data_dir: Path, counts: Callable[[str], str]) -> None:
    """Refuse (PrepareLocked) while a job an earlier `prepare` submitted into `data_dir` is still listed
    by Slurm; `counts(source)` says what its tasks have done so far. A job that is over is forgotten:
    datatrove skips its finished tasks and submits the others again."""
    progress = read_progress(data_dir) or {}
    jobs = progress.get(JOBS_KEY) or []
    running = [(job, state) for job in jobs if (state := slurm_job_state(job["job_id"]))]
    if running:
        said = "; ".join(
            f"Slurm job {job['job_id']} ({job['source']}, {job.get('tasks', '?')} tasks, submitted "
            f"{job.get('submitted_at', '?')}) is {state}: {counts(job['source'])}"
            for job, state in running
        )
        ids = " ".join(str(job["job_id"]) for job, _ in running)
        raise PrepareLocked(
            f"{data_dir} is still being prepared by the cluster: {said}. Two prepares in one folder would mix "
            f"their token files; wait for it to end (`squeue -j {ids.replace(' ', ',')}`), then run this command "
            f"again: it checks the files and writes {META_FILE} (or submits the tasks that failed); or cancel it "
            f"(`scancel {ids}`) first"
        )
    if jobs:
        write_progress(data_dir, {k: v for k, v in progress.items() if k != JOBS_KEY})
