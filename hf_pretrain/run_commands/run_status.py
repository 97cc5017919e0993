"""`hf-pretrain status RUN_DIR`: where a run stands, for a person.

    hf-pretrain status runs/1b            # state, step of max_steps, last checkpoint, loss, tokens, stop request
    hf-pretrain status runs/1b --verify   # and read every byte of the last checkpoint against its manifest

It reads what the run leaves in its folder, and writes nothing: `status.json` (how its last session
ended, or that one is running: training/session.py), the lock (who holds the folder now), the newest
checkpoint's train state, the last train record of metrics.jsonl and a stop request. A `running`
status whose holder is gone is a session that was killed. `read_run` takes the folder's location
and does all the reading, so that another place of a run (an object store) needs only another reader.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_pretrain.checkpoints.resume_plan import GO_FURTHER
from hf_pretrain.checkpoints.store import newest_good_checkpoint
from hf_pretrain.config import CommandParser
from hf_pretrain.exit_codes import EXIT_PREFLIGHT
from hf_pretrain.formatting import human_duration
from hf_pretrain.run_folder.run_dir import RunDir, last_train_record, read_status
from hf_pretrain.run_folder.run_lock import holder_of
from hf_pretrain.run_folder.stop_request import read_stop_request


@dataclass
class RunStanding:
    """What a run folder says of its run, read once (`read_run`)."""

    location: str
    state: str  # status.json's state (finished, stopped, preempted, ...), `killed`, or `no status`
    exit_code: int | None
    reason: str | None  # status.json's reason: how the last session ended, in its words
    next: str | None  # status.json's advice for a rerun
    holder: dict[str, Any] | None  # who holds the folder now (host, pid, since, command)
    status_age_s: float | None  # seconds since status.json was last written
    max_steps: int | None
    logged_step: int | None  # the last step in metrics.jsonl
    loss: float | None  # its loss
    tokens: int | None  # tokens seen at the last checkpoint
    checkpoint: Path | str | None  # the newest checkpoint that verifies (a URL's: in the store)
    checkpoint_step: int | None
    checked: str  # how the checkpoint was checked
    skipped: list[str]  # newer checkpoints that did not verify, with the reason
    stop_request: str | None  # a pending or answered stop request, said for a person
    store: list[str] = field(default_factory=list)  # a run that uploads: where the store stands, lease, data
    command: str | None = None  # status.json's `command`: the last session's, as typed (what a rerun pastes)
    sessions: list[str] = field(default_factory=list)  # the ledger's lines (`session_lines`)


def _age_s(stamp: Any) -> float | None:
    try:
        return max(0.0, time.time() - time.mktime(time.strptime(str(stamp), "%Y-%m-%dT%H:%M:%S%z")))
    except (TypeError, ValueError, OverflowError):
        return None


def read_run(location: str | Path, verify: bool = False) -> RunStanding:
    """Everything `status` says of the run at `location` (a run folder), read without writing anything;
    `verify` reads every byte of the newest checkpoint against its manifest (else names and sizes)."""
    run = RunDir(location)
    status, holder = read_status(run.path), holder_of(run.path)
    state = status.get("state") or "no status"
    if state == "running" and holder is None:
        state = "killed"  # its status says running and nobody holds the folder: SIGKILL, out of memory
    skipped: list[str] = []
    newest = newest_good_checkpoint(run.path, checksums=verify, log=skipped.append)
    saved = newest.train_state if newest is not None else {}
    record = last_train_record(run.metrics) or {}
    request = read_stop_request(run.path)
    stop = None
    if request is not None:
        stop = request.describe() + (
            f", answered at step {request.answered_at_step:,}" if request.answered else ", pending"
        )
    return RunStanding(
        location=str(location),
        state=state,
        exit_code=status.get("exit_code"),
        reason=status.get("reason"),
        next=status.get("next"),
        holder=holder,
        status_age_s=_age_s(status.get("updated")),
        max_steps=saved.get("max_steps"),
        logged_step=record.get("step"),
        loss=record.get("loss"),
        tokens=saved.get("tokens_seen"),
        checkpoint=newest.path if newest is not None else None,
        checkpoint_step=saved.get("step"),
        checked="every byte checked against its manifest" if verify else "names and sizes match its manifest",
        skipped=skipped,
        stop_request=stop,
        store=_store_lines_of(run, status),
        command=status.get("command"),
        sessions=session_lines(run.path),
    )


def _store_lines_of(run: RunDir, status: dict[str, Any]) -> list[str]:
    """A run that uploads (its status.json has a `store` section): the same lines as `status URL`."""
    section = status.get("store")
    if not isinstance(section, dict):
        return []  # a local run: nothing of the store imported
    from hf_pretrain.store.run.standing import store_lines

    return store_lines(section, data=_data_url(run))


def _data_url(run: RunDir) -> str | None:
    """The run's data_dir when it is a URL (a person moving the run needs it), from its resolved recipe."""
    from hf_pretrain.store.urls import is_url

    try:
        recipe = run.load_recipe()
    except Exception:  # an unreadable recipe is the doctor's to say; status says what it can
        return None
    data = recipe.data.data_dir if recipe is not None else None
    return str(data) if data is not None and is_url(str(data)) else None


def read_store_run(location: str, view: Path, verify: bool) -> RunStanding:
    """The standing of a run URL, from the store's small records (store/run/standing.py): a fresh
    lease is a run that trains (never "killed"), the checkpoint is the newest complete one in the store."""
    from hf_pretrain.store.reach import open_checked
    from hf_pretrain.store.run.standing import read_store, store_lines

    url, fs = open_checked(location, write=False)
    store = read_store(fs, url)
    s = read_run(view, verify=verify)
    status = store.status or read_status(view)
    state = status.get("state") or "no status"
    if store.live:
        state = "running"
    elif state == "running":
        # A killed machine (SIGKILL, a lost spot instance) leaves its lease behind, gone stale; a process that
        # ended by itself released it at its end, so a `running` beside no lease is a last status.json that
        # did not reach the store, not a kill (issue 57: a run that ended 0 was called killed).
        state = "killed" if store.holder is not None else ENDED
    saved = store.train_state
    s.location, s.state, s.holder = location, state, None
    s.command = status.get("command") or s.command
    if not verify:
        s.checkpoint = store.checkpoint  # the URL: the cache's copy is no place the user gave
        s.checkpoint_step, s.max_steps, s.tokens = saved.get("step"), saved.get("max_steps"), saved.get("tokens_seen")
        s.checked = "complete in the store: every object's size matches its manifest"
        s.skipped = store.skipped
    elif s.checkpoint is not None:
        s.checkpoint = f"{url}/checkpoints/{Path(str(s.checkpoint)).name}"
    section = status.get("store") if isinstance(status.get("store"), dict) else None
    s.store = store_lines(section, store.holder, _data_url(RunDir(view)))
    if store.live:
        s.next = f"nothing: it trains (`hf-pretrain stop {location}` ends it with a checkpoint)"
    return s


def session_lines(run_dir: Path) -> list[str]:
    """The run's sessions (sessions.jsonl, run_folder/sessions.py): how many, the preemptions, the time and
    dollars lost, and the newest few one a line; none for a run that keeps no ledger (an older version's)."""
    from hf_pretrain.run_folder.sessions import sessions, summary_lines

    return summary_lines(sessions(run_dir))


ENDED = "ended, its last status not in the store"
# `next:` lines that rerun the last session's command: `status` prints the command beside them
RERUNS = ("killed", ENDED)


def describe(s: RunStanding) -> str:
    """The standing in a few lines, for a person."""
    exit_code = f" (exit {s.exit_code})" if s.exit_code is not None else ""
    steps = f"step {s.checkpoint_step:,} of {s.max_steps:,}" if s.checkpoint_step is not None and s.max_steps else None
    head = f"{s.location}: {s.state}{exit_code}" + (f", {steps}" if steps else "")
    if s.tokens is not None:
        head += f", {s.tokens:,} tokens"
    lines = [head]
    if s.holder is not None:
        lines.append(f"  held by pid {s.holder.get('pid')} on {s.holder.get('host')} since {s.holder.get('since')}")
    if s.checkpoint is not None:
        lines.append(f"  last checkpoint: {s.checkpoint} (step {s.checkpoint_step:,}; {s.checked})")
    elif s.state == "running":
        lines.append("  last checkpoint: none yet (it trains toward its first)")
    else:
        lines.append("  last checkpoint: none that verifies")
    lines += [f"  skipped: {reason}" for reason in s.skipped]
    lines += s.store
    lines += s.sessions
    if s.logged_step is not None:
        loss = f"loss {s.loss:.4f}" if isinstance(s.loss, (int, float)) else "no loss"
        lines.append(f"  last logged: step {s.logged_step:,}, {loss}")
    lines.append(f"  stop request: {s.stop_request or 'none'}")
    if s.status_age_s is not None:
        lines.append(
            f"  status.json: written {human_duration(s.status_age_s)} ago" + (f": {s.reason}" if s.reason else "")
        )
    else:
        lines.append("  status.json: none (no session has started here, or it cannot be read)")
    rerun = False
    if s.state == "finished":  # docs/survival.md's table: a finished run is exported; going further comes second
        out = f"exports/{Path(s.location.rstrip('/')).name or 'model'}"
        lines.append(f"  next: export it: hf-pretrain export --checkpoint {s.location} --out {out}")
        lines.append(f"  or {GO_FURTHER[0].lower()}{GO_FURTHER[1:]}")
        rerun = True  # its training command is the one to rerun with a larger --max_steps
    elif s.state in RERUNS:
        lines.append("  next: rerun the same command: it resumes from the newest checkpoint")
        rerun = True
    elif s.next:
        lines.append(f"  next: {s.next}")
        rerun = "the same command" in s.next or s.next.startswith("rerun")
    if rerun and s.command:  # status.json records it: "rerun the same command" without it is a riddle
        lines.append(f"  the command: {s.command}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="hf-pretrain status", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="the run's output_dir: a folder, or a URL (s3://...) of a run in a store")
    parser.add_argument(
        "--verify", action="store_true", help="read every byte of the last checkpoint against its manifest (slow)"
    )
    args = parser.parse_args(argv)
    from hf_pretrain.store.location import Location
    from hf_pretrain.store.reach import StoreRefused
    from hf_pretrain.store.run.reading import readable

    run = Location.of(args.run_dir)  # local or a store: decided here, once, and handed down
    try:  # a URL: its records and its newest complete checkpoint's listing, pulled into the cache
        run_dir = readable(run, checkpoint=args.verify, say=lambda line: print(f"status: {line}"))
    except StoreRefused as exc:
        print(f"hf-pretrain status: error: {exc}", file=sys.stderr)
        return EXIT_PREFLIGHT
    if not RunDir(run_dir).is_run() and run.in_store:  # no records yet: a run may still be training there
        try:
            standing = read_store_run(args.run_dir, run_dir, args.verify)
        except StoreRefused as exc:
            print(f"hf-pretrain status: error: {exc}", file=sys.stderr)
            return EXIT_PREFLIGHT
        if standing.state != "no status":  # a lease or a status.json: a run started there, before its first save
            print(describe(standing))
            return 0
    if not RunDir(run_dir).is_run():
        print(
            f"hf-pretrain status: error: {args.run_dir} is not a run folder (no checkpoints/, no "
            f"resolved_recipe.yaml): give the output_dir of a training",
            file=sys.stderr,
        )
        return EXIT_PREFLIGHT
    try:
        standing = (
            read_store_run(args.run_dir, run_dir, args.verify)
            if run.in_store
            else read_run(run_dir, verify=args.verify)
        )
    except StoreRefused as exc:
        print(f"hf-pretrain status: error: {exc}", file=sys.stderr)
        return EXIT_PREFLIGHT
    print(describe(standing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
