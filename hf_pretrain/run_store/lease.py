"""One run, one writer, anywhere: a lease object in the store that the training machine renews.

`lease.json` under the run's URL names its holder (host, pid, run id, since when) and the time of its
last heartbeat, renewed every `store_heartbeat_s` by the uploader's thread. A second machine started
on the same URL is refused in one line naming the holder (`LeaseHeld`, exit 73, as a locked local
folder). A lease whose heartbeat is older than `STALE_BEATS` heartbeats is a holder that died (a lost
spot instance) and is taken over; so is one held by a process of this host that is gone (a SIGKILL).

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
from hf_pretrain.object_store.urls import StoreURL
from hf_pretrain.run_folder.run_lock import RunLocked

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

LEASE = "lease.json"
STALE_BEATS = 3  # heartbeats missed before a lease counts as its holder's death


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

    def describe(self) -> str:
        return f"{self.host} (pid {self.pid}, since {self.since}, last heartbeat {human_duration(self.age_s())} ago)"


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
            return f"took over the lease of {self.url} from {current.describe()}: its holder is gone"
        return None

    def beat(self) -> None:
        """Renew the lease (a network failure raises, to be retried at the next beat); a lease that
        another machine took over meanwhile is not overwritten: `lost_to` names it."""
        if self.lost_to is not None:
            return
        try:
            self._write(self.etag)
        except LeaseConflict:
            self.lost_to, _ = self.read()

    def release(self) -> None:
        """Remove the lease, if it is still this run's: nothing else is touched."""
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
        body = (json.dumps(self._record(), indent=1) + "\n").encode()
        if self.url.scheme == "s3":
            condition = {"IfMatch": if_match} if if_match else {"IfNoneMatch": "*"}
            bucket, _, key = self.path.partition("/")
            try:
                answer = self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=body, **condition)
            except OSError as exc:
                if _precondition_failed(exc):
                    raise LeaseConflict(str(exc)) from None
                raise
            self.etag = answer.get("ETag")
            return
        self.fs.pipe_file(self.path, body)  # no conditional write: write, then read back
        holder, self.etag = self.read()
        if holder is None or holder.run_id != self.run_id:
            raise LeaseConflict("the lease read back names another run")

    def _refusal(self, holder: Holder | None) -> str:
        who = holder.describe() if holder else "another machine"
        stale = STALE_BEATS * self.heartbeat_s
        return (
            f"refused: {self.url} is trained by {who}; one machine writes a run. Stop it first "
            f"(`hf-pretrain stop {self.url}`), or, if it is gone, rerun after its lease goes stale "
            f"({human_duration(stale)} without a heartbeat)"
        )
