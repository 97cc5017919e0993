"""`hf-pretrain plan`: tokens, FLOPs, time and money of a run before it starts, on 1..N GPUs; or what
going further would buy a run that is under way.

    hf-pretrain plan --recipe 1b                      # tokens, FLOPs, Chinchilla; time and cost when the recipe knows
    hf-pretrain plan --recipe 1b --gpu all            # every offer of SkyPilot's catalog (else every GPU of the
                                                      # table), fitted, modelled, ranked by the run's expected $
    hf-pretrain plan --recipe 1b --gpu all --skypilot_task my-1b.yaml   # ... and the SkyPilot task renting them
    hf-pretrain plan --recipe 1b --gpu H100 --max_steps 120000   # any recipe key overrides, as in training
    hf-pretrain plan --params 1.04e9 --tokens 20e9 --tokens_per_s 40000 --price_per_gpu_hour 2.99 --max_gpus 8 --json
    hf-pretrain plan --run runs/1b --tokens 20.8e9    # from the run's own loss curve, pace and price

Every number comes from a pure function below, so the tests check them against hand-computed
values. With a recipe and a GPU, the fit comes from the memory estimate (memory.fit_in_memory) and
the tokens/s from the performance model (performance.py): an estimate, checked against published
runs, until `hf-pretrain bench` measures it. The multi-GPU model is deliberately simple and pessimistic: data parallelism with one ring
all-reduce of the gradients per optimizer step, *not* overlapped with compute (DDP overlaps part
of it with the backward pass, so real runs land between the compute-only and the total figure).
It shows the trade: more GPUs buy time, never money.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hf_pretrain.config import CommandParser, Recipe, RecipeError, parse_recipe_args
from hf_pretrain.economics.memory import GRADIENT_BYTES
from hf_pretrain.economics.planning.data_parallel import INTERCONNECT_GBPS
from hf_pretrain.economics.planning.further import plan_further
from hf_pretrain.economics.planning.offers import OfferRow, task_candidates
from hf_pretrain.economics.planning.plan import NO_CATALOG, Plan, make_plan
from hf_pretrain.economics.planning.printing import DEFAULT_OFFERS_SHOWN, format_further, format_plan
from hf_pretrain.economics.planning.request import DEFAULT_GLOBAL_BATCH_TOKENS, DEFAULT_MFU, FIT_KEYS, PlanRequest
from hf_pretrain.economics.prices import PriceError
from hf_pretrain.economics.skypilot_catalog import DEFAULT_CATALOG
from hf_pretrain.engines.skypilot_task import MAX_CANDIDATES, Candidate, TaskExists, planned_task, write_task
from hf_pretrain.exit_codes import EXIT_CONFIG

PROG = "hf-pretrain plan"
# The three ways to name what is planned; a recipe takes every recipe key as `--key value` on top.
MODEL_FLAGS = ("--recipe", "--params", "--run")
# Flags whose values a PlanRequest takes as they are, with a recipe or without.
PLAN_OPTIONS = (
    "tokens",
    "gpu",
    "prices",
    "price_per_gpu_hour",
    "tokens_per_s",
    "mfu",
    "max_gpus",
    "interconnect",
    "interconnect_gbps",
    "gradient_bytes",
    "catalog",
    "preemptions_per_hour",
    "relaunch_s",
    "store",
)


def add_rate_and_price(group: argparse._ArgumentGroup) -> None:
    """The flags that stand in for the plan's rate and price."""
    group.add_argument(
        "--price_per_gpu_hour",
        type=float,
        ge=0,
        help="$ per GPU-hour of the one --gpu (unset: its typical price in the table, else the recipe's price_per_hour)",
    )
    group.add_argument(
        "--tokens_per_s",
        type=float,
        gt=0,
        help="measured tokens/s of one GPU (unset: the recipe's expected_tokens_per_s, else --gpu's peak x --mfu)",
    )
    group.add_argument(
        "--mfu",
        type=float,
        gt=0,
        le=1,
        help=f"with --params and --gpu: assumed model FLOPs utilisation (unset: {DEFAULT_MFU}); a recipe is modelled",
    )


def add_plan_options(parser: argparse.ArgumentParser, with_recipe: bool) -> None:
    """The command's own flags. With a recipe, `--global_batch_tokens` and `--price_per_hour` are the
    recipe's keys (its batch, its price), so the plan's flags of those names are left out."""
    group = parser.add_argument_group("plan options")
    group.add_argument(
        "--tokens",
        type=float,
        gt=0,
        help="token budget (unset: the recipe's max_steps x global_batch_tokens, else 20 x params; "
        "with --run, 20 x the run's parameters)",
    )
    if not with_recipe:
        group.add_argument(
            "--global_batch_tokens",
            type=int,
            ge=1,
            help=f"tokens per optimizer step with --params (unset: {DEFAULT_GLOBAL_BATCH_TOKENS:,})",
        )
    group.add_argument(
        "--gpu",
        help="a GPU of the table (hf_pretrain/machine/gpus.yaml), e.g. H100: its fit, modelled rate and price, "
        "and the several-GPU table; `all`: every GPU of the table ranked by the run's dollars (with --recipe)",
    )
    group.add_argument(
        "--prices",
        help="YAML of GPU names to $ per GPU-hour, overriding the table's typical prices of the GPUs it names",
    )
    add_rate_and_price(group)
    group.add_argument("--max_gpus", type=int, default=8, ge=1, help="table rows for 1..N GPUs")
    group.add_argument(
        "--interconnect",
        choices=sorted(INTERCONNECT_GBPS),
        default="nvlink",
        help="link between the GPUs: " + ", ".join(f"{k} {v:,.0f} Gbit/s" for k, v in INTERCONNECT_GBPS.items()),
    )
    group.add_argument(
        "--interconnect_gbps",
        type=float,
        gt=0,
        help="link rate in Gbit/s per GPU, one direction (overrides --interconnect)",
    )
    group.add_argument(
        "--gradient_bytes",
        type=float,
        gt=0,
        default=GRADIENT_BYTES,
        help="bytes per parameter all-reduced each step (4: fp32 gradients; 2 with a bf16 compression hook)",
    )
    if not with_recipe:
        group.add_argument(
            "--price_per_hour",
            type=float,
            ge=0,
            help="with --run: $ per hour of the whole job (unset: the run's price_per_hour)",
        )
    add_catalog_options(group)
    group.add_argument("--json", action="store_true", help="print the plan as JSON")


def add_catalog_options(group: argparse._ArgumentGroup) -> None:
    """The flags of `--gpu all` that price SkyPilot's offers and write the task that rents them."""
    group.add_argument(
        "--catalog",
        help=f"with --gpu all: SkyPilot's price catalog folder (<cloud>/vms.csv; unset: {DEFAULT_CATALOG} where "
        f"`sky check` wrote it; `{NO_CATALOG}`: the GPU table's typical prices)",
    )
    group.add_argument(
        "--preemptions_per_hour",
        type=float,
        ge=0,
        help="with --gpu all: spot preemptions an hour, every cloud (unset: each cloud's estimate, economics/spot.yaml)",
    )
    group.add_argument(
        "--relaunch_s",
        type=float,
        gt=0,
        help="with --gpu all: seconds from a preemption to the next machine's first step (unset: an estimate)",
    )
    group.add_argument(
        "--store",
        help="with --gpu all: the run's store as PROVIDER[:REGION] of economics/egress.yaml, e.g. aws_s3:us-east-1 "
        "(unset: the output_dir's scheme's provider, region unknown): a GPU elsewhere pays its egress",
    )
    group.add_argument(
        "--offers", type=int, default=DEFAULT_OFFERS_SHOWN, ge=1, help="with a catalog: how many offers to print"
    )
    group.add_argument(
        "--skypilot_task",
        help="with --recipe and --gpu all: write a SkyPilot task renting the cheapest offers by expected $ per token "
        "(resources.ordered; never over an existing file)",
    )


# `--help`: the docstring's first sentence (two lines) above the options, its examples and notes below
DESCRIPTION, EPILOG = (part.strip("\n") for part in __doc__.split("\n\n", 1))


def build_parser() -> argparse.ArgumentParser:
    """The parser without a recipe (`--params`, `--run`); `--recipe` is parsed with the recipe's keys
    (`main`), and stays here for `--help` and for the error when no model is named."""
    parser = CommandParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG)
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument(
        "--recipe",
        help="recipe name or YAML path: parameters from a meta-device build; every recipe key may follow as "
        "--key value (`hf-pretrain plan --recipe NAME --help` lists them)",
    )
    model.add_argument("--params", type=float, gt=0, help="parameter count, e.g. 1.04e9 (FLOPs per token then 6N)")
    model.add_argument("--run", help="a run folder: what going on to --tokens would buy, from its loss curve so far")
    add_plan_options(parser, with_recipe=False)
    return parser


def _named(flag: str, argv: list[str]) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in argv)


def pinned_keys(argv: list[str]) -> tuple[str, ...]:
    """The FIT_KEYS the command line sets (snake or kebab case): they win over the fit search."""
    return tuple(key for key in FIT_KEYS if _named(f"--{key}", argv) or _named(f"--{key.replace('_', '-')}", argv))


def plan_request(args: argparse.Namespace, recipe: Recipe | None, pinned: tuple[str, ...] = ()) -> PlanRequest:
    """The typed request of parsed flags (`recipe`: the one `--recipe` and its overrides resolved to)."""
    options = {name: getattr(args, name) for name in PLAN_OPTIONS}
    if recipe is not None:
        return PlanRequest(recipe=recipe, pinned=pinned, **options)
    return PlanRequest(params=args.params, global_batch_tokens=args.global_batch_tokens, **options)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    named = [flag for flag in MODEL_FLAGS if _named(flag, argv)]
    if len(named) > 1:
        print(f"{PROG}: error: {' and '.join(named)} name two things to plan: give one", file=sys.stderr)
        return EXIT_CONFIG
    try:
        if named == ["--recipe"]:
            recipe, args = parse_recipe_args(
                argv,
                prog=PROG,
                description=DESCRIPTION,
                extra=lambda parser: add_plan_options(parser, with_recipe=True),
            )
            request = plan_request(args, recipe, pinned_keys(argv))
        else:
            args = build_parser().parse_args(argv)
            if args.run:
                further = plan_further(args.run, args.tokens, args.price_per_hour)
                print(json.dumps(further.to_dict(), indent=1) if args.json else format_further(further))
                return 0
            if args.price_per_hour is not None:
                raise ValueError("--price_per_hour goes with --run (with --params, give --price_per_gpu_hour)")
            request = plan_request(args, recipe=None)
        if request.recipe is not None:  # its parameters are counted on torch's meta device: minutes when loaded
            # a progress line, not an error: on stdout (stderr keeps refusals to one line), unless stdout is JSON
            progress = sys.stderr if args.json else sys.stdout
            print(f"{PROG}: counting the recipe's parameters (loading torch)...", file=progress, flush=True)
        plan = make_plan(request)
    except (RecipeError, PriceError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(json.dumps(plan.to_dict(), indent=1) if args.json else format_plan(plan, args.offers))
    if getattr(args, "skypilot_task", None):
        return write_skypilot_task(plan, request, Path(args.skypilot_task))
    return 0


def skypilot_candidates(rows: list[OfferRow]) -> list[Candidate]:
    """The plan's cheapest offers as a task's candidates, each with its figures beside it."""
    return [
        Candidate(
            row.cloud,
            row.accelerator,
            row.gpus,
            row.spot,
            row.price_per_hour,
            f"{row.card}: ${row.usd_per_billion_tokens:,.2f} per 1B tokens expected (${row.price_per_hour:,.2f}/h "
            f"in {row.region})",
        )
        for row in task_candidates(rows, MAX_CANDIDATES)
    ]


def write_skypilot_task(plan: Plan, request: PlanRequest, path: Path) -> int:
    """`--skypilot_task PATH`: the task renting the plan's cheapest offers, never over an existing file."""
    if request.recipe is None or plan.offers is None:
        print(
            f"{PROG}: error: --skypilot_task needs --recipe NAME --gpu all and SkyPilot's catalog "
            f"(`sky check` writes it to {DEFAULT_CATALOG}; or --catalog FOLDER); {plan.prices_source or 'none read'}",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    candidates = skypilot_candidates(plan.offers.rows)
    try:
        text = planned_task(request.recipe.name, candidates, plan.prices_source, time.strftime("%Y-%m-%d"))
        write_task(path, text)
    except (TaskExists, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as exc:  # a folder that is not there, or not writable: where to write it instead
        fix = f"mkdir -p {path.parent}" if isinstance(exc, FileNotFoundError) else "give a path you can write"
        print(f"{PROG}: error: cannot write {path}: {exc.strerror or exc}; fix: {fix}", file=sys.stderr)
        return EXIT_CONFIG
    print(
        f"wrote {path}: {len(candidates)} candidates, cheapest expected $ per token first; launch it with "
        f"`sky jobs launch {path} --env RUN_URL=s3://BUCKET/runs/NAME --env DATA_URL=s3://BUCKET/data/NAME "
        f"--secret AWS_ACCESS_KEY_ID --secret AWS_SECRET_ACCESS_KEY` (docs/engines.md)"
    )
    return 0
