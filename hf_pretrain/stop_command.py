"""`hf-pretrain stop RUN_DIR [--cooldown_steps N]`: ask a running job to finish now, with a finished model.

    hf-pretrain stop runs/1b                       # wsd: decay over decay_fraction x the steps done, then final/
    hf-pretrain stop runs/1b --cooldown_steps 500  # decay over 500 steps
    hf-pretrain stop runs/1b --cooldown_steps 0    # no decay: save and write final/ at the next step

The request is a file in the run folder (its format: hf_pretrain/stop_request.py, beside this
command). The main process of the job reads it at every step and the guards share it with every
other process in the step's one exchange (training/guards.py), so all of them begin the same
cooldown at the same step, however many there are and on however many machines. A wsd run then decays from the rate it had, saves, and writes
final/; a cosine run stops at once unless a cooldown is asked for, and its log and model card say
that it did not finish its decay. The file goes when the run has finished.

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

import sys
from typing import Any

from hf_pretrain.checkpoints.continuation import GO_FURTHER
from hf_pretrain.checkpoints.store import newest_good_checkpoint
from hf_pretrain.config import CommandParser
from hf_pretrain.exit_codes import EXIT_PREFLIGHT
from hf_pretrain.formatting import human_duration
from hf_pretrain.run_dir import RunDir, last_train_record, read_status
from hf_pretrain.run_lock import holder_of
from hf_pretrain.stop_request import read_stop_request, request_stop

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


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="hf-pretrain stop", description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1]
    )
    parser.add_argument("run_dir", help="the running job's output_dir (a folder, or a URL: s3://...)")
    parser.add_argument(
        "--cooldown_steps",
        type=int,
        help="steps of learning-rate decay before the run stops (unset: decay_fraction x the steps "
        "done for a wsd run, 0 for a cosine)",
    )
    args = parser.parse_args(argv)
    if args.cooldown_steps is not None and args.cooldown_steps < 0:
        parser.refuse("--cooldown_steps must be 0 or more")
    from hf_pretrain.object_store.urls import is_url

    on_store = is_url(args.run_dir)
    if on_store:  # the request goes into the store, where the trainer's uploader polls for it
        from hf_pretrain.object_store.reach import StoreRefused
        from hf_pretrain.object_store.reading import stop_facts

        try:
            view, store_holder, store_saved = stop_facts(args.run_dir)
        except StoreRefused as exc:
            print(f"hf-pretrain stop: refused, nothing written: {exc}", file=sys.stderr)
            return EXIT_REFUSED
    run = RunDir(view if on_store else args.run_dir)
    shown = args.run_dir.rstrip("/") if on_store else run.path  # a URL run is named by its URL, not the view
    if not run.is_run() and not (on_store and store_holder):  # a URL run before its first records: its lease
        print(
            f"hf-pretrain stop: error: {shown} is not a run folder (no checkpoints/, no resolved_recipe.yaml)",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    status, pending = read_status(run.path), read_stop_request(run.path)
    if on_store:
        holder, saved = store_holder, store_saved
    else:
        holder = holder_of(run.path)
        newest = newest_good_checkpoint(run.path, checksums=False, log=lambda _: None)
        saved = newest.train_state if newest is not None else None
    running = holder is not None
    refusal = None
    if not running and (finished := _finished_at(run, status, saved)) is not None:
        refusal = f"{shown} finished at step {finished:,}: there is nothing to stop. {GO_FURTHER}"
    elif running and pending is not None and pending.answered:
        refusal = (
            f"the run in {shown} is already finishing: it answered {pending.describe()} at step "
            f"{pending.answered_at_step:,} ({pending.answer}). A cooldown under way is not restarted or "
            f"shortened; to stop sooner, `kill -TERM {holder.get('pid')}` on {holder.get('host')} saves a "
            f"checkpoint now, and a rerun resumes the cooldown"
        )
    elif not running and saved and saved.get("cooldown") and saved["step"] < saved.get("end", saved["step"]):
        cooldown = saved["cooldown"]
        refusal = (
            f"the run in {shown} stopped at step {saved['step']:,} in its cooldown ({cooldown['reason']}); "
            f"its next start finishes that cooldown at step {cooldown['end']:,} and writes final/"
        )
    if refusal is not None:
        print(f"hf-pretrain stop: refused, nothing written: {refusal}", file=sys.stderr)
        return EXIT_REFUSED

    path = request_stop(run.path, args.cooldown_steps)
    if on_store:
        from hf_pretrain.object_store.reading import send_back

        send_back(args.run_dir, run.path, path.name)
        path = f"{args.run_dir.rstrip('/')}/{path.name}"
    recipe = run.load_recipe()
    if args.cooldown_steps == 0 or (
        recipe is not None and recipe.train.lr_schedule == "cosine" and args.cooldown_steps is None
    ):
        then = "saves and writes final/ after its next step"
        if recipe is not None and recipe.train.lr_schedule == "cosine":
            then += " (a cosine run: the model will not have finished its decay)"
    else:
        steps = f"{args.cooldown_steps:,} steps" if args.cooldown_steps else "decay_fraction x the steps done"
        then = f"decays its learning rate over {steps} from its next step on, then saves and writes final/"
    cut = _decay_cut_at_max_steps(run, recipe, saved, running, args.cooldown_steps)
    if cut:
        then = then.replace("then saves and writes final/", cut)
    replaced = ""
    if pending is not None:
        replaced = f" It replaces {pending.describe()}, " + (
            f"answered at step {pending.answered_at_step:,} by a session that ended before its cooldown was saved."
            if pending.answered
            else "which the run had not read yet."
        )
    if running:
        print(f"asked the run in {shown} to finish ({path}): it {then}.{replaced} Delete the file to take it back.")
    else:
        print(
            f"{shown} is not running ({_last_session(status, holder)}). The request ({path}) waits for its "
            f"next start, which {then.replace('from its next step on', 'from its first step')}; a start with "
            f"another --max_steps sets it aside (a new plan), saying so.{replaced} Delete the file to take it back."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
