"""Files between a local folder and the store: in parallel, counted, retried with back-off.

s3fs sends a large file in parts (multipart, 50 MiB each) and a small one in one request; several
files go at once on a few threads. Bytes are counted into a `ByteCount` as they go, so a live line
(checkpoints/progress.py) can show a wait. Nothing here hashes: a checkpoint's checksums were computed
as it was written, and its manifest carries them (the download side verifies against it).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from fsspec.callbacks import Callback

from hf_pretrain.checkpoints.progress import ByteCount

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

PARALLEL_FILES = 4
FIRST_RETRY_S, LONGEST_RETRY_S = 1.0, 60.0  # exponential back-off between tries


class _Counted(Callback):
    """fsspec's progress callback, into a `ByteCount`; a retried file takes back what it had counted."""

    def __init__(self, count: ByteCount | None):
        super().__init__()
        self.count, self.moved = count, 0

    def relative_update(self, inc: int = 1) -> None:
        self.moved += inc
        if self.count is not None:
            self.count.add(inc)

    def undo(self) -> None:
        if self.count is not None:
            self.count.add(-self.moved)
        self.moved = 0


def with_retries(
    attempt: Callable[[], None],
    keep_trying: Callable[[], bool],
    on_error: Callable[[BaseException], None],
    first_s: float = FIRST_RETRY_S,
) -> bool:
    """Call `attempt` until it succeeds (True) or `keep_trying()` says stop (False); each failure goes to
    `on_error` and the wait before the next try doubles, up to `LONGEST_RETRY_S`."""
    wait = first_s
    while True:
        try:
            attempt()
            return True
        except Exception as exc:  # the store's client raises many kinds; each is a reason to try again
            on_error(exc)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not keep_trying():
                return False
            time.sleep(min(0.2, wait))
        wait = min(wait * 2, LONGEST_RETRY_S)


def put_files(
    fs: AbstractFileSystem,
    pairs: Iterable[tuple[Path, str]],
    count: ByteCount | None = None,
    keep_trying: Callable[[], bool] = lambda: True,
    on_error: Callable[[BaseException], None] = lambda _: None,
) -> bool:
    """Upload each (local file, store path), several at a time, each retried; True once all are there."""
    return _each(
        lambda lpath, rpath, cb: fs.put_file(str(lpath), rpath, callback=cb),
        pairs,
        count,
        keep_trying,
        on_error,
        abandon=lambda: not keep_trying(),
    )


def get_files(
    fs: AbstractFileSystem,
    pairs: Iterable[tuple[str, Path]],
    count: ByteCount | None = None,
    keep_trying: Callable[[], bool] = lambda: False,
    on_error: Callable[[BaseException], None] = lambda _: None,
) -> bool:
    """Download each (store path, local file), several at a time; by default one try each."""

    def get(rpath: str, lpath: Path, cb: _Counted) -> None:
        lpath.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(rpath, str(lpath), callback=cb)

    return _each(get, pairs, count, keep_trying, on_error)


def _each(move, pairs, count, keep_trying, on_error, abandon: Callable[[], bool] = lambda: False) -> bool:
    """Each pair moved on `PARALLEL_FILES` daemon threads; False as soon as one failed for good, or when
    `abandon()` says the caller's deadline passed. The threads are daemons, not a ThreadPoolExecutor's:
    the interpreter's shutdown joins an executor's workers, and one blocked in a request to a store that
    went silent kept a finished run's process alive for good (its own timeouts end it later, unseen)."""
    work: queue.SimpleQueue = queue.SimpleQueue()
    pairs = list(pairs)
    for pair in pairs:
        work.put(pair)
    results: list[bool] = []

    def worker() -> None:
        while True:
            try:
                pair = work.get_nowait()
            except queue.Empty:
                return
            cb = _Counted(count)

            def attempt(pair=pair, cb=cb) -> None:
                cb.undo()
                move(*pair, cb)

            results.append(with_retries(attempt, keep_trying, on_error))

    threads = [
        threading.Thread(target=worker, name="hf-pretrain-transfer", daemon=True)
        for _ in range(min(PARALLEL_FILES, len(pairs)))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.2)
            if abandon():  # the caller's deadline: the threads are left to their client's timeouts
                return False
    return len(results) == len(pairs) and all(results)
