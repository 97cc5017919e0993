"""What the datatrove tasks of a source have done so far, written by each task and read live by
`prepare`: the one progress line a person sees per source (a tqdm bar on a terminal, a plain line
once a minute in a log).

A task (in this process, a local worker, or a Slurm job) writes `logs/<source>/counts/<rank>.json`
(documents, tokens, input bytes read, its CPU seconds) at most once a second and when it ends: a few bytes, never in
the tokenizer's way. `prepare` sums them, with datatrove's own record of the finished tasks
(`logs/<source>/completions/`), from a thread of its own that reads only the files that changed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tqdm.auto import tqdm

from hf_pretrain.run_folder.json_files import write_json_atomically

COUNTS_DIR = "counts"  # in logs/<source>/, beside datatrove's completions/
WRITE_INTERVAL_S = 1.0  # a task's counts file is rewritten at most this often
POLL_INTERVAL_S = 0.5  # prepare reads the counts this often
PLAIN_INTERVAL_S = 60.0  # not a terminal (a log file, a pipe): one plain line this often, no bar
DEFAULT_COLUMNS = 120  # a terminal that says it has no width (some pseudo-terminals)


# ---------------------------------------------------------------------- the task's side
class TaskCounts:
    """One task's running totals, in `logs/<source>/counts/<rank>.json` (written whole, then renamed)."""

    def __init__(self, logs_dir: str | Path, rank: int):
        self.path = Path(logs_dir) / COUNTS_DIR / f"{rank:05d}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.documents = self.tokens = self.input_bytes = 0
        self.written_at = float("-inf")
        self.cpu_start = time.process_time()  # a task runs alone in its process: its CPU time, for the benchmark

    def add(self, documents: int, tokens: int, input_bytes: int) -> None:
        """`documents` and `tokens` more; `input_bytes`: of the task's input read so far (0: not known)."""
        self.documents += documents
        self.tokens += tokens
        self.input_bytes = max(self.input_bytes, input_bytes)
        if time.monotonic() - self.written_at >= WRITE_INTERVAL_S:
            self.write()

    def write(self) -> None:
        counts = {
            "documents": self.documents,
            "tokens": self.tokens,
            "input_bytes": self.input_bytes,
            "cpu_s": round(time.process_time() - self.cpu_start, 3),
        }
        write_json_atomically(self.path, counts, indent=None)
        self.written_at = time.monotonic()


# ---------------------------------------------------------------------- prepare's side
@dataclass
class Totals:
    tasks_done: int = 0
    documents: int = 0
    tokens: int = 0
    input_bytes: int = 0


def completed_ranks(logs_dir: Path) -> set[int]:
    """The tasks datatrove recorded as finished (`completions/<rank>`)."""
    folder = logs_dir / "completions"
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.is_dir() else set()


class CountsReader:
    """The sum of a source's task counts; a file is parsed again only when it changed."""

    def __init__(self, logs_dir: Path, task_bytes: list[int] | None):
        self.logs_dir, self.task_bytes = logs_dir, task_bytes
        self.seen: dict[str, tuple[int, dict[str, int]]] = {}

    def forget_unfinished(self) -> None:
        """Remove the counts of tasks that are not finished: they run again from their start (a killed
        run's counts would be counted twice)."""
        done = completed_ranks(self.logs_dir)
        for path in (self.logs_dir / COUNTS_DIR).glob("*.json"):
            if path.stem.isdigit() and int(path.stem) not in done:
                path.unlink(missing_ok=True)

    def totals(self) -> Totals:
        done = completed_ranks(self.logs_dir)
        totals = Totals(tasks_done=len(done))
        try:
            entries = list(os.scandir(self.logs_dir / COUNTS_DIR))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            if not (entry.name.endswith(".json") and entry.name[:-5].isdigit()):
                continue
            try:
                stamp = entry.stat().st_mtime_ns
                if self.seen.get(entry.name, (None,))[0] != stamp:
                    self.seen[entry.name] = (stamp, json.loads(Path(entry.path).read_text()))
            except (OSError, ValueError):
                continue  # replaced or removed while read: the next poll reads it
            counts, rank = self.seen[entry.name][1], int(entry.name[:-5])
            totals.documents += counts.get("documents", 0)
            totals.tokens += counts.get("tokens", 0)
            finished = self.task_bytes[rank] if self.task_bytes and rank in done and rank < len(self.task_bytes) else 0
            totals.input_bytes += max(counts.get("input_bytes", 0), finished)
        return totals


def estimated_tokens(totals: Totals, total_bytes: int, token_cap: int) -> int | None:
    """All the tokens the source will have once every task is done, estimated from the share of its
    input read so far (and never past a `max_tokens` cap); None while nothing says."""
    estimates = []
    if total_bytes and totals.input_bytes and totals.tokens:
        estimates.append(round(totals.tokens * total_bytes / min(totals.input_bytes, total_bytes)))
    if token_cap:
        estimates.append(token_cap)
    return max(min(estimates), totals.tokens) if estimates else None


class SourceProgress:
    """The live line of one source while its tasks run: tokens (of an estimated total, so a percentage
    and an ETA where the input's size is known), the rate, tasks done of N, documents."""

    def __init__(
        self,
        name: str,
        logs_dir: Path,
        tasks: int,
        screen: TextIO,
        task_bytes: list[int] | None = None,
        token_cap: int = 0,
    ):
        self.name, self.tasks, self.screen, self.token_cap = name, tasks, screen, token_cap
        self.total_bytes = sum(task_bytes) if task_bytes else 0
        self.reader = CountsReader(logs_dir, task_bytes)
        self.reader.forget_unfinished()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, name=f"progress {name}", daemon=True)
        self.terminal = screen.isatty()
        self.bar: tqdm | None = None

    def __enter__(self) -> SourceProgress:
        start = self.reader.totals()
        if self.terminal:
            try:
                width = os.get_terminal_size(self.screen.fileno()).columns
            except (OSError, ValueError):
                width = 0
            self.bar = tqdm(
                total=estimated_tokens(start, self.total_bytes, self.token_cap),
                initial=start.tokens,
                desc=self.name,
                unit=" tokens",
                unit_scale=True,
                dynamic_ncols=bool(width),
                ncols=None if width else DEFAULT_COLUMNS,
                file=self.screen,
                mininterval=POLL_INTERVAL_S,
            )
        self.started, self.start = time.monotonic(), start
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self._show(self.reader.totals())
        if self.bar is not None:
            self.bar.close()

    def _poll(self) -> None:
        printed = time.monotonic()
        while not self.stop.wait(POLL_INTERVAL_S):
            totals = self.reader.totals()
            if self.bar is not None:
                self._show(totals)
            elif time.monotonic() - printed >= PLAIN_INTERVAL_S:
                printed = time.monotonic()
                print(self.plain_line(totals), file=self.screen, flush=True)

    def _show(self, totals: Totals) -> None:
        if self.bar is None:
            return
        self.bar.total = estimated_tokens(totals, self.total_bytes, self.token_cap)
        self.bar.set_postfix_str(
            f"tasks {totals.tasks_done}/{self.tasks}, {totals.documents:,} documents", refresh=False
        )
        self.bar.update(totals.tokens - self.bar.n)

    def plain_line(self, totals: Totals) -> str:
        """The bar's content as one line for a log: no carriage returns."""
        seconds = time.monotonic() - self.started
        rate = (totals.tokens - self.start.tokens) / seconds if seconds > 0 else 0.0
        total = estimated_tokens(totals, self.total_bytes, self.token_cap)
        line = (
            f"{self.name}: {totals.tokens:,} tokens, {totals.documents:,} documents, tasks {totals.tasks_done}/"
            f"{self.tasks}, {rate:,.0f} tokens/s"
        )
        if total and rate > 0 and total > totals.tokens:
            line += f", about {format_seconds((total - totals.tokens) / rate)} left (estimate)"
        return line


def format_seconds(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m" if hours else f"{m}m{s:02d}s"
