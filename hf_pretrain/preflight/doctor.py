"""`hf-pretrain doctor --recipe NAME [--key value ...]`: check the plumbing of a run before paying for it.

It takes exactly the arguments of training, so it checks the run that would start: package
versions, CUDA / bf16 / TF32, the prepared data against the recipe, a loader that survives
worker processes, a writable output folder with room for the checkpoints and the export, the
estimated GPU memory, and the time and cost of the run. It prints one row per check (pass, warn,
fail, skip) with the reason and the fix, and exits non-zero when any check fails. Training runs
the same checks first (`hf_pretrain.preflight.checks.preflight`).
"""

from __future__ import annotations

import argparse
import os
import sys

from hf_pretrain.config import parse_recipe_args
from hf_pretrain.exit_codes import EXIT_CONFIG, EXIT_OK

__all__ = ["main"]


def _doctor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--num_processes",
        type=int,
        ge=1,
        default=int(os.environ.get("WORLD_SIZE", "1")),
        help="processes the run will use (the batch must split over them); WORLD_SIZE when set",
    )


def main(argv: list[str] | None = None) -> int:
    recipe, args = parse_recipe_args(
        argv, prog="hf-pretrain doctor", description=__doc__.split("\n")[0], extra=_doctor_arguments
    )
    from hf_pretrain.store.urls import StoreUnavailable, check_locations

    try:  # a malformed URL is one line, not a table (nor a traceback from a check that needs its copy)
        check_locations(recipe.train.output_dir, recipe.data.data_dir)
    except StoreUnavailable as exc:
        print(f"hf-pretrain doctor: refused: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    from hf_pretrain.store.location import Where
    from hf_pretrain.store.run.run_record import with_remembered_data

    where = Where.of(recipe)  # where the run and the data live: decided here, once, and handed down
    # the data training would read: a run URL's own record when the command names no --data_dir
    recipe, where = with_remembered_data(recipe, where, sys.argv[1:] if argv is None else argv, print)
    print(
        f"hf-pretrain doctor: recipe `{recipe.name}`, {args.num_processes} process(es), "
        f"data {recipe.data.data_dir}, output {recipe.train.output_dir}\n"
    )
    for note in recipe.notes():  # what a shortened run leaves out
        print(f"{note}\n")
    # the checks import torch and try the loader in worker processes: seconds, a minute on a loaded machine
    print("loading torch and running the checks...", flush=True)
    from hf_pretrain.economics.resolved_run import ResolvedRun
    from hf_pretrain.machine.run_profile import this_machine
    from hf_pretrain.preflight.checks import run_checks
    from hf_pretrain.preflight.result import format_table

    # the doctor's door: which machine this is, asked once, and the run's profile handed to every row
    results = run_checks(recipe, ResolvedRun.at_door(recipe, this_machine(), where, args.num_processes))
    from hf_pretrain.checkpoints.resume_decision import finished_at
    from hf_pretrain.checkpoints.resume_plan import GO_FURTHER
    from hf_pretrain.preflight.store_access import finished_in_store

    # the same command after the run completed: not "ready to train"
    step = (
        finished_in_store(recipe.train, recipe.checkpoints)
        if where.run.in_store
        else finished_at(recipe.train, recipe.checkpoints)
    )
    finished = None if step is None else f"the run finished at step {step:,}, nothing to train. {GO_FURTHER}"
    print(format_table(results, finished))
    return EXIT_CONFIG if any(r.status == "fail" for r in results) else EXIT_OK  # what training would exit


if __name__ == "__main__":
    sys.exit(main())
