"""The run's ledger of its sessions: `sessions.jsonl` in the run folder, one JSON record a line, appended.

A session is one start of the trainer on the run (its folder, or its URL's working copy). Each leaves:

    {"kind": "start", "session": ID, "host", "pid", "started", "started_epoch", "from_step"}
        once it holds the folder; `from_step` is the newest checkpoint it could resume from (null: none)
    {"kind": "first_step", "session": ID, "step", "device", "to_first_step_s", "went_to": {...}}
        after its first optimizer step: the seconds from the process's start, and what they went to
        (`pull`: the run's checkpoint and records from its store, `data`: the data's files and validation
        blocks from theirs, `checkpoint`: loading the resumed state, `first_step`: the first step itself,
        compiling included, `other`: the rest: imports, the preflight, building the model)
    {"kind": "end", "session": ID, "ended", "exit_code", "ending", "last_step", "checkpoint_step",
     "steps_trained", "steps_lost", "lost_s", "duration_s", "price_per_hour", "lost_usd", "cost_usd"}
        as it ends: how (`ending` is status.json's state), the steps trained after its newest checkpoint
        (trained again by the next session: `steps_lost`, `lost_s` at the session's own pace) and what
        they, and the whole session, cost at the recipe's `price_per_hour`

A session that was killed (SIGKILL, out of memory, a machine lost) writes no `end`: the next one writes
it for it (`"ending": "killed"`, `"estimated": true`) from what the folder shows: the last step it logged,
the newest checkpoint, when it was last heard of. Nothing is ever rewritten: a last line cut short by a
kill is skipped by the reader, and the next append starts on a line of its own.

One writer, as status.json has one (run_dir.update_status): the session that holds the folder
(training/session.py) through `Ledger`; `merge` brings a store's copy in (store/run/run_sync.py), so a
machine whose copy is behind keeps every other machine's sessions. `fruitless_streak` is what ends a
relaunch storm: the sessions in a row, newest last, that saved no new checkpoint.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_pretrain.run_folder.run_dir import RunDir, last_train_record, read_status
from hf_pretrain.run_folder.run_lock import RunDirUnusable

LEDGER = "sessions.jsonl"
# Endings that are never a failure: the schedule ran out, `stop_at_step` or a stop request was answered
# (exit 0), or nothing was started at all (a refusal, 78: the fix is the user's, not a relaunch's).
NEVER_FRUITLESS = ("finished", "stopped", "refused")
# Endings that a scheduler's relaunch answers: a preemption with notice, or none (killed).
PREEMPTIONS = ("preempted", "killed")
STAMP = "%Y-%m-%dT%H:%M:%S%z"


def ledger_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / LEDGER


# ---------------------------------------------------------------------- the start-up's clock
class StartUpClock:
    """Where this process's time before its first step went: `with start_up.timed("pull"): ...` adds the
    seconds of the block to `pull`. Process-wide: the parts that do the work (the store's pull, the data's
    fetch, the checkpoint's load) say it without knowing who reads it."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        self._open: set[str] = set()  # parts being timed: a block inside another of its part counts once

    @contextmanager
    def timed(self, part: str) -> Iterator[None]:
        if part in self._open:
            yield
            return
        began = time.monotonic()
        self._open.add(part)
        try:
            yield
        finally:
            self._open.discard(part)
            self.parts[part] = self.parts.get(part, 0.0) + time.monotonic() - began

    @staticmethod
    def since_process_start() -> float:
        """Seconds since this process was created (its imports included), as the kernel counts them."""
        try:
            import psutil  # accelerate's dependency

            return max(0.0, time.time() - psutil.Process().create_time())
        except Exception:  # no psutil: from this module's import, a little less
            return time.monotonic() - _IMPORTED

    def went_to(self, first_step_s: float) -> tuple[float, dict[str, float]]:
        """(seconds to the end of the first step, what they went to) at the end of that step."""
        total = self.since_process_start()
        parts = {name: round(s, 2) for name, s in self.parts.items()}
        parts["first_step"] = round(first_step_s, 2)
        parts["other"] = round(max(0.0, total - sum(parts.values())), 2)
        return round(total, 2), parts


_IMPORTED = time.monotonic()
start_up = StartUpClock()


# ---------------------------------------------------------------------- reading
def read_records(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every whole record of the ledger, in order; a line that does not parse (a write cut short) is skipped."""
    try:
        text = ledger_path(run_dir).read_text()
    except OSError:
        return []
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("session") and record.get("kind"):
            records.append(record)
    return records


@dataclass
class SessionRecord:
    """One session, its records folded: what `status` and `report` show."""

    session: str
    start: dict[str, Any] = field(default_factory=dict)
    first_step: dict[str, Any] = field(default_factory=dict)
    end: dict[str, Any] = field(default_factory=dict)

    @property
    def ending(self) -> str:
        return self.end.get("ending") or ("running" if self.start else "unknown")

    @property
    def from_step(self) -> int | None:
        return self.start.get("from_step")

    @property
    def cost_usd(self) -> float | None:
        return self.end.get("cost_usd")


def sessions(run_dir: str | os.PathLike) -> list[SessionRecord]:
    """The run's sessions in the order they started."""
    folded: dict[str, SessionRecord] = {}
    for record in read_records(run_dir):
        one = folded.setdefault(record["session"], SessionRecord(record["session"]))
        kind = record["kind"]
        if kind in ("start", "first_step", "end") and not getattr(one, kind):  # the first word stays
            setattr(one, kind, record)
    return sorted(folded.values(), key=lambda s: s.start.get("started_epoch", float("inf")))


def fruitless_streak(past: list[SessionRecord], from_step_now: int | None) -> list[SessionRecord]:
    """The sessions in a row, newest last, that saved no new checkpoint: the checkpoint the session after
    each could resume from (`from_step_now` for the newest) is no newer than its own. A finished run, a
    stop and a refusal are not failures: they are left out and do not break the row; a session that saved
    a checkpoint ends it."""
    streak: list[SessionRecord] = []
    after = from_step_now
    for s in reversed(past):
        if not s.start:
            continue
        if s.ending in NEVER_FRUITLESS or s.end.get("exit_code") == 0:
            if s.ending == "refused":
                continue  # nothing was started: neither a failure nor progress
            break
        if (after if after is not None else -1) > (s.from_step if s.from_step is not None else -1):
            break
        streak.append(s)
        after = s.from_step
    return list(reversed(streak))


# ---------------------------------------------------------------------- writing
def append(run_dir: str | os.PathLike, record: dict[str, Any]) -> None:
    """One record at the end of the ledger, on a line of its own (after a last line cut short too), under
    an flock beside it. A write that fails (a full disk) is a warning: the exit code still says how the
    session ended."""
    path = ledger_path(run_dir)
    line = json.dumps(record) + "\n"
    try:
        with open(path, "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    line = "\n" + line  # the line a kill cut short stays a line of its own, and unread
            f.write(line.encode())
            f.flush()
    except OSError as exc:
        print(f"warning: {path} could not be written: {exc.strerror or exc}", flush=True)


def merge(run_dir: str | os.PathLike, other: bytes) -> int:
    """The records of `other` (the store's copy of the ledger) that this folder's lacks, appended in their
    order: no machine's session is lost when another machine's copy was behind. The count added."""
    have = {(r["session"], r["kind"]) for r in read_records(run_dir)}
    added = 0
    for line in other.decode(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or not record.get("session") or not record.get("kind"):
            continue
        if (record["session"], record["kind"]) not in have:
            append(run_dir, record)
            have.add((record["session"], record["kind"]))
            added += 1
    return added


def _epoch(stamp: Any) -> float | None:
    try:
        return time.mktime(time.strptime(str(stamp), STAMP))
    except (TypeError, ValueError, OverflowError):
        return None


class Ledger:
    """This session's records: `begin` once it holds the folder, `first_step` after its first step, `ended`
    as it ends. `price_per_hour`: the recipe's (0: unknown, no dollars said)."""

    def __init__(self, run_dir: str | os.PathLike, price_per_hour: float = 0.0):
        self.run = RunDir(run_dir)
        self.price = price_per_hour
        self.id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.began: float | None = None
        self.from_step: int | None = None
        self.first: dict[str, Any] = {}
        self._ended = False
        self._before: int | None = None  # the ledger's size before this session's start (None: it had none)
        self._after: int | None = None  # ... and after it

    def close_the_killed(self, newest_step: int | None) -> list[SessionRecord]:
        """An `end` for every earlier session that has none (it was killed: its status.json still said
        running and nobody held the folder), estimated from the folder. The sessions closed."""
        closed = []
        status = read_status(self.run.path)
        record = last_train_record(self.run.metrics) or {}
        for s in sessions(self.run.path):
            if s.end or not s.start:
                continue
            last_step = record.get("step") if isinstance(record.get("step"), int) else None
            first = s.first_step.get("step")
            if last_step is not None and first is not None and last_step < first:
                last_step = None  # the records after this session's checkpoint were cut by a later one
            heard = [s.start.get("started_epoch") or 0.0]
            ending: dict[str, Any] = {}
            if status.get("pid") == s.start.get("pid") and status.get("host") == s.start.get("host"):
                heard += [_epoch(status.get("updated")), _epoch((status.get("store") or {}).get("updated"))]
                if status.get("state") not in (None, "running"):  # ended by another process (the watchdog)
                    ending = {"ending": status["state"], "exit_code": status.get("exit_code")}
            if s.first_step:
                heard.append((s.start.get("started_epoch") or 0.0) + float(s.first_step.get("to_first_step_s") or 0))
            last_heard = max(h for h in heard if h is not None)
            fields = self._ending_fields(
                s, last_step, newest_step, duration_s=max(0.0, last_heard - (s.start.get("started_epoch") or 0.0))
            )
            append(self.run.path, {"kind": "end", "session": s.session, **fields, **ending, "estimated": True})
            closed.append(s)
        return closed

    def begin(self, from_step: int | None) -> None:
        self.began, self.from_step = time.time(), from_step
        path = ledger_path(self.run.path)
        self._before = path.stat().st_size if path.exists() else None
        append(
            self.run.path,
            {
                "kind": "start",
                "session": self.id,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started": time.strftime(STAMP, time.localtime(self.began)),
                "started_epoch": self.began,
                "from_step": from_step,
            },
        )
        self._after = path.stat().st_size if path.exists() else None

    def first_step_done(self, step: int, device: str, first_step_s: float) -> None:
        """After the session's first step (`step`), on `device`, which itself took `first_step_s`."""
        total, went_to = start_up.went_to(first_step_s)
        self.first = {"step": step, "device": device, "to_first_step_s": total, "went_to": went_to}
        append(self.run.path, {"kind": "first_step", "session": self.id, **self.first})

    def ended(self, exit_code: int | None, ending: str, newest_step: int | None) -> None:
        """How the session ended (once): its last step is the last one it logged. A refused start leaves the
        ledger as it found it: a refusal touches nothing of the run (it neither counts toward a storm nor
        ends one), so its own start record goes, where nothing was written after it."""
        if self._ended or self.began is None:
            return
        self._ended = True
        if ending == "refused" and not self.first and self._take_back_the_start():
            return
        me = SessionRecord(self.id, {"from_step": self.from_step, "started_epoch": self.began}, self.first)
        record = last_train_record(self.run.metrics) or {}
        last_step = record.get("step") if self.first and isinstance(record.get("step"), int) else None
        fields = self._ending_fields(me, last_step, newest_step, duration_s=time.time() - self.began)
        append(self.run.path, {"kind": "end", "session": self.id, **fields, "exit_code": exit_code, "ending": ending})

    def _take_back_the_start(self) -> bool:
        """Remove this session's start record, which it can prove it wrote: the ledger is as long as this
        session left it (the folder's lock keeps every other process of another session out). True if done."""
        path = ledger_path(self.run.path)
        try:
            if self._after is None or path.stat().st_size != self._after:
                return False
            if self._before is None:
                path.unlink()
            else:
                os.truncate(path, self._before)
        except OSError:
            return False
        return True

    def _ending_fields(
        self, s: SessionRecord, last_step: int | None, newest_step: int | None, duration_s: float
    ) -> dict[str, Any]:
        first = s.first_step.get("step")
        start = first - 1 if first is not None else s.from_step
        trained = max(0, last_step - start) if last_step is not None and start is not None else 0
        kept = max(0, (newest_step or 0) - (start or 0)) if newest_step is not None else 0
        lost = max(0, trained - kept)
        to_first = float(s.first_step.get("to_first_step_s") or 0.0)
        per_step = (max(0.0, duration_s - to_first) / trained) if trained else 0.0
        lost_s = lost * per_step
        fields: dict[str, Any] = {
            "ended": time.strftime(STAMP),
            "exit_code": None,
            "ending": "killed",
            "last_step": last_step,
            "checkpoint_step": newest_step,
            "steps_trained": trained,
            "steps_lost": lost,
            "lost_s": round(lost_s, 1),
            "duration_s": round(duration_s, 1),
            "price_per_hour": self.price or None,
        }
        if self.price:
            fields["lost_usd"] = round(lost_s / 3600 * self.price, 4)
            fields["cost_usd"] = round(duration_s / 3600 * self.price, 4)
        return fields


# ---------------------------------------------------------------------- saying it
@dataclass
class Totals:
    """The ledger summed up: what `status` and `report` say of a run's sessions."""

    sessions: int
    preemptions: int  # preempted (a signal) or killed (none)
    failures: int  # ended otherwise than finished, stopped, preempted with a checkpoint or refused
    start_up_s: float  # seconds before first steps, every session
    steps_lost: int
    lost_s: float  # the steps lost at their sessions' pace
    dollars_lost: float | None  # start-ups after the first and the steps lost, at price_per_hour
    price_per_hour: float | None


def totals(past: list[SessionRecord]) -> Totals:
    price = next((s.end.get("price_per_hour") for s in reversed(past) if s.end.get("price_per_hour")), None)
    start_up_s = sum(float(s.first_step.get("to_first_step_s") or 0) for s in past)
    relaunch_s = sum(float(s.first_step.get("to_first_step_s") or 0) for s in past[1:])
    lost_s = sum(float(s.end.get("lost_s") or 0) for s in past)
    return Totals(
        sessions=len(past),
        preemptions=sum(s.ending in PREEMPTIONS for s in past),
        failures=sum(
            s.end.get("exit_code") not in (None, 0) and s.ending not in ("preempted", "refused") for s in past
        ),
        start_up_s=start_up_s,
        steps_lost=sum(int(s.end.get("steps_lost") or 0) for s in past),
        lost_s=lost_s,
        dollars_lost=(relaunch_s + lost_s) / 3600 * price if price else None,
        price_per_hour=price,
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def describe_session(s: SessionRecord) -> str:
    """One session in a line: where, when, its start-up and what it went to, its steps, how it ended, the loss."""
    where = s.start.get("host") or "?"
    if s.first_step.get("device"):
        where += f" ({s.first_step['device']})"
    parts = [f"{s.start.get('started', '?')} on {where}"]
    if s.first_step:
        went = ", ".join(f"{k} {v:.0f} s" for k, v in (s.first_step.get("went_to") or {}).items() if v >= 0.5)
        parts.append(
            f"first step after {_duration(float(s.first_step['to_first_step_s']))}" + (f" ({went})" if went else "")
        )
    else:
        parts.append("no step trained")
    end = s.end
    if end:
        code = f", exit {end['exit_code']}" if end.get("exit_code") is not None else ""
        parts.append(f"{end.get('steps_trained', 0):,} steps, {s.ending}{code}")
        if end.get("steps_lost"):
            lost = f"{end['steps_lost']:,} steps lost ({_duration(float(end.get('lost_s') or 0))}"
            lost += f", ${end['lost_usd']:,.2f})" if end.get("lost_usd") is not None else ")"
            parts.append(lost)
        if end.get("estimated"):
            parts.append("estimated by the next session")
    else:
        parts.append("running")
    return "; ".join(parts)


def summary_lines(past: list[SessionRecord], last: int = 5) -> list[str]:
    """`status`'s lines: the totals, then the newest `last` sessions one a line (indented two spaces)."""
    if not past:
        return []
    t = totals(past)
    head = (
        f"  sessions: {t.sessions} ({t.preemptions} preempted or killed, {t.failures} failed); "
        f"start-up {_duration(t.start_up_s)} in all; {t.steps_lost:,} steps lost ({_duration(t.lost_s)})"
    )
    if t.dollars_lost is not None:
        head += f"; lost ${t.dollars_lost:,.2f} at ${t.price_per_hour:g}/h (relaunch start-ups and steps lost)"
    lines = [head]
    shown = past[-last:]
    if len(past) > len(shown):
        lines.append(f"    ... {len(past) - len(shown)} earlier session(s) in {LEDGER}")
    lines += [f"    {describe_session(s)}" for s in shown]
    return lines


# ---------------------------------------------------------------------- a storm ends itself
STORM_KEY = "max_fruitless_sessions"


def storm_refusal(past: list[SessionRecord], from_step_now: int | None, limit: int, shown_as: str) -> str | None:
    """The refusal's line when the newest `limit` sessions (or more) in a row saved no new checkpoint
    (`fruitless_streak`), else None; `limit` 0 never refuses."""
    if limit <= 0:
        return None
    streak = fruitless_streak(past, from_step_now)
    if len(streak) < limit:
        return None
    endings = ", ".join(
        s.ending + (f" (exit {s.end['exit_code']})" if s.end.get("exit_code") not in (None, 0) else "") for s in streak
    )
    seconds = sum(float(s.end.get("duration_s") or 0) for s in streak)
    price = next((s.end.get("price_per_hour") for s in streak if s.end.get("price_per_hour")), None)
    cost = f"${seconds / 3600 * price:,.2f} ({_duration(seconds)} at ${price:g}/h)" if price else _duration(seconds)
    return (
        f"the last {len(streak)} sessions of {shown_as} in a row saved no new checkpoint ({endings}), which cost "
        f"{cost} for nothing kept: a relaunch storm, stopped at {STORM_KEY}={limit}. `hf-pretrain status "
        f"{shown_as}` lists them; once the cause is fixed, rerun with --{STORM_KEY} {len(streak) + 1} "
        f"(0: never refuse)"
    )


class RelaunchStorm(RunDirUnusable):
    """Raised by the session: too many sessions in a row saved nothing (exit 78, one line)."""


_current: Ledger | None = None  # this process's session's ledger, once it began (the session's first process)


def set_current(ledger: Ledger | None) -> None:
    global _current
    _current = ledger


def note_first_step(step: int, device: str, began: float) -> bool:
    """Said by the loop after its first step (`began`: time.monotonic() when the step began): the ledger
    records the start-up. True, so the loop says it once."""
    if _current is not None:
        _current.first_step_done(step, device, time.monotonic() - began)
    return True


def report_section(past: list[SessionRecord], price_per_hour: float | None = None) -> list[str]:
    """`report`'s "Sessions" section: the totals, then a table of every session. `price_per_hour` (the
    report's) prices it when given, else each session's own."""
    if not past:
        return [f"No {LEDGER} in this run folder: its sessions were not recorded (a run of an older version)."]
    t = totals(past)
    price = price_per_hour or t.price_per_hour
    relaunch_s = sum(float(s.first_step.get("to_first_step_s") or 0) for s in past[1:])
    said = (
        f"{t.sessions} session(s): {t.preemptions} preempted or killed, {t.failures} failed; start-up "
        f"{_duration(t.start_up_s)} in all ({_duration(relaunch_s)} of it after relaunches); {t.steps_lost:,} "
        f"steps lost ({_duration(t.lost_s)})"
    )
    if price:
        said += f"; lost: ${(relaunch_s + t.lost_s) / 3600 * price:,.2f} at ${price:g}/h"
    rows = [
        said,
        "",
        "| started | where | to first step | went to | steps | ended | steps lost | lost |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in past:
        where = s.start.get("host", "?") + (f" ({s.first_step['device']})" if s.first_step.get("device") else "")
        first = _duration(float(s.first_step["to_first_step_s"])) if s.first_step else "none"
        went = ", ".join(f"{k} {v:.0f} s" for k, v in (s.first_step.get("went_to") or {}).items() if v >= 0.5)
        code = f" ({s.end['exit_code']})" if s.end.get("exit_code") is not None else ""
        lost_s = float(s.end.get("lost_s") or 0)
        lost = _duration(lost_s) + (f", ${lost_s / 3600 * price:,.2f}" if price else "")
        rows.append(
            f"| {s.start.get('started', '?')} | {where} | {first} | {went or '-'} | {s.end.get('steps_trained', 0):,} "
            f"| {s.ending}{code} | {s.end.get('steps_lost', 0):,} | {lost} |"
        )
    return rows
