"""The run folder: every file name in it, and the JSON-lines records it keeps.

    runs/NAME/
      resolved_recipe.yaml   the recipe as run (CLI overrides applied)
      metrics.jsonl          one record per log line, evaluation, skipped step or spike
      samples.jsonl          greedy completions of the fixed prompts at every evaluation
      benchmarks.jsonl       lm-eval scores of checkpoints, when asked
      phases.json / .md      cost per loss point of each named phase
      checkpoints/step_N/    resumable training states (hf_pretrain/checkpoints/)
      final/                 the last checkpoint exported as a Hugging Face model folder
      final_step_N/          final/ of the run as it ended at step N, before it went further
      stop_request.json      `hf-pretrain stop` asks the running job to finish (read at its next step)
      status.json            how the last session ended: exit code, reason, what to run next (training/session.py)
      sessions.jsonl         the ledger of every session: where, its start-up, how it ended, what it lost (sessions.py)
      status.json.lock       taken (flock) by every writer of status.json (`update_status`)
      store.json             a run URL's working copy (store/run/): names the URL the run is known by
      run.lock               held (flock) by the session training into the folder; names its host, pid, start

Training writes it; export, the report, the demo and the doctor read it. Nobody spells these
names anywhere else.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from hf_pretrain.redaction import redact_values
from hf_pretrain.run_folder.json_files import write_json_atomically

if TYPE_CHECKING:
    from hf_pretrain.config import Recipe

STATUS_LOCK = "status.json.lock"  # taken by every writer of status.json (`update_status`)
# final/ is exported in full precision: the disk check and the export must agree on its size.
FINAL_DTYPE = "fp32"
# store.json's key: final/ was whole in the store when this working copy was pulled (store/run/run_sync.py)
FINAL_IN_STORE = "final_in_store"


class RunDir:
    """Paths of one run folder: `RunDir("runs/1b").metrics` is `runs/1b/metrics.jsonl`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def resolved_recipe(self) -> Path:
        return self.path / "resolved_recipe.yaml"

    @property
    def store_link(self) -> Path:
        return self.path / "store.json"

    def shown_as(self) -> str:
        """How records and messages name the run: its URL for a store's working copy, else its folder."""
        try:
            return str(json.loads(self.store_link.read_text())["url"])
        except (OSError, ValueError, KeyError, TypeError):
            return str(self.path)

    def show(self, path: str | Path) -> str:
        """`path`, a file of this folder, as the user knows it: under the run's URL for a store's working
        copy (the cache's path is no place the user gave), else as it is."""
        shown = self.shown_as()
        try:
            relative = Path(path).relative_to(self.path)
        except ValueError:
            return str(path)
        return str(path) if shown == str(self.path) else f"{shown}/{relative}"

    def in_words(self, text: str) -> str:
        """`text` with this folder's path named as the user knows it (`show`), wherever it appears."""
        shown = self.shown_as()
        return text if shown == str(self.path) else text.replace(str(self.path), shown)

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def samples(self) -> Path:
        return self.path / "samples.jsonl"

    @property
    def benchmarks(self) -> Path:
        return self.path / "benchmarks.jsonl"

    @property
    def phases_json(self) -> Path:
        return self.path / "phases.json"

    @property
    def phases_md(self) -> Path:
        return self.path / "phases.md"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def final(self) -> Path:
        return self.path / "final"

    def has_final(self) -> bool:
        """final/ is written: here, or, for a store's working copy, whole in the store at this session's pull
        (store.json says so; a fresh machine never pulls final/, and must not take the run as unfinished)."""
        if self.final.is_dir():
            return True
        try:
            return json.loads(self.store_link.read_text()).get(FINAL_IN_STORE) is True
        except (OSError, ValueError, AttributeError):
            return False

    def final_before_branch(self, step: int) -> Path:
        """Where final/ goes when the run goes further from an earlier checkpoint: the model of the
        run that ended at `step` is kept, not overwritten."""
        return self.path / f"final_step_{step:08d}"

    @property
    def stop_request(self) -> Path:
        """`hf-pretrain stop` writes it; the running job reads it at its next step."""
        return self.path / "stop_request.json"

    @property
    def status(self) -> Path:
        """How the last training session ended, for scripts that cannot see its exit code."""
        return self.path / "status.json"

    @property
    def hangs(self) -> Path:
        """The watchdog's reports: one folder per hung session, each process's stacks and report in it."""
        return self.path / "hangs"

    @property
    def lock(self) -> Path:
        """The session training into this folder holds an exclusive lock on it; it names the holder."""
        return self.path / "run.lock"

    def is_run(self) -> bool:
        return self.checkpoints.is_dir() or self.resolved_recipe.is_file()

    def load_recipe(self) -> Recipe | None:
        """The recipe this run was started with, typed; None when the folder has none, or has one this
        version of hf-pretrain no longer reads (a renamed key): the report, the card and the demo then
        do without it rather than fail on an old run."""
        from hf_pretrain.config import RecipeError, load_recipe  # imported late: run_dir stays importable alone

        if not self.resolved_recipe.is_file():
            return None
        try:
            return load_recipe(str(self.resolved_recipe))
        except RecipeError:
            return None


class JsonlWriter:
    """Appends one JSON record per line; only the main process writes."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path = path
        self.enabled = enabled

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def read_status(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The run folder's status.json ({} when there is none, or it cannot be read); training/session.py writes it."""
    try:
        status = json.loads(RunDir(run_dir).status.read_text())
    except (OSError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def set_activity(run_dir: str | os.PathLike, what: str | None) -> None:
    """status.json of a running session says what it is busy with while a wait lasts (`activity`:
    `saving`, `verifying`; `activity_detail`: the live line's subject), or no longer (`what` None).
    `state` stays `running`: scripts that poll it keep working. Only the session's first process
    calls this; a status that is not `running` (the session ended, or none yet) is left alone."""

    def change(status: dict[str, Any]) -> dict[str, Any] | None:
        if status.get("state") != "running":
            return None
        status.pop("activity", None), status.pop("activity_detail", None)
        if what:
            status |= {"activity": what.split()[0], "activity_detail": what}
        return status

    update_status(run_dir, change)


_STATUS_LOCK = threading.Lock()  # the threads of one process (the session, a URL run's store thread)


def update_status(run_dir: str | os.PathLike, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
    """status.json read, changed by `change` (None: left as it is) and written, under one lock that every
    writer takes: the session, the watchdog's ending, the activity and a URL run's `store` section. Two
    writers without it each wrote what they had read, and one's change was lost (a `running` status
    written back over the session's ending). The lock is a thread lock and an flock on `status.json.lock`
    beside it (another process of the job: the watchdog)."""
    import fcntl

    run = RunDir(run_dir)
    with _STATUS_LOCK:
        try:
            handle = open(run.path / STATUS_LOCK, "a")
        except OSError:  # a folder this process cannot write: the write below says so
            handle = None
        try:
            if handle is not None:
                fcntl.flock(handle, fcntl.LOCK_EX)
            changed = change(read_status(run.path))
            if changed is not None:
                write_status(run, changed)
        finally:
            if handle is not None:
                handle.close()  # closing releases the flock


def write_status(run: RunDir, status: dict) -> None:
    """status.json, the one writer of it: whole or not at all; on a full disk rewritten in place; else a
    warning (the exit code still says how the session ended). Its text redacted as the printed lines are:
    a reason or a command quoting a credential keeps it out of the file, and of the store's copy."""
    status = redact_values(status)
    text = json.dumps(status, indent=1) + "\n"
    try:
        write_json_atomically(run.status, status)  # whole or not at all: a reader never sees half of it
        return
    except OSError as exc:
        failed = exc
    # A full disk has no room for a second copy, but the old status.json's own blocks are freed when it
    # is truncated: rewritten in place, the ending (a few hundred bytes, like the `running` it replaces)
    # fits. A write cut short there leaves a file that reads as no status, never as `running`.
    try:
        with run.status.open("w") as f:
            f.write(text)
        return
    except OSError:
        pass
    # the exit code still says how the session ended
    print(f"warning: {run.status} could not be written: {failed.strerror or failed}", file=sys.stderr)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every record of a JSON-lines file (90,000 in about a second); a last line cut short (a kill or
    a full disk mid-write) is left out, the next resume drops it. Damage elsewhere raises ValueError."""
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    try:
        return json.loads("[" + ",".join(lines) + "]")  # one parse of the whole file: a quarter faster
    except json.JSONDecodeError:
        pass
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break
            raise ValueError(f"{path}, line {number}: not a JSON record ({exc})") from None
    return records


def truncate_jsonl(path: Path, after_step: int) -> None:
    """Drop the records past `after_step` (and a last line cut short): a resumed run rewrites them, so
    the file stays one clean curve. Records are appended in step order, so only the tail is read,
    back to the first record at or before `after_step`, and the file is cut there in place."""
    if not path.exists():
        return
    with path.open("rb+") as f:
        cut = None
        for number, (start, line) in enumerate(_lines_from_the_end(f)):
            if not line.strip():
                continue
            try:
                step = json.loads(line).get("step", 0)
            except json.JSONDecodeError:
                if number > 1:  # not the last line: damage to leave to the reader, not a torn write
                    break
                step = after_step + 1
            if step <= after_step:
                break
            cut = start
        if cut is not None:
            f.truncate(cut)


def _lines_from_the_end(f: BinaryIO, block: int = 1 << 16) -> Iterator[tuple[int, bytes]]:
    """(offset, line) for each line of `f`, last first, reading `block` bytes at a time from the end."""
    position = f.seek(0, os.SEEK_END)
    head = b""  # the start of the file's line that runs across the block boundary
    while position > 0:
        size = min(block, position)
        position -= size
        f.seek(position)
        lines = (f.read(size) + head).split(b"\n")
        starts = [position]
        for line in lines[:-1]:
            starts.append(starts[-1] + len(line) + 1)
        for start, line in zip(reversed(starts[1:]), reversed(lines[1:]), strict=True):
            yield start, line
        head = lines[0]
    if head:
        yield 0, head


def last_train_record(metrics: Path, tail_bytes: int = 1 << 16) -> dict[str, Any] | None:
    """The last whole `train` record of metrics.jsonl, read from its tail only (a 1b run's file is large)."""
    try:
        with metrics.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
            if record.get("kind", "train") == "train":
                int(record["step"])
                return record
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a line cut short by the kill, or the cut first line of the tail
    return None
