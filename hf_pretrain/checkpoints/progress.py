"""One live line for a wait over bytes (a save, a flush, a verification): what is written or checked,
bytes of total, rate, elapsed. A tqdm bar on a terminal, a plain line every few seconds in a log.

The work counts its bytes into a `ByteCount` (from any thread); whoever waits for it shows the count
with a `LiveLine`, which polls it on a thread of its own. A wait shorter than `QUIET_S` says nothing
(the small checkpoints of tests and smoke runs), and `activity` (status.json's `activity` field:
`saving`, `verifying`) is set only once the line shows and cleared when it closes.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

from hf_pretrain.formatting import human_bytes

Say = Callable[[str], None] | None  # where a live line goes (the main process's log), None: nowhere
Activity = Callable[[str | None], None] | None  # status.json's `activity` while a wait shows

QUIET_S = 2.0  # a wait shorter than this shows nothing
POLL_S = 0.5  # how often the bar is redrawn
PLAIN_EVERY_S = 5.0  # how often a log gets a line


class ByteCount:
    """Bytes done of a total, added to by the thread that does the work."""

    def __init__(self, total: int = 0):
        self.total, self.done = total, 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n

    def grow(self, n: int) -> None:
        """More work than first counted (files found on the way)."""
        with self._lock:
            self.total += n


class FolderBytes(ByteCount):
    """The bytes of the files under the folders that match `pattern` in `parent`: the progress of a
    writer that counts nothing itself (`save_pretrained` building final/)."""

    def __init__(self, parent: Path, pattern: str, total: int = 0):
        self.parent, self.pattern, self._most = parent, pattern, 0
        super().__init__(total)

    @property
    def done(self) -> int:
        """The most counted so far: the folder is renamed away when complete."""
        try:
            now = sum(f.stat().st_size for d in self.parent.glob(self.pattern) for f in d.rglob("*") if f.is_file())
        except OSError:  # a file renamed or removed while counted
            now = 0
        self._most = max(self._most, now)
        return self._most

    @done.setter
    def done(self, _value: int) -> None:
        pass


class LiveLine:
    """`with LiveLine("saving step_00000006", count, say=print): ...wait...` shows the count while
    the block runs, from `QUIET_S` on; `say` None shows nothing (the processes that are not the first)."""

    def __init__(
        self,
        what: str,
        count: ByteCount,
        say: Say = print,
        activity: Activity = None,
        screen: TextIO | None = None,
        quiet_s: float | None = None,
    ):
        self.what, self.count, self.say, self.activity = what, count, say, activity
        self.screen = screen or sys.stderr
        self.quiet_s = QUIET_S if quiet_s is None else quiet_s
        self.started = time.monotonic()
        self.shown = False
        self.bar: tqdm | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name=f"progress {what}", daemon=True)

    def __enter__(self) -> LiveLine:
        if self.say is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.bar is not None:
            self.bar.update(self.count.done - self.bar.n)
            self.bar.close()
        if self.shown:
            if exc[0] is None and self.say is not None:
                self.say(self.line(done=True))
            if self.activity is not None:
                self.activity(None)

    def _poll(self) -> None:
        printed = 0.0  # the first line as soon as the wait shows
        while not self._stop.wait(POLL_S):
            if time.monotonic() - self.started < self.quiet_s:
                continue
            if not self.shown:
                self.shown = True
                if self.activity is not None:
                    self.activity(self.what)
                if self._terminal():
                    self.bar = tqdm(
                        total=self.count.total or None,
                        desc=self.what,
                        unit="B",
                        unit_scale=True,
                        unit_divisor=1000,
                        dynamic_ncols=True,
                        file=self.screen,
                        mininterval=POLL_S,
                    )
            if self.bar is not None:  # a total first estimated too low grows with the bytes done
                self.bar.total = max(self.count.total, self.count.done) or None
                self.bar.update(self.count.done - self.bar.n)
            elif time.monotonic() - printed >= PLAIN_EVERY_S:  # read here: a test shortens it
                printed = time.monotonic()
                self.say(self.line())

    def _terminal(self) -> bool:
        try:
            return self.screen.isatty()
        except (AttributeError, ValueError):
            return False

    def line(self, done: bool = False) -> str:
        """`saving step_00000006: 3.2 GB of 12.5 GB, 1.1 GB/s, 3 s`, or at the end `... 12.5 GB in 11 s`."""
        seconds = time.monotonic() - self.started
        rate = f"{human_bytes(self.count.done / seconds)}/s" if seconds > 0 else "-"
        if done:
            return f"{self.what}: {human_bytes(self.count.done)} in {seconds:.0f} s ({rate})"
        # a total that was an estimate, overtaken (final/ holds its card and plots beside the weights), says nothing
        of = f" of {human_bytes(self.count.total)}" if self.count.total > self.count.done else ""
        return f"{self.what}: {human_bytes(self.count.done)}{of}, {rate}, {seconds:.0f} s"
