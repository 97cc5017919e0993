"""Pretrain a Llama model from a recipe with an Accelerate loop.

One GPU:
    accelerate launch --config_file accelerate_configs/single_gpu.yaml hf_pretrain/train.py --recipe 1b
Several GPUs, the same recipe (gradient accumulation adapts to keep the tokens per step):
    accelerate launch --config_file accelerate_configs/ddp.yaml --num_processes 8 hf_pretrain/train.py --recipe 1b
CPU, in minutes (after `hf-pretrain prepare --recipe smoke`):
    accelerate launch --cpu --num_processes 1 hf_pretrain/train.py --recipe smoke
The installed package, from any folder: `accelerate launch -m hf_pretrain.train --recipe smoke`,
or in this one process: `hf-pretrain train --recipe smoke`.

Any recipe key can be overridden: `--max_steps 100 --output_dir runs/try`. `--help` lists them.

The loop is training/loop.py; what happens beside it (final/, pushes, benchmarks) is
publish/side_jobs.py, wired in here. The exit code (exit_codes.py) and `output_dir/status.json`
(training/session.py) say how the run ended; under a launcher, status.json is what a script can read.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from hf_pretrain.engines.exit_file import leave_exit_code, leave_pid
from hf_pretrain.exit_codes import EXIT_FAILED, EXIT_LOCKED, EXIT_PREEMPTED
from hf_pretrain.processes import end_with_launcher

# First, before seconds of imports: a launcher stopped while this process starts must end it too.
end_with_launcher(EXIT_PREEMPTED)

from hf_pretrain.config import Recipe, parse_recipe_args  # noqa: E402
from hf_pretrain.run_folder.run_dir import RunDir  # noqa: E402
from hf_pretrain.store.location import Location, Where  # noqa: E402

if TYPE_CHECKING:
    from hf_pretrain.training.loop import Outcome


# status.json of a session whose store lacks some of it: "nothing: the run is complete" was untrue
UPLOAD_FIRST = {
    "rerun": True,
    "next": "rerun the same command on this machine: it uploads what the store lacks first (store.not_in_store)",
}


def run_training(recipe: Recipe, where: Where | None = None) -> Outcome:
    """The loop with the recipe's side jobs (final/ at the end, the pushes and benchmarks it asks for),
    in a session that holds the run folder and leaves its status.json (training/session.py). `where`:
    the door's answer to where the run and the data live; a caller without one (bench's variants) has it
    decided here, this being training's door."""
    # Imported here, after the recipe was read: `--help` and a refused flag answer without torch.
    from hf_pretrain.checkpoints.resume_decision import finished_at
    from hf_pretrain.checkpoints.resume_plan import GO_FURTHER
    from hf_pretrain.publish.side_jobs import SideJobs
    from hf_pretrain.training.loop import Outcome
    from hf_pretrain.training.loop import train as train_loop
    from hf_pretrain.training.rendezvous import group_ends_last
    from hf_pretrain.training.session import Session

    where = where or Where.of(recipe)
    recipe, where, store = in_store(recipe, where)  # a URL output_dir: checked, leased, pulled; a local copy trains
    # final/ here, or whole in the store for a working copy just pulled (a fresh node: no final/ pulled)
    finished = finished_at(recipe.train, recipe.checkpoints)
    if finished is not None:  # the same command after the run completed: nothing to train, nothing written
        shown = RunDir(recipe.train.output_dir).shown_as()  # a URL run: its URL, not the working copy
        message = f"the run in {shown} finished at step {finished:,}: nothing to train. {GO_FURTHER}"
        if os.environ.get("RANK", "0") == "0":  # every process of a launched job comes here: one says it
            print(message, flush=True)
        if store is not None:  # what an earlier session could not upload goes now; then the lease handed back
            store.wait()
            if behind := store.behind():
                message += f" | warning: {behind}"
                print(f"warning: {behind}", flush=True)
            else:  # before the close, which sends status.json to the store: `status` reads it there too
                store_caught_up(recipe.train.output_dir)
            store.close()
        return Outcome(0, message, RunDir(recipe.train.output_dir).final, finished=True)
    side_jobs = SideJobs(recipe.publish, recipe.evaluation)
    try:
        with Session(
            recipe.train.output_dir,
            price_per_hour=recipe.reporting.price_per_hour,  # what each session cost, in its ledger
            max_fruitless_sessions=recipe.stopping.max_fruitless_sessions,  # a relaunch storm ends itself
        ) as session:
            if store is not None:
                store.session_started()
            with group_ends_last():  # the loop's model is gone before its process group ends (rendezvous.py)
                outcome = train_loop(
                    recipe, callbacks=[side_jobs] + ([store] if store is not None else []), where=where
                )
            unpushed = side_jobs.unpushed(session.dir)  # on the first process only: the others push nothing
            behind = store.behind() if store is not None else None
            if store is not None and store.lost_the_run():  # taken over: its line is the whole story, and 73
                behind = None
                if outcome.exit_code != EXIT_LOCKED:  # lost after the loop ended (while final/ went up)
                    outcome = Outcome(EXIT_LOCKED, f"stopped: {store.halt()} (exit {EXIT_LOCKED})")
                    print(outcome.message, flush=True)
            if store is not None and not behind and not store.lost_the_run():
                print(store.standing(), flush=True)
            for warning in (unpushed, behind):
                if warning:  # the last line of the log and status.json say it, not only a warning hours ago
                    print(f"warning: {warning}", flush=True)
                    outcome.message += f" | warning: {warning}"
            session.ended(
                outcome.exit_code,
                outcome.message,
                outcome.finished,
                not_pushed=[what for what, _ in side_jobs.not_pushed] if recipe.publish.push_to_hub else None,
                # complete here, not in the store: a rerun is what mends it (not on a machine that lost the run)
                **(UPLOAD_FIRST if behind and not store.lost_the_run() else {}),
            )
            return outcome
    finally:
        if store is not None:
            store.close()


def store_caught_up(output_dir: str) -> None:
    """status.json of a finished run whose store now holds all of it: the warning an earlier session ended
    with ("not in the store ...", added to its reason below) and its advice to rerun here (`UPLOAD_FIRST`)
    dropped. Nothing else rewrites them (a finished run's rerun opens no session), so `status` went on
    quoting them after a later session had uploaded everything."""
    from hf_pretrain.run_folder.run_dir import update_status
    from hf_pretrain.store.run.run_sync import BEHIND
    from hf_pretrain.training.session import FINISHED

    def change(status: dict) -> dict | None:
        if not status:
            return None
        parts = str(status.get("reason") or "").split(" | ")
        kept = [part for part in parts if not part.startswith(f"warning: {BEHIND}")]
        mended = {"reason": " | ".join(kept)} if len(kept) < len(parts) else {}
        if status.get("next") == UPLOAD_FIRST["next"]:  # the finished ending's own advice again
            mended |= {"rerun": FINISHED.rerun, "next": FINISHED.next}
        return {**status, **mended} if mended else None

    update_status(output_dir, change)


def in_store(recipe: Recipe, where: Where):
    """A recipe whose output_dir is a URL, made one that trains its local copy (and `where` saying so);
    and, on the job's first process, the store side of the session (store/run/run_sync.py). A local
    output_dir: as it is."""
    from hf_pretrain.store.cache import check_cache_root
    from hf_pretrain.store.store_calls import StoreError
    from hf_pretrain.store.urls import StoreUnavailable, check_locations

    try:  # a malformed URL (output_dir or data_dir): one line, before the preflight's table
        check_locations(recipe.train.output_dir, recipe.data.data_dir)
        if where.any_in_store:
            check_cache_root(where.run.cache)  # the cache folder the door read (`Where.of`), the data's too
    except StoreUnavailable as exc:
        raise StoreError(str(exc)) from None
    if not where.run.in_store:
        return recipe, where, None
    from hf_pretrain.store.run.run_sync import RunInStore, pull_here, wait_for_pull

    # One process pulls a machine's copy (the job's first also takes the lease and uploads); the others
    # of that machine wait for it, so that none reads the copy half pulled.
    store = None
    # a run going further under --resume auto starts from a checkpoint older than the newest: pulled too
    max_steps = recipe.train.max_steps if recipe.checkpoints.resume == "auto" else None
    if os.environ.get("RANK", "0") == "0":
        store = RunInStore.begin(where.run, recipe.store, recipe.checkpoints, max_steps=max_steps)
    elif os.environ.get("LOCAL_RANK", "0") == "0":
        pull_here(where.run, max_steps=max_steps)
    else:
        wait_for_pull(where.run)
    copy = str(where.run.local)  # what trains below this door: a local folder, the store's side is `store`
    return recipe.replace(output_dir=copy), Where(Location(copy, in_store=False), where.data), store


def main(argv: list[str] | None = None) -> int:
    """The exit code: 0, or one a scheduler can act on (exit_codes.py); status.json says the same. Under
    `hf-pretrain launch`, also left where the wrapper reads it (engines/exit_file.py): a launcher would
    turn it into its own."""
    leave_pid()
    code = EXIT_FAILED  # an uncaught exception: its traceback says what
    try:
        code = _main(argv)
    except SystemExit as exc:  # the parser's refusal of a flag (EXIT_USAGE), --help (0)
        code = exc.code if isinstance(exc.code, int) else EXIT_FAILED
        raise
    finally:
        leave_exit_code(code)
    return code


def _main(argv: list[str] | None) -> int:
    recipe, _ = parse_recipe_args(argv, prog="hf-pretrain train", description=__doc__.split("\n")[0])
    from hf_pretrain.store.run.run_record import with_remembered_data

    say = print if os.environ.get("RANK", "0") == "0" else lambda line: None  # every process reads it, one says it
    where = Where.of(recipe)  # where the run and the data live: decided here, once, and handed down
    recipe, where = with_remembered_data(recipe, where, sys.argv[1:] if argv is None else argv, say)
    from hf_pretrain.training.session import REFUSALS, RunLocked, describe, exit_code_of
    from hf_pretrain.training.start_up import StoppedDuringStartUp

    try:
        return run_training(recipe, where).exit_code
    except (RunLocked, StoppedDuringStartUp, *REFUSALS) as exc:  # nothing was trained: the reason is the whole story
        print(f"train.py: {describe(exc)}", file=sys.stderr)
        return exit_code_of(exc)


if __name__ == "__main__":
    sys.exit(main())
