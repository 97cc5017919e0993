"""`hf-pretrain stop RUN_DIR [--cooldown_steps N]`: ask a running job to finish now, with a finished model.

    hf-pretrain stop runs/1b                       # wsd: decay over decay_fraction x the steps done, then final/
    hf-pretrain stop runs/1b --cooldown_steps 500  # decay over 500 steps
    hf-pretrain stop runs/1b --cooldown_steps 0    # no decay: save and write final/ at the next step

The request is a file in the run folder (its format: hf_pretrain/run_folder/stop_request.py, beside this
command). The main process of the job reads it at every step and the guards share it with every
other process in the step's one exchange (training/guards.py), so all of them begin the same
cooldown at the same step, however many there are and on however many machines. A wsd run then
decays from the rate it had, saves, and writes final/; a cosine run stops at once unless a cooldown
is asked for, and its log and model card say that it did not finish its decay. The file goes when
the run has finished.

What the command answers:
- a running job: the request is written; a second one before the job has read the first replaces
  it (said); one while the job is already in its cooldown is refused (exit 78): the decay under way
  already ends the run, and SIGTERM stops it sooner with a checkpoint.
- a run that is not running (no training holds its lock): said, with how its last session ended;
  the request waits for the next start, which applies it at its first step, unless that start goes
  further (another --max_steps): a request from before a new plan is set aside, and the log says so.
- a finished run: refused (exit 78), nothing written: there is nothing to stop; to go further,
  rerun its command with a larger --max_steps.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_pretrain.checkpoints.resume_plan import GO_FURTHER
from hf_pretrain.checkpoints.store import newest_good_checkpoint
from hf_pretrain.config import CommandParser
from hf_pretrain.exit_codes import EXIT_PREFLIGHT
from hf_pretrain.formatting import human_duration
from hf_pretrain.run_folder.run_dir import RunDir, last_train_record, read_status
from hf_pretrain.run_folder.run_lock import holder_of
from hf_pretrain.run_folder.stop_request import StopRequest, read_stop_request, request_stop

EXIT_REFUSED = EXIT_PREFLIGHT  # refused, nothing written: the same code as a training refused before any work


def _finished_at(run: RunDir, status: dict[str, Any], newest: dict[str, Any] | None) -> int | None:
    """The step a run finished at, when it has: its status says so, or its newest checkpoint is at the
    end of its schedule and final/ was written."""
    if status.get("state") == "finished":
        return status.get("checkpoint_step") or (newest or {}).get("step")
    if newest is not None and run.final.is_dir():
        end = newest.get("end", newest.get("max_steps"))
        if end is not None and newest.get("step", 0) >= end:
            return newest["step"]
    return None


def _last_session(status: dict[str, Any], holder: dict[str, Any] | None) -> str:
    if holder is not None:
        return f"pid {holder.get('pid')} on {holder.get('host')} holds it since {holder.get('since')}"
    if not status:
        return "no training holds it now"
    if status.get("state") == "running":  # its holder is gone: the lock is free
        return (
            f"no training holds it now: its last session (pid {status.get('pid')} on {status.get('host')}) was "
            f"killed, its status.json still says `running`"
        )
    return f"no training holds it now: its last session ended `{status.get('state')}` ({status.get('updated')})"


def _decay_cut_at_max_steps(
    run: RunDir, recipe: Any, saved: dict[str, Any] | None, running: bool, cooldown_steps: int | None
) -> str | None:
    """Where a cooldown longer than the steps left really ends (a cooldown never passes max_steps:
    optim.Schedule.cooldown), and when, at the run's last logged rate; None when it fits, or unknown."""
    max_steps = recipe.train.max_steps if recipe is not None else (saved or {}).get("max_steps")
    record = last_train_record(run.metrics) if running else None
    # a running job is past its last logged step; one that waits resumes from its newest checkpoint
    step = int(record["step"]) if record else (saved or {}).get("step")
    if not cooldown_steps or max_steps is None or step is None or step + cooldown_steps <= max_steps:
        return None
    left = max(0, max_steps - step)
    when = ""
    tokens_per_s = (record or {}).get("tokens_per_s")
    if tokens_per_s and recipe is not None:
        seconds = left * recipe.train.global_batch_tokens / tokens_per_s
        when = f", in about {human_duration(seconds)} at its last logged {tokens_per_s:,.0f} tokens/s"
    return (
        f"then saves and writes final/. {cooldown_steps:,} steps are more than the {left:,} left after step "
        f"{step:,}: the decay ends at max_steps, step {max_steps:,}{when}"
    )


@dataclass
class RunToStop:
    """What the command knows of the run it is asked to stop, all read before anything is written."""

    run: RunDir  # the run folder; for a run URL, its local view
    shown: str | Path  # how the answers name the run: its URL as typed (no trailing /), else its folder
    url: str | None  # the run URL when the run lives in a store, else None
    status: dict[str, Any]  # its status.json
    pending: StopRequest | None  # a request already there, answered or not
    holder: dict[str, Any] | None  # who holds its lock: None when no training runs it
    saved: dict[str, Any] | None  # its newest checkpoint's train state

    @property
    def running(self) -> bool:
        return self.holder is not None


class Refused(Exception):
    """The command's one line on stderr, with nothing written (exit 78)."""


def parse_flags(argv: list[str] | None) -> argparse.Namespace:
    parser = CommandParser(
        prog="hf-pretrain stop", description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1]
    )
    parser.add_argument("run_dir", help="the running job's output_dir (a folder, or a URL: s3://...)")
    parser.add_argument(
        "--cooldown_steps",
        type=int,
        ge=0,
        help="steps of learning-rate decay before the run stops (unset: decay_fraction x the steps "
        "done for a wsd run, 0 for a cosine)",
    )
    args = parser.parse_args(argv)
    if args.cooldown_steps is not None and args.cooldown_steps < 0:
        parser.refuse("--cooldown_steps must be 0 or more")
    return args


def read_run(run_dir: str) -> RunToStop:
    """The run `run_dir` names, a folder or a URL; raises `Refused` when there is none to ask."""
    from hf_pretrain.store.location import Location

    location = Location.of(run_dir)  # local or a store: decided here, at the command's door, once
    on_store = location.in_store
    if on_store:  # the request goes into the store, where the trainer's uploader polls for it
        from hf_pretrain.store.reach import StoreRefused
        from hf_pretrain.store.run.reading import stop_facts

        try:
            view, store_holder, store_saved = stop_facts(location)
        except StoreRefused as exc:
            raise Refused(f"hf-pretrain stop: refused, nothing written: {exc}") from exc
    run = RunDir(view if on_store else run_dir)
    shown = run_dir.rstrip("/") if on_store else run.path  # a URL run is named by its URL, not the view
    if not run.is_run() and not (on_store and store_holder):  # a URL run before its first records: its lease
        raise Refused(
            f"hf-pretrain stop: error: {shown} is not a run folder (no checkpoints/, no resolved_recipe.yaml)"
        )
    status, pending = read_status(run.path), read_stop_request(run.path)
    if on_store:
        holder, saved = store_holder, store_saved
    else:
        holder = holder_of(run.path)
        newest = newest_good_checkpoint(run.path, checksums=False, log=lambda _: None)
        saved = newest.train_state if newest is not None else None
    return RunToStop(run, shown, run_dir if on_store else None, status, pending, holder, saved)


def refusal(r: RunToStop) -> str | None:
    """Why no request is written, or None: a finished run, or one already in its cooldown (running, or
    stopped in it: its next start finishes it)."""
    saved = r.saved
    if not r.running and (finished := _finished_at(r.run, r.status, saved)) is not None:
        return f"{r.shown} finished at step {finished:,}: there is nothing to stop. {GO_FURTHER}"
    if r.running and r.pending is not None and r.pending.answered:
        return (
            f"the run in {r.shown} is already finishing: it answered {r.pending.describe()} at step "
            f"{r.pending.answered_at_step:,} ({r.pending.answer}). A cooldown under way is not restarted or "
            f"shortened; to stop sooner, `kill -TERM {r.holder.get('pid')}` on {r.holder.get('host')} saves a "
            f"checkpoint now, and a rerun resumes the cooldown"
        )
    if not r.running and saved and saved.get("cooldown") and saved["step"] < saved.get("end", saved["step"]):
        cooldown = saved["cooldown"]
        return (
            f"the run in {r.shown} stopped at step {saved['step']:,} in its cooldown ({cooldown['reason']}); "
            f"its next start finishes that cooldown at step {cooldown['end']:,} and writes final/"
        )
    return None


def write_request(r: RunToStop, cooldown_steps: int | None) -> Path | str:
    """Write the request into the run folder (and into the store, for a run URL); where it is, as said."""
    path = request_stop(r.run.path, cooldown_steps)
    if r.url is None:
        return path
    from hf_pretrain.store.run.reading import send_back

    send_back(r.url, r.run.path, path.name)
    return f"{r.url.rstrip('/')}/{path.name}"


def what_it_does(r: RunToStop, cooldown_steps: int | None) -> str:
    """What the run does with the request, from its recipe: `decays its learning rate over ..., then
    saves and writes final/`, with where a cooldown longer than the steps left ends."""
    recipe = r.run.load_recipe()
    if cooldown_steps == 0 or (recipe is not None and recipe.optim.lr_schedule == "cosine" and cooldown_steps is None):
        then = "saves and writes final/ after its next step"
        if recipe is not None and recipe.optim.lr_schedule == "cosine":
            then += " (a cosine run: the model will not have finished its decay)"
    else:
        steps = f"{cooldown_steps:,} steps" if cooldown_steps else "decay_fraction x the steps done"
        then = f"decays its learning rate over {steps} from its next step on, then saves and writes final/"
    cut = _decay_cut_at_max_steps(r.run, recipe, r.saved, r.running, cooldown_steps)
    if cut:
        then = then.replace("then saves and writes final/", cut)
    return then


def answer(r: RunToStop, path: Path | str, then: str) -> str:
    """The command's answer once the request is written: to a running job, or to a run that waits."""
    replaced = ""
    if r.pending is not None:
        replaced = f" It replaces {r.pending.describe()}, " + (
            f"answered at step {r.pending.answered_at_step:,} by a session that ended before its cooldown was saved."
            if r.pending.answered
            else "which the run had not read yet."
        )
    if r.running:
        return f"asked the run in {r.shown} to finish ({path}): it {then}.{replaced} Delete the file to take it back."
    return (
        f"{r.shown} is not running ({_last_session(r.status, r.holder)}). The request ({path}) waits for its "
        f"next start, which {then.replace('from its next step on', 'from its first step')}; a start with "
        f"another --max_steps sets it aside (a new plan), saying so.{replaced} Delete the file to take it back."
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_flags(argv)
    try:
        run = read_run(args.run_dir)
    except Refused as exc:
        print(exc, file=sys.stderr)
        return EXIT_REFUSED
    why_not = refusal(run)
    if why_not is not None:
        print(f"hf-pretrain stop: refused, nothing written: {why_not}", file=sys.stderr)
        return EXIT_REFUSED
    path = write_request(run, args.cooldown_steps)
    print(answer(run, path, what_it_does(run, args.cooldown_steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
