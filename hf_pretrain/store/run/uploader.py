"""Sealed checkpoints to the store, in the background: training never waits for the network.

`submit(path, step)` is called once a checkpoint is sealed locally (the run's callback); it holds
the checkpoint's files by hard links (`step_N.upload/`, no bytes copied), so local retention may
prune the checkpoint while it is still on its way, and returns. A thread of its own sends the files,
several at a time, then the manifest LAST: a checkpoint is complete in the store only once all its
bytes are (store/run/pull.py reads it so). Every failure is retried with exponential back-off and
recorded, redacted, as `last_error`; nothing is raised into training. When a newer checkpoint is
waiting, an older one that retention would drop anyway is skipped.

Before any byte of a checkpoint, its folder gets `WRITER` naming the run's id (`run.json` in the store,
made at the run's first start and kept by every session of it): a folder left without a manifest (a
machine lost mid-upload) is removed at the run's next start by `remove_half_uploads` only when that
object proves this run wrote it; anything else (no such object, another run's id) is left and said.

After each upload the store's retention runs (`keep_checkpoints`, milestones and branch points kept,
as locally), removing only step folders with a manifest: what this run, or one before it on the same
URL, uploaded completely. The manifest goes first, so a removal cut short leaves no "complete" half.

Every write goes through `may_write` (the run's lease, store/run/lease.py): while this machine's lease has
run out (the store did not answer its heartbeats) a write fails as `NotHolding` and is tried again, and
once another machine holds the run nothing more is tried: its checkpoints, records and status.json there
are the other machine's.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_pretrain.checkpoints.layout import BRANCH_POINT, MANIFEST, TRAIN_STATE
from hf_pretrain.checkpoints.progress import ByteCount
from hf_pretrain.store.reach import describe_failure
from hf_pretrain.store.run.pull import COMPILE_CACHE, SMALL_FILES, compile_cache_files, complete_steps
from hf_pretrain.store.run.transfer import put_files, with_retries
from hf_pretrain.store.urls import StoreURL

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

WRITER = ".hf_pretrain_writer.json"  # the first object of a checkpoint folder: the run that writes it
RUN_RECORD = "run.json"  # the run's id in the store, the same for every session of the run
QUOTES_PATHS = ("status.json",)  # records whose text names local paths (training/session.py writes them)
UPLOAD_SUFFIX = ".upload"  # hard links of a checkpoint on its way to the store; never listed or resumed
# A checkpoint's upload has a deadline once a rate was measured: UPLOAD_SLACK times what its bytes take at
# the last complete upload's rate, and never under UPLOAD_FLOOR_S. Past it, the upload waits its turn: a
# newer checkpoint goes first (the older one is dropped, unless a milestone), else it is tried again. A
# store that trickles (a stalled connection re-established, a throttled region) then never holds every
# later checkpoint behind the one it is stuck on. The 1b's 12.5 GB at 100 MB/s: about 2 min measured,
# about 8 min allowed.
UPLOAD_SLACK = 4.0
UPLOAD_FLOOR_S = 300.0


class NotHolding(OSError):
    """This machine does not hold the run's lease now (it ran out, or another machine took it): nothing is
    written to the store."""


class _Gated:
    """The store's file system, every write asking `may_write` first (reads go through as they are)."""

    WRITES = ("put_file", "pipe_file", "rm_file", "rm")

    def __init__(self, fs: AbstractFileSystem, may_write: Callable[[], bool], url: StoreURL):
        self._fs, self._may_write, self._url = fs, may_write, url

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._fs, name)
        if name not in self.WRITES:
            return attribute

        def gated(*args: Any, **kwargs: Any) -> Any:
            if not self._may_write():
                raise NotHolding(
                    f"this machine does not hold the lease of {self._url} now (not renewed in time, or taken "
                    f"over): nothing is written there until it does"
                )
            return attribute(*args, **kwargs)

        return gated


class ShortUpload(OSError):
    """An object in the store is not the size of the file it was sent from: sent again, then checked again."""


@dataclass
class Upload:
    step: int
    held: Path  # the hard-linked copy the files are read from
    bytes: int
    keep: bool = False  # a milestone or branch point: uploaded even when a newer one waits


@dataclass
class Progress:
    """What status.json's `store` section says; read by the run, written by the uploader's thread."""

    last_step: int | None = None  # newest complete checkpoint in the store
    newest_local: int | None = None  # newest sealed checkpoint of this machine
    bytes_behind: int = 0
    uploading: int | None = None
    last_error: str | None = None
    count: ByteCount = field(default_factory=ByteCount)


class Uploader:
    """`submit(path, step)` after each seal; `wait(...)` at the end; `close()` to stop the thread."""

    def __init__(
        self,
        fs: AbstractFileSystem,
        url: StoreURL,
        local: Path,
        keep: int,
        milestone_interval: int = 0,
        on_change: Callable[[], None] = lambda: None,
        say: Callable[[str], None] = print,
        run_id: str | None = None,
        may_write: Callable[[], bool] = lambda: True,
    ):
        """`may_write`: whether this machine holds the run's lease now (asked before every write)."""
        self.fs = _Gated(fs, may_write, url)
        self.url, self.local, self.keep, self.milestones = url, local, keep, milestone_interval
        self.run_id = run_id
        self.on_change, self.say = on_change, say
        self.progress = Progress()
        self._pending: list[Upload] = []
        self._lock = threading.Condition()
        self._busy = False
        self._closing = False
        self._give_up_at: float | None = None  # a wait that ends: retries stop then
        self._lost = False  # another machine holds the run's lease: nothing more is written to the store
        self._rate: float | None = None  # bytes/s of the last complete upload: the next one's deadline
        self._late: set[int] = set()  # the steps whose deadline passing was said (once each)
        self._overdue = False  # the upload under way passed its deadline
        self._compile_sent: dict[str, tuple[int, int]] = {}  # compile_cache/ files up: (size, mtime_ns) each
        self._compile_listed: dict[str, int] | None = None  # the store's compile_cache/ at the first look
        self._thread = threading.Thread(target=self._run, name="hf-pretrain-upload", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the training side
    def submit(self, path: Path, step: int, keep: bool = False) -> None:
        """Hold the sealed checkpoint `path` by hard links and queue it; returns at once."""
        held = path.with_name(path.name + UPLOAD_SUFFIX)
        shutil.rmtree(held, ignore_errors=True)
        shutil.copytree(path, held, copy_function=_link_or_copy)
        size = sum(f.stat().st_size for f in held.rglob("*") if f.is_file())
        keep = keep or bool(self.milestones and step % self.milestones == 0) or _flag(held, BRANCH_POINT)
        with self._lock:
            self._pending.append(Upload(step, held, size, keep))
            self.progress.newest_local = max(step, self.progress.newest_local or 0)
            self.progress.bytes_behind += size
            self._lock.notify_all()
        self.on_change()

    def idle(self) -> bool:
        with self._lock:
            return not self._pending and not self._busy

    def wait(self, timeout_s: float) -> bool:
        """Block until every submitted checkpoint is in the store (True), or `timeout_s` passed (False:
        retries stop; the local checkpoints stay for the next start to upload)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._give_up_at = deadline
            while (self._pending or self._busy) and not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.2))
        return not (self._pending or self._busy)

    def lease_lost(self) -> None:
        """Another machine took the run over: no upload, manifest or record of this one goes up from now."""
        self._lost = True
        self.close(timeout=0)

    def close(self, timeout: float = 30.0) -> None:
        """No more uploads: a job under way gives up at its next retry; the thread is a daemon, so one
        blocked in a request does not hold the process (the join is bounded)."""
        with self._lock:
            self._closing = True
            self._give_up_at = min(self._give_up_at or time.monotonic(), time.monotonic())
            self._lock.notify_all()
        self._thread.join(timeout=timeout)

    # ------------------------------------------------------------------ the thread
    def _keep_trying(self) -> bool:
        if self._lost:  # the run is another machine's: nothing of this one is tried again
            return False
        return self._give_up_at is None or time.monotonic() < self._give_up_at

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closing:
                    self._lock.wait()
                if not self._pending or self._closing:  # closed: what waits stays for the next start
                    return
                job = self._next()
                self._busy = True
            try:
                done = self._upload(job)
            except Exception as exc:  # a bug here must not reach training: said, the job kept locally
                self._error(exc, f"uploading step {job.step}")
                done = False
            with self._lock:
                self._busy = False
                if not done and self._overdue and self._keep_trying() and not self._lost:  # its deadline alone
                    self._pending.insert(0, job)  # behind a newer checkpoint (which drops it), else again
                    continue
                if not done:  # given up (the wait ended): kept where it is, for the next start
                    self._pending.insert(0, job)
                    self._closing = True
                    self._lock.notify_all()
                    return
                self._lock.notify_all()

    def _next(self) -> Upload:
        """The oldest job that must go (a milestone, a branch point), else the newest; the rest are dropped."""
        self._pending.sort(key=lambda u: u.step)
        newest = self._pending[-1]
        job = next((u for u in self._pending if u.keep), newest)
        for dropped in [u for u in self._pending if u is not job and not u.keep and u is not newest]:
            self._pending.remove(dropped)
            self.progress.bytes_behind -= dropped.bytes
            shutil.rmtree(dropped.held, ignore_errors=True)
        self._pending.remove(job)
        return job

    def _deadline(self, job: Upload) -> float | None:
        """When `job`'s upload stops holding later checkpoints up (None before a rate was measured)."""
        if self._rate is None:
            return None
        return time.monotonic() + max(UPLOAD_FLOOR_S, UPLOAD_SLACK * job.bytes / self._rate)

    def _upload(self, job: Upload) -> bool:
        self.progress.uploading = job.step
        self.progress.count = ByteCount(job.bytes)
        self.on_change()
        started, due = time.monotonic(), self._deadline(job)
        self._overdue = False
        if due is None:
            keep_trying = self._keep_trying
        else:

            def keep_trying() -> bool:
                if time.monotonic() < due:
                    return self._keep_trying()
                self._overdue = True
                if job.step not in self._late:
                    self._late.add(job.step)
                    self.say(
                        f"step {job.step}: its upload passed its deadline ({due - started:.0f} s: "
                        f"{UPLOAD_SLACK:g}x its {job.bytes / 1e6:,.1f} MB at the {self._rate / 1e6:,.1f} MB/s "
                        f"measured, at least {UPLOAD_FLOOR_S:.0f} s): a newer checkpoint goes first, else it is "
                        f"tried again"
                    )
                return False

        remote = self.url.join("checkpoints", job.held.name[: -len(UPLOAD_SUFFIX)])
        files = sorted(p for p in job.held.rglob("*") if p.is_file() and p.name != MANIFEST)
        pairs = [(p, remote.join(str(p.relative_to(job.held))).path) for p in files]
        on_error = lambda exc: self._error(exc, f"uploading step {job.step}")  # noqa: E731
        # first: which run writes this folder, so that its half (a kill from here on) is provably this run's
        mark = json.dumps({"run_id": self.run_id, "step": job.step}).encode()
        if not with_retries(lambda: self.fs.pipe_file(remote.join(WRITER).path, mark), keep_trying, on_error):
            return False
        if not put_files(self.fs, pairs, self.progress.count, keep_trying, on_error):
            return False
        # every object's size in the store checked against the local file before the manifest goes: an
        # object cut short (a throttled part, an unflushed write) never makes the checkpoint complete
        if not with_retries(lambda: self._check_sizes(pairs, remote), keep_trying, on_error):
            return False
        # the manifest last: until it is there, the checkpoint is not complete in the store
        if self._lost or not put_files(
            self.fs, [(job.held / MANIFEST, remote.join(MANIFEST).path)], None, keep_trying, on_error
        ):
            return False
        shutil.rmtree(job.held, ignore_errors=True)
        self._rate = job.bytes / max(time.monotonic() - started, 1e-3)
        self.say(f"step {job.step}: in {remote}")  # from here a kill of this machine loses nothing of it
        self.progress.last_step = max(job.step, self.progress.last_step or 0)
        self.progress.bytes_behind -= job.bytes
        self.progress.uploading, self.progress.last_error = None, None
        self.push_small_files()
        self._retention()
        self.on_change()
        return True

    def _check_sizes(self, pairs: list[tuple[Path, str]], remote: StoreURL) -> None:
        """Raise `ShortUpload` naming the objects under `remote` whose size differs from the local file
        (each sent again first, so the next try can pass)."""
        listed = {path.rstrip("/"): info.get("size") for path, info in self.fs.find(remote.path, detail=True).items()}
        wrong = [(local, path) for local, path in pairs if listed.get(path) != local.stat().st_size]
        if wrong:
            names = ", ".join(path.rsplit("/", 1)[-1] for _, path in wrong[:3])
            for local, path in wrong:
                self.fs.put_file(str(local), path)
            raise ShortUpload(f"{len(wrong)} object(s) in {remote} short or missing after the upload ({names})")

    def missing(self) -> list[int]:
        """The steps of this session that are not complete in the store (queued, or given up on)."""
        with self._lock:
            return sorted({u.step for u in self._pending} | ({self.progress.uploading} - {None}))

    def push_small_files(self, retry: bool = True) -> bool:
        """The run's records (metrics, samples, status.json, ...) to the store; True when they are there.
        Without `retry`, one try (the heartbeat's thread must not wait on a store that is down)."""
        if self._lost:
            return False  # the lease is another machine's: its records in the store are not ours to write
        pairs = [(self.local / n, self.url.join(n).path) for n in SMALL_FILES if (self.local / n).is_file()]
        compiled = self._compile_cache_news()
        pairs += [(path, self.url.join(COMPILE_CACHE, path.name).path) for path, _ in compiled]
        keep_trying = self._keep_trying if retry else lambda: False
        sent = [(self.in_store_terms(path), remote) for path, remote in pairs]
        try:
            done = put_files(self.fs, sent, None, keep_trying, lambda e: self._error(e, "uploading the records"))
            if done:
                self._compile_sent.update((path.name, stamp) for path, stamp in compiled)
            return done
        finally:
            for (path, _), (copy, _) in zip(pairs, sent, strict=True):
                if copy != path:
                    copy.unlink(missing_ok=True)

    def _compile_cache_news(self) -> list[tuple[Path, tuple[int, int]]]:
        """compile_cache/'s files not in the store yet, or rewritten since (training/compile_cache.py): each
        goes up once, with the records that follow its writing, not again at every heartbeat."""
        files = compile_cache_files(self.local)
        if files and self._compile_listed is None:  # once: what a pull brought down is not sent back up
            try:
                found = self.fs.find(self.url.join(COMPILE_CACHE).path, detail=True)
                self._compile_listed = {p.rstrip("/").rsplit("/", 1)[-1]: i.get("size") for p, i in found.items()}
            except Exception:  # not listed: whatever is here goes up, once
                self._compile_listed = {}
        news = []
        for path in files:
            try:
                stat = path.stat()
            except OSError:
                continue
            stamp = (stat.st_size, stat.st_mtime_ns)
            if path.name not in self._compile_sent and (self._compile_listed or {}).get(path.name) == stat.st_size:
                self._compile_sent[path.name] = stamp  # in the store already, the same size
            if self._compile_sent.get(path.name) != stamp:
                news.append((path, stamp))
        return news

    def in_store_terms(self, path: Path) -> Path:
        """`path` itself, or for a record that quotes this machine's working copy (status.json: the
        checkpoint, final/, metrics), a copy of it naming the run's URL there instead: the store holds
        the same layout, and another machine reads it (the copy is the caller's to remove)."""
        if path.name not in QUOTES_PATHS:
            return path
        try:
            text = path.read_text()
        except OSError:
            return path
        copy = path.with_name(f".{path.name}.{threading.get_ident()}.for_store")
        copy.write_text(text.replace(str(self.local), str(self.url)))
        return copy

    def _retention(self) -> None:
        """Keep the newest `keep` complete checkpoints in the store, its milestones and branch points."""
        try:
            for step in complete_steps(self.fs, self.url)[self.keep :]:
                if self.milestones and step % self.milestones == 0:
                    continue
                folder = self.url.join("checkpoints", f"step_{step:08d}")
                if _remote_flag(self.fs, folder, BRANCH_POINT):
                    continue
                self.fs.rm_file(folder.join(MANIFEST).path)  # no longer complete, then gone
                self.fs.rm(folder.path, recursive=True)
        except Exception as exc:  # retention is tried again after the next upload
            self._error(exc, "removing old checkpoints in the store")

    def _error(self, exc: BaseException, doing: str) -> None:
        self.progress.last_error = describe_failure(self.url, exc, doing)
        self.on_change()

    def status(self) -> dict[str, Any]:
        """status.json's `store` section."""
        p = self.progress
        behind = None if p.newest_local is None else p.newest_local - (p.last_step or 0)
        return {
            "url": str(self.url),
            "last_step": p.last_step,
            "steps_behind": behind,
            "bytes_behind": max(0, p.bytes_behind),
            "uploading": p.uploading,
            "last_error": p.last_error,
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }


def run_identity(fs: AbstractFileSystem, url: StoreURL, new_id: str) -> str:
    """The run's id: `run.json`'s in the store, else `new_id`, written there (the run's first start)."""
    record = url.join(RUN_RECORD).path
    try:
        return str(json.loads(fs.cat_file(record))["run_id"])
    except FileNotFoundError:
        fs.pipe_file(
            record, (json.dumps({"run_id": new_id, "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n").encode()
        )
        return new_id
    except (ValueError, KeyError, TypeError):  # unreadable: no proof of anything; this session's own id
        return new_id


def remove_half_uploads(fs: AbstractFileSystem, url: StoreURL, run_id: str, say: Callable[[str], None]) -> list[int]:
    """Remove the step folders without a manifest whose `WRITER` names `run_id`: this run's uploads cut
    short (the caller holds the run's lease: none of its sessions is uploading). Others are left, said."""
    from hf_pretrain.checkpoints.layout import PREFIX

    complete = set(complete_steps(fs, url))
    removed = []
    try:
        folders = fs.ls(url.join("checkpoints").path, detail=False)
    except FileNotFoundError:
        return removed
    for folder in sorted(folders):
        name = folder.rstrip("/").rsplit("/", 1)[-1]
        if not (name.startswith(PREFIX) and name[len(PREFIX) :].isdigit()) or int(name[len(PREFIX) :]) in complete:
            continue
        try:
            writer = json.loads(fs.cat_file(f"{folder}/{WRITER}")).get("run_id")
        except (OSError, ValueError, AttributeError):
            writer = None
        if writer == run_id:
            fs.rm(folder, recursive=True)
            removed.append(int(name[len(PREFIX) :]))
            say(f"store: removed {url}/checkpoints/{name}: this run's upload, cut short (no manifest)")
        else:
            whose = f"run {writer}" if writer else "no run's mark"
            say(f"store: left {url}/checkpoints/{name} (no manifest, {whose}): not this run's to remove")
    return removed


def _flag(folder: Path, key: str) -> bool:
    try:
        return bool(json.loads((folder / TRAIN_STATE).read_text()).get(key))
    except (OSError, ValueError, AttributeError):
        return False


def _remote_flag(fs: AbstractFileSystem, folder: StoreURL, key: str) -> bool:
    try:
        return bool(json.loads(fs.cat_file(folder.join(TRAIN_STATE).path)).get(key))
    except (OSError, ValueError, AttributeError):
        return False


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
