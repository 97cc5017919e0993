"""One run, one writer, anywhere: a lease object in the store that the training machine renews.

`lease.json` under the run's URL names its holder (host, pid, run id, since when) and the time of its
last heartbeat, renewed every `store_heartbeat_s` by the uploader's thread. A second machine started
on the same URL is refused in one line naming the holder (`LeaseHeld`, exit 73, as a locked local
folder). A lease whose heartbeat is older than `STALE_BEATS` heartbeats is a holder that died (a lost
spot instance, or one cut off from the store) and is taken over; so is one held by a process of this host
that is gone (a SIGKILL).

The holder's side of the same clock: a holder whose last renewal is older than `STALE_BEATS - MARGIN_BEATS`
heartbeats (`expired`) may be taken over any moment, so it writes nothing more to the store (`may_write`,
which the uploader and the records consult before each write) until a renewal proves the lease is still
its own: a conditional write on the lease as it last wrote it, which fails once another machine wrote
it. A lease another machine took over, or one gone from the store after this holder's ran out (taken,
trained and released meanwhile), is lost (`lost_to`) for good: the run is the other machine's.

On S3 every write of the lease is conditional, so two machines can never both win: the first one
with `If-None-Match: *`, a takeover and each heartbeat with `If-Match: <etag>` of the lease read
(S3, R2 and MinIO honour both; moto too). Stores without conditional writes (gs://, hf:// through
fsspec) write, then read back and check the run id: a race of two starts within the same second
can still let both through there, which docs/moving-runs.md says.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hf_pretrain.formatting import human_duration
from hf_pretrain.run_folder.run_lock import RunLocked
from hf_pretrain.store.schemes import scheme_named
from hf_pretrain.store.urls import StoreURL

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

LEASE = "lease.json"
STALE_BEATS = 3  # heartbeats missed before a lease counts as its holder's death
# The holder stops writing this many heartbeats before another machine may take over: what it had in
# flight then (a part of a checkpoint, status.json) lands before the lease can change hands, and the
# two machines' clocks may differ by that much.
MARGIN_BEATS = 1


class LeaseHeld(RunLocked):
    """Another machine trains this run URL (exit 73): one line naming it."""


class LeaseConflict(RuntimeError):
    """A conditional write lost: someone else wrote the lease since it was read."""


@dataclass
class Holder:
    host: str
    pid: int
    run_id: str
    since: str
    heartbeat: float  # seconds since the epoch, of the holder's last renewal
    heartbeat_s: float

    def age_s(self) -> float:
        return max(0.0, time.time() - self.heartbeat)

    def is_stale(self) -> bool:
        """Its holder stopped renewing it (`STALE_BEATS` heartbeats), or is a process of this host that is gone."""
        if self.age_s() > STALE_BEATS * self.heartbeat_s:
            return True
        return self.host == socket.gethostname() and not _alive(self.pid)

    def stale_reason(self) -> str:
        """Why `is_stale`, in words: its heartbeat is old (a holder lost, or only cut off from the store:
        this side cannot tell), or its process on this host is gone."""
        if self.age_s() > STALE_BEATS * self.heartbeat_s:
            return (
                f"its last heartbeat is older than the lease ({human_duration(self.age_s())} ago, the lease "
                f"{human_duration(STALE_BEATS * self.heartbeat_s)}: {STALE_BEATS} heartbeats of "
                f"{human_duration(self.heartbeat_s)})"
            )
        return f"its process (pid {self.pid}) on this host is gone"

    def describe(self) -> str:
        if not self.run_id:  # `GONE`: no holder to name
            return "no one now (the lease was released or removed after this machine's ran out)"
        return f"{self.host} (pid {self.pid}, since {self.since}, last heartbeat {human_duration(self.age_s())} ago)"


def gone(heartbeat_s: float) -> Holder:
    """What `lost_to` holds when the lease left the store while this holder's had run out: another machine
    may have taken it, trained and released it meanwhile, so it is not this one's to recreate."""
    return Holder("", 0, "", "", time.time(), heartbeat_s)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _precondition_failed(exc: BaseException) -> bool:
    """s3fs turns S3's 412 into FileExistsError (If-None-Match) or a plain OSError (If-Match)."""
    text = f"{exc} {exc.__cause__ or ''} {exc.__context__ or ''}"
    return isinstance(exc, FileExistsError) or "PreconditionFailed" in text or "pre-condition" in text


class Lease:
    """`acquire()` at the start (or `LeaseHeld`), `beat()` every `heartbeat_s`, `release()` at the end."""

    def __init__(self, fs: AbstractFileSystem, url: StoreURL, heartbeat_s: float):
        self.fs, self.url, self.heartbeat_s = fs, url, heartbeat_s
        self.path = url.join(LEASE).path
        self.run_id = uuid.uuid4().hex[:12]
        self.since = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.etag: str | None = None
        self.lost_to: Holder | None = None  # set when another machine took the lease over
        self.renewed: float | None = None  # time.monotonic() when the last write of the lease that landed was made

    def acquire(self) -> str | None:
        """Hold the lease; a note when it was taken over from a holder that died, else None."""
        current, etag = self.read()
        if current is not None and not current.is_stale():
            raise LeaseHeld(self._refusal(current))
        try:
            self._write(etag if current is not None else None)
        except LeaseConflict:  # another machine started in the same moment and won
            winner, _ = self.read()
            raise LeaseHeld(self._refusal(winner)) from None
        if current is not None:
            return f"took over the lease of {self.url} from {current.describe()}: {current.stale_reason()}"
        return None

    def expired(self) -> bool:
        """This holder's last renewal is older than the lease less `MARGIN_BEATS` heartbeats: another machine
        may take the run over soon, so nothing more is written to the store until a renewal lands."""
        if self.renewed is None:
            return False
        return time.monotonic() - self.renewed > (STALE_BEATS - MARGIN_BEATS) * self.heartbeat_s

    def unrenewed_s(self) -> float:
        """Seconds since the last renewal that landed."""
        return 0.0 if self.renewed is None else time.monotonic() - self.renewed

    def may_write(self) -> bool:
        """Whether this machine may write the run's objects now: the lease is its own and not run out."""
        return self.lost_to is None and not self.expired()

    def beat(self) -> None:
        """Renew the lease (a network failure raises, to be retried at the next beat). A lease another
        machine wrote meanwhile is not overwritten, nor one gone from the store after this one's ran out:
        `lost_to` says so, for good."""
        if self.lost_to is not None:
            return
        if self.expired():  # another machine may have taken it over: renewed only if the store proves it did not
            holder, etag = self.read()
            if holder is None or holder.run_id != self.run_id:
                self.lost_to = holder or gone(self.heartbeat_s)
                return
            self.etag = etag  # still this run's (a taker writes its own id); the write below is conditional on it
        try:
            self._write(self.etag)
        except FileNotFoundError:  # S3's answer to If-Match on a key that is gone: removed by hand while held
            try:
                self._write(None)  # only where no one created it since (If-None-Match)
            except LeaseConflict:
                self.lost_to = self.read()[0] or gone(self.heartbeat_s)
        except LeaseConflict:
            holder, etag = self.read()
            if holder is not None and holder.run_id == self.run_id:
                self.etag = etag  # this run's renewal landed, its answer was lost (a cut): renewed next beat
                return
            self.lost_to = holder or gone(self.heartbeat_s)

    def release(self) -> None:
        """Remove the lease, if it is still this run's: nothing else is touched. One run out or lost is left
        to go stale: another machine may be taking it over right now, and its lease would go."""
        if not self.may_write():
            return
        current, etag = self.read()
        if current is not None and current.run_id == self.run_id:
            self.fs.rm_file(self.path)

    def read(self) -> tuple[Holder | None, str | None]:
        try:
            info = self.fs.info(self.path)
            record = json.loads(self.fs.cat_file(self.path))
        except FileNotFoundError:
            return None, None
        try:
            holder = Holder(**{k: record[k] for k in Holder.__dataclass_fields__})
        except (KeyError, TypeError):  # an unreadable lease: its writer died mid-write; stale
            holder = Holder("?", 0, "?", "?", 0.0, self.heartbeat_s)
        return holder, info.get("ETag")

    def _record(self) -> dict[str, Any]:
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "run_id": self.run_id,
            "since": self.since,
            "heartbeat": time.time(),
            "heartbeat_s": self.heartbeat_s,
        }

    def _write(self, if_match: str | None) -> None:
        made = time.monotonic()  # the record's heartbeat: another machine counts the lease's age from it
        body = (json.dumps(self._record(), indent=1) + "\n").encode()
        put_if = scheme_named(self.url.scheme).conditional_put  # S3's If-Match / If-None-Match, where it has one
        if put_if is not None:
            try:
                etag = put_if(self.fs, self.path, body, if_match)
            except OSError as exc:
                if _precondition_failed(exc):
                    raise LeaseConflict(str(exc)) from None
                raise
            self.etag, self.renewed = etag, made
            return
        self.fs.pipe_file(self.path, body)  # no conditional write: write, then read back
        holder, self.etag = self.read()
        if holder is None or holder.run_id != self.run_id:
            raise LeaseConflict("the lease read back names another run")
        self.renewed = made

    def _refusal(self, holder: Holder | None) -> str:
        who = holder.describe() if holder else "another machine"
        stale = STALE_BEATS * self.heartbeat_s
        return (
            f"refused: {self.url} is trained by {who}; one machine writes a run. Stop it first "
            f"(`hf-pretrain stop {self.url}`), or, if it is gone, rerun after its lease goes stale "
            f"({human_duration(stale)} without a heartbeat)"
        )
