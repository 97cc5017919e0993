"""`hf-pretrain bench`: tokens/s, MFU, memory, data wait and $ per billion tokens of recipe variants.

    hf-pretrain bench --recipe 1b --variants gradient_checkpointing=true,false micro_batch_size=8,16
    hf-pretrain bench --recipe smoke --steps 12 --warmup 4 --memory_gib 2 --output runs/bench-smoke
    hf-pretrain bench --recipe smoke --quality --variants optimizer=adamw,muon --seeds 1,2 --steps 300

Every variant is a short run of the real training loop (`hf_pretrain.train.run_training`) in its own
process: Accelerate's state is a process singleton, and a fresh process also gives each variant a
clean peak-memory count. `--variants` takes KEY=V1,V2 axes of recipe keys and runs every
combination; the recipe as written always runs first and is the baseline. Throughput is read
from the run's metrics.jsonl (which leaves checkpoint writes out), the first `--warmup` steps
excluded.

Then it looks for the largest micro-batch that fits without gradient checkpointing: doubling from
the recipe's micro_batch_size until a probe fails, then bisecting. Every probe is tried on the
device, whatever the memory estimate says: it fails when the device runs out of memory (the error
is the answer) or when its peak memory exceeds `--memory_gib` (on the CPU, where nothing runs out,
the budget is the only limit and the peak is the process's peak RSS). Only micro-batches that divide the recipe's batch are tried, since a larger one would
change the global batch, not just its speed. The largest one is then measured like any variant,
and the bench says whether the recipe's settings leave speed on the table.

Money: $ per billion tokens measured for the GPU it ran on; the table's other GPUs get the
performance model's figure scaled by this card's measured / modelled, labelled estimates; a CPU
prices no GPU. On a GPU, each variant's tokens/s and peak memory are recorded for `plan` and the
doctor (economics/measurements.py).

Results go to `--output`: bench.json (every field) and bench.md (the tables). One bench at a time in a
folder: a second one into the same `--output` is refused with exit 73, naming the one that holds it
(the lock of training folders, run_lock.py).

`--quality` measures loss per token instead (bench/quality.py): finished models of each variant at
several lengths, over seeds, and the tokens and dollars a variant saves to reach the baseline's loss.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hf_pretrain.config import Recipe, RecipeError, parse_recipe_args
from hf_pretrain.economics.prices import PriceError, price_table
from hf_pretrain.exit_codes import EXIT_CONFIG, EXIT_FAILED, EXIT_LOCKED, EXIT_OK
from hf_pretrain.run_folder.run_dir import RunDir
from hf_pretrain.run_folder.run_lock import RunDirUnusable, RunLock, RunLocked

if TYPE_CHECKING:  # the bench's modules import torch, loaded once the flags are read (`--help` needs none)
    from hf_pretrain.bench.quality import QualityRequest
    from hf_pretrain.bench.sweep import BenchRequest

PROG = "hf-pretrain bench"


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("bench options")
    group.add_argument(
        "--variants",
        nargs="+",
        default=[],
        metavar="KEY=V1,V2",
        help="recipe keys to vary, every combination runs (e.g. gradient_checkpointing=true,false "
        "compile=false micro_batch_size=4,8); the recipe as written always runs first",
    )
    group.add_argument("--steps", type=int, default=20, ge=1, help="optimizer steps per variant")
    group.add_argument("--warmup", type=int, default=5, ge=0, help="first steps left out of the timing")
    group.add_argument("--output", default=None, help="results folder (unset: runs/bench-RECIPE)")
    group.add_argument(
        "--prices", default=None, help="price table YAML (unset: the typical prices of hf_pretrain/machine/gpus.yaml)"
    )
    group.add_argument(
        "--gpu_price",
        action="append",
        default=[],
        metavar="NAME=USD_PER_HOUR",
        help="add or override a price-table entry (one GPU's $/hour); repeatable",
    )
    group.add_argument(
        "--memory_gib",
        type=float,
        gt=0,
        default=None,
        help="memory budget for the micro-batch search (GPU: on top of running out of memory; "
        "CPU: required for a search, against the process's peak RSS)",
    )
    group.add_argument("--no_search", action="store_true", help="skip the largest-micro-batch search")
    quality = parser.add_argument_group("quality mode (loss per token instead of speed; bench/quality.py)")
    quality.add_argument(
        "--quality",
        action="store_true",
        help="train each variant to finished models at --points lengths up to --steps, over --seeds, and "
        "print the tokens (and dollars) each saves to reach the first variant's final loss",
    )
    quality.add_argument("--seeds", default="1,2", help="quality: comma-separated seeds (init and data order)")
    quality.add_argument("--points", type=int, default=4, ge=1, help="quality: finished models per variant and seed")
    quality.add_argument(
        "--gpu", default=None, help="quality: price the saving on this GPU's plan (`hf-pretrain plan`)"
    )
    group.add_argument("--worker_result", default=None, help=argparse.SUPPRESS)


def bench_request(recipe: Recipe, args: argparse.Namespace) -> BenchRequest:
    """The typed request of parsed flags; raises PriceError, RecipeError or ValueError naming the flag."""
    from hf_pretrain.bench.sweep import BenchRequest
    from hf_pretrain.bench.variants import variant_grid
    from hf_pretrain.store.location import Where

    return BenchRequest(
        recipe=recipe,
        data=Where.of(recipe).data,  # where its data lives: decided here, once, and handed down
        output=Path(args.output or f"runs/bench-{recipe.name}"),
        variants=variant_grid(args.variants),
        prices=price_table(args.prices, args.gpu_price),
        steps=args.steps,
        warmup=args.warmup,
        memory_gib=args.memory_gib,
        search=not args.no_search,
    )


def quality_request(recipe: Recipe, args: argparse.Namespace) -> QualityRequest:
    from hf_pretrain.bench.quality import QualityRequest, shipped_recipe
    from hf_pretrain.bench.variants import variant_grid
    from hf_pretrain.store.location import Where

    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise ValueError(
            f"--seeds {args.seeds!r} must be whole numbers separated by commas, e.g. --seeds 1,2"
        ) from None
    return QualityRequest(
        recipe=recipe,
        shipped=shipped_recipe(recipe.name),
        data=Where.of(recipe).data,  # where its data lives: decided here, once, and handed down
        output=Path(args.output or f"runs/bench-quality-{recipe.name}"),
        variants=variant_grid(args.variants),
        seeds=seeds,
        steps=args.steps,
        points=args.points,
        gpu=args.gpu,
    )


def hold_output(output: Path) -> int | None:
    """Lock `output` for this bench until the process ends (the kernel drops the lock however it ends),
    or say why not and return the exit code: 73 when another bench holds it."""
    try:
        RunLock(RunDir(output), kind="bench", flag="--output").acquire()
    except RunLocked as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    except RunDirUnusable as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return None


def main(argv: list[str] | None = None) -> int:
    recipe, args = parse_recipe_args(
        argv,
        prog=PROG,
        description=__doc__.split("\n")[0],
        extra=add_bench_arguments,
    )
    from hf_pretrain.bench.quality import run_quality
    from hf_pretrain.bench.sweep import run_bench
    from hf_pretrain.bench.variants import run_in_this_process
    from hf_pretrain.data.prepared import DataMismatchError

    if args.worker_result:  # a variant's child process (variants.run_in_child)
        return run_in_this_process(recipe, Path(args.worker_result))
    if args.quality:
        try:
            quality = quality_request(recipe, args)
        except (RecipeError, ValueError) as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        refused = hold_output(quality.output)
        if refused is not None:
            return refused
        result = run_quality(quality)
        return EXIT_OK if all(not c["failed"] for c in result["curves"]) else EXIT_FAILED
    try:
        request = bench_request(recipe, args)
    except (PriceError, RecipeError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    refused = hold_output(request.output)
    if refused is not None:
        return refused
    try:
        result = run_bench(request)
    except DataMismatchError as exc:  # the slice of the corpus it prepared is too small to hold out validation
        print(
            f"{PROG}: error: {exc}; or prepare the recipe's data first: hf-pretrain prepare --recipe {recipe.name}",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    return EXIT_OK if result["variants"][0]["status"] == "ok" else EXIT_FAILED
