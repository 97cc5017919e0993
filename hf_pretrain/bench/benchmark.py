"""`hf-pretrain bench`: tokens/s, MFU, memory, data wait and $ per billion tokens of recipe variants.

    hf-pretrain bench --recipe 1b --variants gradient_checkpointing=true,false micro_batch_size=8,16
    hf-pretrain bench --recipe smoke --steps 12 --warmup 4 --memory_gib 2 --output runs/bench-smoke

Every variant is a short run of the real training loop (`hf_pretrain.train.run_training`) in its own
process: Accelerate's state is a process singleton, and a fresh process also gives each variant a
clean peak-memory count. `--variants` takes KEY=V1,V2 axes of recipe keys and runs every
combination; the recipe as written always runs first and is the baseline. Throughput is read
from the run's metrics.jsonl (which leaves checkpoint writes out), the first `--warmup` steps
excluded.

Then it looks for the largest micro-batch that fits without gradient checkpointing: doubling from
the recipe's micro_batch_size until a probe fails, then bisecting. A probe fails on a CUDA
out-of-memory error, on a preflight memory verdict, or when its peak memory exceeds `--memory_gib`
(on the CPU, where nothing runs out, the budget is the only limit and the peak is the process's
peak RSS). Only micro-batches that divide the recipe's batch are tried, since a larger one would
change the global batch, not just its speed. The largest one is then measured like any variant,
and the bench says whether the recipe's settings leave speed on the table.

Results go to `--output`: bench.json (every field) and bench.md (the tables).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from hf_pretrain.bench.measure import add_money_and_mfu, measured_matmul_flops
from hf_pretrain.bench.results import advice, markdown_report
from hf_pretrain.bench.search import ProbeError, search_micro_batch
from hf_pretrain.bench.variants import VariantRunner, is_recipe_as_written, run_in_this_process, variant_grid
from hf_pretrain.config import Recipe, RecipeError, build_recipe, parse_recipe_args
from hf_pretrain.data import DataMismatchError, check_prepared_data, prepare
from hf_pretrain.economics.prices import PriceError, price_table
from hf_pretrain.hardware import best_match, device_name, device_peak_flops
from hf_pretrain.model import recipe_flops_per_token


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
    group.add_argument("--steps", type=int, default=20, help="optimizer steps per variant")
    group.add_argument("--warmup", type=int, default=5, help="first steps left out of the timing")
    group.add_argument("--output", default=None, help="results folder (unset: runs/bench-RECIPE)")
    group.add_argument("--prices", default=None, help="price table YAML (unset: hf_pretrain/economics/prices.yaml)")
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
        default=None,
        help="memory budget for the micro-batch search (GPU: on top of running out of memory; "
        "CPU: required for a search, against the process's peak RSS)",
    )
    group.add_argument("--no_search", action="store_true", help="skip the largest-micro-batch search")
    group.add_argument("--worker_result", default=None, help=argparse.SUPPRESS)


def recipe_with_data(recipe: Recipe, out: Path, steps: int, say: Callable[[str], None]) -> Recipe:
    """The recipe itself when its data is prepared, else the recipe on a slice of its corpus in `out`."""
    try:
        check_prepared_data(recipe)
        return recipe
    except (DataMismatchError, FileNotFoundError) as exc:
        say(f"the recipe's data cannot be used ({exc})")
    sliced = build_recipe(
        recipe.to_dict(), {"data_dir": str(out / "data"), "max_tokens": (steps + 1) * recipe.train.global_batch_tokens}
    )
    say(f"preparing {sliced.data.max_tokens:,} tokens of the recipe's corpus in {sliced.data.data_dir}")
    prepare(sliced, log=say)
    return sliced


def main(argv: list[str] | None = None) -> int:
    recipe, args = parse_recipe_args(
        argv,
        prog="hf-pretrain bench",
        description=__doc__.split("\n")[0],
        extra=add_bench_arguments,
    )
    if args.worker_result:
        return run_in_this_process(recipe, Path(args.worker_result))
    if not 0 <= args.warmup < args.steps:
        print("hf-pretrain bench: error: --warmup must be at least 0 and below --steps", file=sys.stderr)
        return 2
    try:
        prices = price_table(args.prices, args.gpu_price)
        grid = variant_grid(args.variants)
    except (PriceError, RecipeError) as exc:
        print(f"hf-pretrain bench: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.output or f"runs/bench-{recipe.name}")
    out.mkdir(parents=True, exist_ok=True)
    say = print
    recipe = recipe_with_data(recipe, out, args.steps, say)

    # ---- the recipe as written first (the baseline), then every combination asked for
    runner = VariantRunner(recipe, out, args.steps, args.warmup, say)
    for overrides in [{}] + [point for point in grid if not is_recipe_as_written(recipe, point)]:
        runner.run(overrides)

    # ---- the largest micro-batch without checkpointing, measured like a variant when it is new
    search, search_error = None, None
    if args.no_search:
        say("micro-batch search skipped (--no_search)")
    elif not torch.cuda.is_available() and args.memory_gib is None:
        say("micro-batch search skipped: on the CPU it needs a budget (--memory_gib)")
    else:
        say("largest micro-batch without gradient checkpointing:")
        try:
            search = search_micro_batch(recipe, runner.short_run, out / "search", args.memory_gib, say)
        except ProbeError as exc:
            search_error = str(exc)
            say(f"micro-batch search stopped: {exc}")
        best = {"micro_batch_size": search.largest_fitting if search else None, "gradient_checkpointing": False}
        if best["micro_batch_size"] and not runner.has_run(best):
            runner.run(best)

    # ---- peaks, money and the verdict. CUDA is touched in this process only now, so that the
    # children above had the whole GPU.
    variants = runner.results
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = device_name(device)
    matmul_flops, matmul_with = measured_matmul_flops(device)
    datasheet = device_peak_flops(device)
    n_params, per_token = recipe_flops_per_token(recipe)
    for variant in variants:
        add_money_and_mfu(variant, datasheet, matmul_flops, prices)
        if variant.tokens_per_s and variants[0].tokens_per_s:
            variant.speedup_vs_recipe = variant.tokens_per_s / variants[0].tokens_per_s - 1
    left_on_table, notes = advice(recipe, variants, search)
    result = {
        "recipe": recipe.name,
        "device": name,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "parameters": n_params,
        "flops_per_token": per_token,
        "steps": args.steps,
        "warmup": args.warmup,
        "tokens_per_step": recipe.train.global_batch_tokens,
        "peak_flops": {"datasheet": datasheet, "measured": matmul_flops, "measured_with": matmul_with},
        "prices": prices,
        "price_entry_of_device": best_match(name, prices) if device.type == "cuda" else None,
        "variants": [asdict(v) for v in variants],
        "micro_batch_search": asdict(search) if search else None,
        "micro_batch_search_error": search_error,
        "leaves_speed_on_the_table": left_on_table,
        "advice": notes,
    }
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    table = markdown_report(result)
    (out / "bench.md").write_text(table)
    say("\n" + table + f"\nwritten: {out / 'bench.json'}, {out / 'bench.md'}")
    return 0 if variants[0].status == "ok" else 1
