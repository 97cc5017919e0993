"""A run whose `output_dir` is a URL: the store is the truth, this machine trains a local copy of it.

`RunInStore.begin` (train.py, before anything else) checks the store (store/reach.py: exit 78,
one line), takes the run's lease (store/run/lease.py: exit 73 when another machine holds it),
pulls the run into its local copy (store/run/pull.py) and hands back where training writes. From
there the run is a local run: resume, checkpoints and retention work as for any folder. As a side job
of the loop (the `Callback` protocol, training/callbacks.py) it hands each sealed checkpoint to the
uploader (store/run/uploader.py); its own thread renews the lease, mirrors a `stop` written into
the store into the local folder (the guards read it there as always), and keeps status.json's
`store` section (and status.json in the store) up to date. At the run's end, a stop or a SIGTERM,
`wait` lets the uploads finish, with a live line, for at most `store_wait_s`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hf_pretrain.checkpoints.layout import checkpoints_root
from hf_pretrain.checkpoints.progress import ByteCount, LiveLine
from hf_pretrain.checkpoints.store import list_checkpoints
from hf_pretrain.formatting import human_bytes
from hf_pretrain.redaction import redact
from hf_pretrain.run_folder.run_dir import FINAL_IN_STORE, RunDir, read_status, set_activity, update_status
from hf_pretrain.run_folder.sessions import start_up
from hf_pretrain.store.reach import describe_failure, open_checked, quiet_orphaned_requests
from hf_pretrain.store.run.lease import Lease
from hf_pretrain.store.run.ledger_sync import merge_sessions, sessions_here
from hf_pretrain.store.run.pull import (
    FINAL,
    NOT_IN_STORE,
    STORE_SECTION,
    complete_steps,
    final_in_store,
    pull_run,
)
from hf_pretrain.store.run.transfer import put_files
from hf_pretrain.store.run.uploader import (
    RUN_RECORD,
    UPLOAD_SUFFIX,
    Uploader,
    remove_half_uploads,
    run_identity,
)

if TYPE_CHECKING:
    from hf_pretrain.config import CheckpointConfig, StoreConfig
    from hf_pretrain.store.location import Location

STOP_POLL_S = 3.0  # how often the store is asked for a stop request
BEHIND = "not in the store "  # how `behind`'s line begins (a session's reason ends with it: train.py reads it there)
CLOSE_S = 20.0  # the most the last store writes (records, the lease) wait at a run's end, past `store_wait_s`


MARK_SLACK_S = 2.0
PULL_WAIT_S = 3600.0  # how long a process waits for its machine's pull (a launcher ends it sooner if that failed)


def mark_pulled(local: Path, url, final_there: bool) -> None:
    """The working copy is pulled for this session: store.json says when (atomically: others poll it), and
    whether final/ is whole in the store (`final_in_store`): every process of the job then judges a finished
    run alike (checkpoints/resume_decision.finished_at), none pulling final/ for it."""
    link = RunDir(local).store_link
    tmp = link.with_name(f"{link.name}.{os.getpid()}.tmp")
    record = {"url": str(url), "pulled": time.time(), FINAL_IN_STORE: final_there}
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, link)


def pull_here(run: Location, say: Callable[[str], None] = print, max_steps: int | None = None) -> None:
    """The first process of another machine of the job: its own copy of the run URL `run` pulled
    (read only: the job's first process holds the lease and uploads), then marked. `max_steps` as
    `pull_run` takes it (a run going further needs its branch point on every machine)."""
    from hf_pretrain.store.reach import StoreRefused

    url, fs = open_checked(run.given, write=False)
    local = run.local
    try:
        pull_run(fs, url, local, say=lambda line: say(redact(line)), max_steps=max_steps)
        final_there = final_in_store(fs, url)
    except Exception as exc:
        raise StoreRefused(describe_failure(url, exc, "pulling the run")) from None
    mark_pulled(local, url, final_there)


def wait_for_pull(run: Location) -> None:
    """Block until this machine's first process has pulled the run into the working copy in this job.

    Every process of the machine reads the same local copy, and only one pulls it: the others must not
    read it before the pull ends (they would start from step 0, or from an older checkpoint, while the
    first resumes). The mark counts when it was written after this process was created: a mark from an
    earlier job on this machine was written at that job's start, before it trained, so it is older than
    every process of this one by far more than the `MARK_SLACK_S` the clock's reading is allowed.
    """
    import psutil  # accelerate's dependency

    born = psutil.Process().create_time() - MARK_SLACK_S  # psutil derives it from the boot time, to ~1 s
    link = RunDir(run.local).store_link
    deadline = time.monotonic() + PULL_WAIT_S
    while time.monotonic() < deadline:
        try:
            if json.loads(link.read_text()).get("pulled", 0) >= born:
                return
        except (OSError, ValueError, AttributeError):
            pass
        time.sleep(0.2)
    from hf_pretrain.store.reach import StoreRefused

    raise StoreRefused(f"this machine's first process did not pull {run} in {PULL_WAIT_S:.0f} s")


class RunInStore:
    """The store side of one training session (first process only); see the module's docstring."""

    def __init__(
        self, run: Location, store: StoreConfig, say: Callable[[str], None] = print, max_steps: int | None = None
    ):
        self.store, self.say = store, lambda line: say(redact(line))
        self.max_steps = max_steps  # as `pull_run` takes it: a run going further pulls its branch point too
        self.url, self.fs = open_checked(run.given)  # StoreRefused: one line, exit 78
        quiet_orphaned_requests(self.fs)  # a cut store's reset requests: said by our lines, not asyncio's tracebacks
        self.local = run.local  # the copy it trains in, in the cache folder the door named (`Where.of`)
        self.lease = Lease(self.fs, self.url, store.store_heartbeat_s)
        self.uploader: Uploader | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._status_lock = threading.Lock()
        self._expired_said = False  # the lease's running out was said (`_say_expiry`)
        self._final = False  # the schedule completed: final/ goes to the store too
        self.final_there = False  # final/ was whole in the store at the pull (`final_in_store`)

    @classmethod
    def begin(
        cls,
        run: Location,
        store: StoreConfig,
        checkpoints: CheckpointConfig,
        say: Callable[[str], None] = print,
        max_steps: int | None = None,
    ) -> RunInStore:
        """The run URL `run` (the door's) checked, leased and pulled, the uploader running (it prunes as
        `checkpoints` keeps); `max_steps`: the recipe's, so that a run going further under it pulls the
        checkpoint it goes on from (None: the newest alone, as for --resume none or a named folder). Raises
        `StoreRefused` or `LeaseHeld`."""
        run = cls(run, store, say, max_steps)
        note = run.lease.acquire()
        if note:
            run.say(f"store: {note}")
        try:
            run._pull()
        except BaseException:
            run.lease.release()
            raise
        mark_pulled(run.local, run.url, run.final_there)  # this machine's other processes may read the copy now
        run_id = run_identity(run.fs, run.url, run.lease.run_id)
        remove_half_uploads(run.fs, run.url, run_id, run.say)  # the lease is ours: none of this run uploads
        run.uploader = Uploader(
            run.fs,
            run.url,
            run.local,
            checkpoints.keep_checkpoints,
            checkpoints.milestone_interval,
            run._changed,
            run.say,
            run_id=run_id,
            may_write=run.lease.may_write,
        )
        run._catch_up()
        run._ticker = threading.Thread(target=run._tick, name="hf-pretrain-store", daemon=True)
        run._ticker.start()
        # the lease's clock, said apart from the ticker: a ticker caught in a request to a store gone silent
        # must not keep "this machine writes nothing now" unsaid (local files only: it never blocks)
        threading.Thread(target=run._watch_lease, name="hf-pretrain-lease", daemon=True).start()
        return run

    def _pull(self) -> None:
        self.say(
            f"store: training {self.url} (a working copy on this machine; `hf-pretrain status {self.url}` from any)"
        )
        self._set_aside_a_deleted_run()
        self.local.mkdir(parents=True, exist_ok=True)  # the working copy names its URL (records and messages use it)
        RunDir(self.local).store_link.write_text(json.dumps({"url": str(self.url)}) + "\n")
        for leftover in checkpoints_root(self.local).glob(f"*{UPLOAD_SUFFIX}"):  # a session killed mid-upload
            import shutil

            shutil.rmtree(leftover, ignore_errors=True)
        mine = sessions_here(self.local)  # the pull may replace it with the store's: merged back below
        try:
            with start_up.timed("pull"):  # sessions.jsonl: what a session's start-up went to
                step = pull_run(self.fs, self.url, self.local, say=self.say, max_steps=self.max_steps)
                merge_sessions(self.fs, self.url, self.local, mine)
                self.final_there = final_in_store(self.fs, self.url)
        except Exception as exc:  # the store failed between the checks and the pull
            from hf_pretrain.store.reach import StoreRefused

            raise StoreRefused(describe_failure(self.url, exc, "pulling the run")) from None
        self.say(f"store: newest complete checkpoint: step {step}" if step is not None else "store: no checkpoint yet")

    def _set_aside_a_deleted_run(self) -> None:
        """The store holds nothing of the run (no run.json, no checkpoint: deleted there) while this machine's
        copy has checkpoints: the store is the truth, so the run starts fresh, and the old copy (this cache's
        own) is set aside, not resumed from (it came back, the log calling the empty store's newest step 6)."""
        if not self.local.is_dir() or not list_checkpoints(self.local):
            return
        if self.fs.exists(self.url.join(RUN_RECORD).path) or complete_steps(self.fs, self.url):
            return
        aside = self.local.with_name(f"{self.local.name}.set-aside-{time.strftime('%Y%m%dT%H%M%S')}")
        os.replace(self.local, aside)
        self.say(
            f"store: {self.url} holds no run (deleted there?): this machine's old copy of it is set aside in the "
            f"cache, not resumed from; the run starts fresh"
        )

    def _catch_up(self) -> None:
        """What an earlier session on this machine could not upload goes up first: every step its
        status.json names as not in the store (the checkpoint before a decay too, not only the newest),
        final/ when it is named, and a local checkpoint newer than the store's."""
        named = read_status(self.local).get(STORE_SECTION, {}).get(NOT_IN_STORE) or []
        in_store = set(complete_steps(self.fs, self.url))
        self.uploader.progress.last_step = max(in_store, default=None)
        local = {c.step: c.path for c in list_checkpoints(self.local)}
        newest = max(local, default=None)
        wanted = {step for step in named if isinstance(step, int)}
        if newest is not None and newest > max(in_store, default=-1):
            wanted.add(newest)
        for step in sorted(wanted & set(local) - in_store):
            self.say(f"store: step {step} is not in {self.url} yet: uploading it first")
            self.uploader.submit(local[step], step, keep=True)
        if FINAL in named and RunDir(self.local).final.is_dir():
            self.say(f"store: final/ is not in {self.url} yet: uploading it first")
            self._final = True

    def session_started(self) -> None:
        """The session's fresh status.json gets this session's `store` section, here and in the store."""
        try:
            self._changed(mirror=True)
        except Exception as exc:
            self.uploader._error(exc, "writing status.json")

    # ------------------------------------------------------------------ the Callback protocol
    def on_checkpoint_saved(self, path: Path, step: int) -> None:
        self.uploader.submit(path, step)

    def on_train_end(self, run: RunDir) -> None:
        self._final = True  # final/ is written by the side jobs: sent once they are done (`wait`)

    def wait(self) -> None:
        """The uploads finished (final/ too, at the run's end), or `store_wait_s` passed (said, in the
        log and status.json). A machine that lost the lease waits for nothing: the run is another's."""
        p, started = self.uploader.progress, time.monotonic()
        if self.lease.lost_to is not None:
            return
        if not self.uploader.idle():
            with LiveLine(f"uploading to {self.url}", p.count, self.say, self._activity):
                done = self.uploader.wait(self.store.store_wait_s)
            if self.lease.lost_to is not None:  # taken over while this machine waited: the run is another's
                return
            if not done:  # what is missing is said once, by the run's last line (train.py), not here too
                self.say(f"store: stopped waiting for the uploads after store_wait_s ({self.store.store_wait_s:g} s)")
                return
        final = RunDir(self.local).final
        if self._final and final.is_dir():
            deadline = started + self.store.store_wait_s
            files = sorted(f for f in final.rglob("*") if f.is_file())
            pairs = [(f, self.url.join("final", str(f.relative_to(final))).path) for f in files]
            count = ByteCount(sum(f.stat().st_size for f in files))
            with LiveLine(f"uploading final/ to {self.url}", count, self.say, self._activity):
                # through the uploader's file system: each file only while this machine holds the lease
                keep_trying = lambda: time.monotonic() < deadline and self.lease.lost_to is None  # noqa: E731
                sent = put_files(self.uploader.fs, pairs, count, keep_trying, self._final_error)
            if sent:
                self._final = False
                self.say(f"final/: in {self.url}/final")
            else:
                self.say(f"warning: final/ did not reach {self.url}; the same command rerun uploads it first")

    def _final_error(self, exc: BaseException) -> None:
        self.uploader._error(exc, "uploading final/")

    # ------------------------------------------------------------------ the end
    def not_in_store(self) -> list[int | str]:
        """The steps of this session not complete in the store, and `final` when final/ is not there."""
        return [*self.uploader.missing(), *([FINAL] if self._final else [])]

    def lost_the_run(self) -> bool:
        """Another machine took the run's lease over: what this one did not upload is not its to upload."""
        return self.lease.lost_to is not None

    def halt(self) -> str | None:
        """Why training must stop now (the loop asks each step, `Callback.halt`): another machine holds the
        run, so every step more here is work no one keeps; None while the lease is this machine's."""
        lost = self.lease.lost_to
        if lost is None:
            return None
        who = (
            f"another machine holds it now: {lost.describe()}"
            if lost.run_id
            else "its lease left the store meanwhile (another machine took the run over and ended it)"
        )
        return (
            f"this machine lost the run {self.url}: {who}. Its last renewal of the lease was "
            f"{self.lease.unrenewed_s():.0f} s ago (the store did not answer in time); it wrote nothing to the "
            f"store since, and its newer steps stay here unused. `hf-pretrain status {self.url}` shows where the "
            f"run stands"
        )

    def behind(self) -> str | None:
        """None when the store has every checkpoint of this session (and final/), else what is missing."""
        missing = self.not_in_store()
        if not missing:
            return None
        s = self.uploader.status()
        error = f" (last error: {s['last_error']})" if s["last_error"] else ""
        named = ", ".join(f"step {m}" if isinstance(m, int) else f"{m}/" for m in missing)
        if self.lost_the_run():  # the run is the other machine's: a rerun here would fight it
            return (
                f"{BEHIND}{self.url}: {named}, which stay on this machine unused: the run is "
                f"{self.lease.lost_to.host}'s now (it took the lease over); `hf-pretrain status {self.url}` "
                f"shows where it stands"
            )
        return (
            f"{BEHIND}{self.url}: {named} ({human_bytes(s['bytes_behind'])}){error}; they stay on this "
            f"machine, and the same command rerun here uploads them first"
        )

    def standing(self) -> str:
        """Where the store stands at the end, in one line."""
        last = self.uploader.progress.last_step
        where = (
            f"step {last} is the newest checkpoint in {self.url}"
            if last is not None
            else f"{self.url} holds no checkpoint"
        )
        return f"store: {where}" + ("" if self.not_in_store() else "; nothing of this session is missing there")

    def close(self) -> None:
        """Stop the threads, mirror the records and status.json a last time, release the lease: at most
        `CLOSE_S` in all. Every store call here runs on a daemon thread: a store gone silent at the very
        end leaves the lease to go stale on its own, and the process exits (nothing joins a blocked call)."""
        self._stop.set()
        deadline = time.monotonic() + CLOSE_S
        if self._ticker is not None:
            self._ticker.join(timeout=max(0.0, deadline - time.monotonic()))
        self.uploader.close(timeout=max(0.0, deadline - time.monotonic()))
        self._write_section()
        if self.lease.lost_to is not None:
            return  # another machine holds the run: its records in the store are not this one's to write
        last = threading.Thread(target=self._last_writes, name="hf-pretrain-store-close", daemon=True)
        last.start()
        last.join(timeout=max(1.0, deadline - time.monotonic()))
        if last.is_alive():  # the last line of the run: what is not in the store, first
            behind = self.behind() or "the newest records may be missing there"
            self.say(
                f"warning: {behind} (the store did not answer in {CLOSE_S:.0f} s at the end: the lease goes stale on its own)"
            )

    def _last_writes(self) -> None:
        try:
            if self.uploader.idle():
                self.uploader.push_small_files()
                self._clear_answered_stop()
            self.lease.release()
        except Exception as exc:  # the store gone at the very end: the lease goes stale on its own
            self.say(f"warning: {describe_failure(self.url, exc, 'releasing the lease')}")

    # ------------------------------------------------------------------ the thread beside training
    def _tick(self) -> None:
        heartbeat_s = self.store.store_heartbeat_s
        next_beat = time.monotonic() + heartbeat_s
        # a heartbeat shorter than the stop poll is kept: beats further apart than it run the lease out
        while not self._stop.wait(min(STOP_POLL_S, heartbeat_s)):
            try:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + heartbeat_s
                    if not self._heartbeat():
                        return  # nothing more of this machine goes to the store: not status.json either
                self._mirror_stop_request()
            except Exception as exc:  # the store unreachable: said in status.json, tried again
                self.uploader._error(exc, "renewing the lease")
            self._say_expiry()

    def _watch_lease(self) -> None:
        while not self._stop.wait(min(1.0, self.store.store_heartbeat_s / 2)):
            if self.lease.lost_to is not None:
                return
            self._say_expiry()

    def _say_expiry(self) -> None:
        """The lease ran out (said once, in the log and status.json: nothing goes to the store now), or was
        renewed after it did (said: the writes go on)."""
        with self._status_lock:  # two threads ask: said once
            expired = self.lease.expired() and self.lease.lost_to is None
            if expired == self._expired_said:
                return
            self._expired_said = expired
        if expired:
            self.say(
                f"warning: the lease of {self.url} was not renewed for {self.lease.unrenewed_s():.0f} s (the store "
                f"does not answer): this machine writes nothing to the store until it is, and another machine may "
                f"take the run over"
            )
        else:
            self.say(f"store: the lease of {self.url} is renewed: the writes to the store go on")
        self._write_section()

    def _heartbeat(self) -> bool:
        """Renew the lease and mirror the records; False once another machine took the lease over (then
        this one writes nothing more to the store: its uploads stop, status.json there is the other's)."""
        self.lease.beat()
        if self.lease.lost_to is not None:
            self.say(
                f"warning: the lease of {self.url} is not this machine's any more: it is held by "
                f"{self.lease.lost_to.describe()}; this one stops writing the store and training"
            )
            self.uploader.lease_lost()
            self._write_section()
            return False
        self._changed()
        self.uploader.push_small_files(retry=False)  # status.json and the records, each heartbeat
        return True

    def _mirror_stop_request(self) -> None:
        """A request `hf-pretrain stop URL` wrote into the store, copied where the guards read it."""
        run = RunDir(self.local)
        remote = self.url.join(run.stop_request.name).path
        try:
            theirs = json.loads(self.fs.cat_file(remote))
        except FileNotFoundError:
            return
        except ValueError:
            theirs = {"cooldown_steps": None, "requested_at_epoch": time.time()}
        try:
            ours = json.loads(run.stop_request.read_text())
        except (OSError, ValueError):
            ours = {}
        if theirs.get("requested_at_epoch") != ours.get("requested_at_epoch"):
            tmp = run.stop_request.with_name(run.stop_request.name + ".store.tmp")
            tmp.write_text(json.dumps(theirs))
            os.replace(tmp, run.stop_request)
            self.say(f"store: a stop request for {self.url} arrived")

    def _clear_answered_stop(self) -> None:
        """A finished run cleared its stop request locally: the store's copy goes too."""
        run = RunDir(self.local)
        remote = self.url.join(run.stop_request.name).path
        if not run.stop_request.exists() and read_status(self.local).get("state") == "finished":
            if self.fs.exists(remote):
                self.uploader.fs.rm_file(remote)  # only while this machine holds the lease

    def _activity(self, what: str | None) -> None:
        set_activity(self.local, what)

    def _changed(self, mirror: bool = False) -> None:
        self._write_section()
        if mirror and self.lease.may_write() and RunDir(self.local).status.is_file():
            status = RunDir(self.local).status
            sent = self.uploader.in_store_terms(status)
            try:
                self.uploader.fs.put_file(str(sent), self.url.join("status.json").path)
            finally:
                if sent != status:
                    sent.unlink(missing_ok=True)

    def _write_section(self) -> None:
        """status.json's `store` section, beside what the session wrote (the session keeps it), under the
        lock every writer of status.json takes (run_dir.update_status)."""
        section = json.loads(redact(json.dumps(self.section())))

        def change(status: dict) -> dict | None:
            return {**status, STORE_SECTION: section} if status else None

        update_status(self.local, change)

    def section(self) -> dict:
        """The `store` section: the uploader's progress, what is not in the store, the lease's holder."""
        lost = self.lease.lost_to
        if lost is not None:
            lease = "lost to " + lost.describe()
        elif self.lease.expired():  # the test of a lost lease waits for this word (tests/test_run_in_store.py)
            lease = f"run out: not renewed for {self.lease.unrenewed_s():.0f} s; nothing is written to the store"
        else:
            lease = "held"
        return {**self.uploader.status(), NOT_IN_STORE: self.not_in_store(), "lease": lease}
