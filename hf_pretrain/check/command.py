"""`hf-pretrain check`: is this pod worth renting for this recipe? Five minutes, no prepared data.

    hf-pretrain check --recipe 1b                              # the default budget: 300 s
    hf-pretrain check --recipe 1b --price_per_hour 2.10 --variants mixed_precision=bf16,fp8
    hf-pretrain check --recipe smoke --budget_s 60              # on a CPU: every part says a figure or why not

Most important first, each part in its own process under its own share of `--budget_s` (what a part
leaves unused goes to the ones after it; `--part_limit_s` caps every part, for a quick look): (a) the
matmul peak, bf16 and FP8; (b) SDPA's kernels on the recipe's attention shape; (c) the recipe's step on
synthetic tokens as configured, then each `--variants` point (one compile each); (d) the largest
micro-batch by real out-of-memory errors; (e) the write and read speed of output_dir's volume at a
checkpoint's size; (f) download and upload rates where data_dir or output_dir is an object store
URL; (g) all-reduce bandwidth when several GPUs are visible. A part that overruns is cut and says so;
what it measured before is kept. Then the verdict (check/verdict.py), every figure into the
measurement store labelled with card, versions and date (economics/check_records.py; on a GPU the
step's tokens/s also as a measurement `plan` reads), and `--output`/check.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hf_pretrain.check.deadline import run_part
from hf_pretrain.check.figures import Figure, read_figures
from hf_pretrain.config import Recipe, RecipeError, build_recipe, parse_recipe_args, save_recipe
from hf_pretrain.exit_codes import EXIT_CONFIG, EXIT_FAULTY_HOST, EXIT_INTERRUPTED, EXIT_PREEMPTED
from hf_pretrain.publish.targets import WRITTEN_RECORD, not_ours, record_written, unwritable_reason

PROG = "hf-pretrain check"
# (part, share of what is left of the budget relative to the parts after it, what it measures); the
# step's share grows with its variants (STEP_SHARE_PER_VARIANT each: one compile and a few steps)
PARTS = (
    (
        "health",
        0.1,
        "(h) the GPU's health: NVML (ECC, remapped rows, clocks, temperature, PCIe), a sustained matmul, Xid",
    ),
    ("matmul", 0.05, "(a) matmul peak"),
    ("attention", 0.07, "(b) SDPA kernels on the recipe's attention shape"),
    ("step", 0.25, "(c) the recipe's step"),
    ("micro_batch", 0.18, "(d) largest micro-batch"),
    ("disk", 0.08, "(e) output_dir's disk"),
    ("object_store", 0.03, "(f) object store"),
    ("all_reduce", 0.04, "(g) all-reduce"),
)
PART_NAMES = tuple(name for name, _, _ in PARTS)
MIN_PART_S = 2.0  # a part with less than this left is skipped, not started
STEP_SHARE_PER_VARIANT = 0.1
# A run of a part with several (the step's variants) may take this many times its even share of what is
# left: a compile takes what it takes, and what a run leaves goes to the runs after it.
RUN_STRETCH = 1.5


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's preemption, Slurm's `--signal`): the check ends as on Ctrl-C, the part running
    killed with its own session (check/deadline.py), which the signal to this process alone never reaches."""


def _terminated(signum, frame) -> None:
    raise Terminated


@dataclass(frozen=True)
class CheckRequest:
    recipe: Recipe
    output: Path
    budget_s: float = 300.0
    variants: tuple[dict, ...] = ()
    parts: tuple[str, ...] = PART_NAMES
    part_limit_s: float | None = None
    overwrite: bool = False  # replace an earlier check's results in `output`
    steps: int = 5  # timed optimizer steps per step variant
    warmup: int = 2  # the first holds the compile
    slower_than_plan: float | None = None  # a step this share under the plan's tokens/s for the card: faulty (71)


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("check options")
    group.add_argument(
        "--budget_s",
        type=float,
        default=300.0,
        gt=0,
        help="seconds for the whole check; parts that finish early leave theirs to the next",
    )
    group.add_argument(
        "--variants",
        nargs="+",
        default=[],
        metavar="KEY=V1,V2",
        help="recipe keys to vary in the step part, every combination (bench's syntax: mixed_precision=bf16,fp8)",
    )
    group.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="'KEY=V KEY2=V2'",
        help="one more step variant, its keys together (repeatable): --variant 'mixed_precision=fp8 fp8_recipe=rowwise'",
    )
    group.add_argument(
        "--parts", default=",".join(PART_NAMES), help=f"which parts, comma-separated: {','.join(PART_NAMES)}"
    )
    group.add_argument("--part_limit_s", type=float, default=None, gt=0, help="cap every part at this many seconds")
    group.add_argument("--steps", type=int, default=5, ge=1, help="timed optimizer steps per step variant")
    group.add_argument("--warmup", type=int, default=2, ge=1, help="untimed steps first (the first compiles)")
    group.add_argument(
        "--slower_than_plan",
        type=float,
        gt=0,
        lt=1,
        help="a recipe step this share (0.25: a quarter) under the tokens/s `plan` counts on for this card makes the "
        "machine a faulty host (exit 71: an engine rents another); unset: the verdict only says it",
    )
    group.add_argument(
        "--output",
        default=None,
        help="results folder: new, empty or an earlier check's (unset: runs/check-RECIPE); never a user's files",
    )
    group.add_argument(
        "--overwrite", action="store_true", help="replace an earlier check's results in --output (its files only)"
    )


def check_request(recipe: Recipe, args: argparse.Namespace) -> CheckRequest:
    """The typed request; raises RecipeError or ValueError naming the flag."""
    from hf_pretrain.bench.variants import variant_grid

    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    if not parts:  # nothing to measure: said here, not an IndexError in the budget's split (issue 57)
        raise ValueError(f"--parts {args.parts!r} names no part; choose from {','.join(PART_NAMES)}")
    unknown = [p for p in parts if p not in PART_NAMES]
    if unknown:
        raise ValueError(f"--parts {','.join(unknown)}: not a part; choose from {','.join(PART_NAMES)}")
    variants = tuple(variant_grid(args.variants)) if args.variants else ()
    for point in args.variant:
        if any("," in spec for spec in point.split()):
            raise ValueError(f"--variant {point!r} is one point: one value per key (--variants takes V1,V2)")
        variants += tuple(variant_grid(point.split()))
    for point in variants:
        build_recipe(recipe.to_dict(), point)  # a wrong key or value: one line now, not a failed part later
    request = CheckRequest(
        recipe=recipe,
        output=Path(args.output or f"runs/check-{recipe.name}"),
        budget_s=args.budget_s,
        variants=variants,
        parts=parts,
        part_limit_s=args.part_limit_s,
        overwrite=args.overwrite,
        steps=args.steps,
        warmup=args.warmup,
        slower_than_plan=args.slower_than_plan,
    )
    check_budget(request)
    check_output(request.output, request.overwrite)
    return request


def chosen_parts(request: CheckRequest) -> list[tuple[str, float, str]]:
    """(part, share, title) of each part asked for, in order; the step's share grown by its variants."""
    more = STEP_SHARE_PER_VARIANT * (len(part_runs(request, "step")) - 1)
    return [(p, s + more if p == "step" else s, t) for p, s, t in PARTS if p in request.parts]


def check_budget(request: CheckRequest) -> None:
    """Refuse, before any work, a budget (or a per-part cap) that leaves the first part under the
    MIN_PART_S a part needs: nothing at all would be measured."""
    chosen = chosen_parts(request)
    if request.part_limit_s is not None and request.part_limit_s < MIN_PART_S:
        raise ValueError(f"--part_limit_s {request.part_limit_s:g} leaves no part the {MIN_PART_S:.0f} s it needs")
    first, share, _ = chosen[0]
    floor = MIN_PART_S * sum(s for _, s, _ in chosen) / share
    if request.budget_s < floor:
        raise ValueError(
            f"--budget_s {request.budget_s:g} is too small to measure anything: its first part ({first}) would "
            f"get {request.budget_s * share / sum(s for _, s, _ in chosen):.1f} s of the {MIN_PART_S:.0f} s a part "
            f"needs; give at least --budget_s {math.ceil(floor)} (the default, 300, leaves every part room)"
        )


CHECK_COMMAND = "hf-pretrain check"  # the name in the record of what a check wrote (publish/targets.py)


def files_under(folder: Path) -> list[str]:
    """Every file under `folder`, relative, but the record of what a command wrote."""
    if not folder.is_dir():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != WRITTEN_RECORD)


def check_output(out: Path, overwrite: bool) -> None:
    """The check writes into a new or empty folder, or, with `overwrite`, one an earlier check wrote (its
    record there, the files unchanged since): as `space` does, never over a user's files. Raises ValueError."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--output {out} is a file, not a folder; choose another --output")
    unwritable = unwritable_reason(out)  # a read-only place: one line now, not an OSError from its mkdir (issue 57)
    if unwritable:
        raise ValueError(f"--output {out}: {unwritable}; choose another --output")
    clashes = not_ours(out, files_under(out), CHECK_COMMAND)
    if clashes:
        listed = ", ".join(clashes[:8]) + (f" and {len(clashes) - 8} more" if len(clashes) > 8 else "")
        raise ValueError(
            f"--output {out} holds files the check did not write or that changed since: {listed}; a check "
            f"writes only into a new or empty folder or an earlier check's. Choose another --output"
        )
    if files_under(out) and not overwrite:
        raise ValueError(
            f"--output {out} holds an earlier check's results; pass --overwrite to replace them "
            f"(its files only), or choose another --output"
        )


def remove_earlier_check(out: Path) -> None:
    """An earlier check's files in `out` (check_output proved them its own), then the folders they leave empty."""
    for name in files_under(out):
        (out / name).unlink()
    for folder in sorted((p for p in out.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    (out / WRITTEN_RECORD).unlink(missing_ok=True)


def part_runs(request: CheckRequest, part: str) -> list[dict]:
    """Each process a part runs: the step's variants (the recipe as written first), else one."""
    if part != "step":
        return [{}]
    return [{}] + [point for point in request.variants if point]


def run_parts(
    request: CheckRequest, recipe_file: Path, results: Path, statuses: dict[str, list[str]], say=print
) -> None:
    """Each part asked for, most important first, each run in its own process under its share of what is
    left of the budget; `statuses` gets {part: the status of each of its runs} as they end (a Ctrl-C
    leaves it holding those that did)."""
    from hf_pretrain.bench.variants import variant_name

    started = time.monotonic()
    chosen = chosen_parts(request)
    for index, (part, share, title) in enumerate(chosen):
        left = request.budget_s - (time.monotonic() - started)
        part_s = left * share / sum(s for _, s, _ in chosen[index:])
        if request.part_limit_s is not None:
            part_s = min(part_s, request.part_limit_s)
        say(f"{title} (limit {part_s:.0f} s):")
        statuses[part] = []
        part_started = time.monotonic()
        runs = part_runs(request, part)
        for run_index, item in enumerate(runs):
            part_left = part_s - (time.monotonic() - part_started)
            stretch = RUN_STRETCH if run_index < len(runs) - 1 else 1
            run_s = min(part_left, part_left / (len(runs) - run_index) * stretch)
            label = variant_name(item) if part == "step" else ""
            if run_s < MIN_PART_S:
                say(  # "1 s left" alone read as a reason to run it, not to skip it: say the floor and the fix
                    f"  {part}{f' ({label})' if label else ''}: skipped: {max(run_s, 0):.1f} s left of its limit, "
                    f"under the {MIN_PART_S:.0f} s a part needs; a larger --budget_s runs it"
                )
                statuses[part].append("skipped")
                continue
            context = {
                "recipe": str(recipe_file),
                "results": str(results),
                "folder": str(request.output / "scratch"),
                "limit_s": run_s,
                "item": item,
                "item_index": run_index,
                "steps": request.steps,
                "warmup": request.warmup,
            }
            status = run_part(part, context, request.output / "contexts", run_s, say, label)
            statuses[part].append(status)
            if status == "cut" and part == "step":  # its running rate, written but not yet said
                for kept in read_figures(results):
                    if kept.part == "step" and kept.name == label and kept.value:
                        say(f"  kept: {kept.text}")


def run_check(request: CheckRequest, say=print) -> dict:
    """Every part asked for within the budget, the verdict, the records; what check.json holds. A Ctrl-C
    ends the part running (its processes with it) and writes check.json with what was measured before,
    `"interrupted": true`, without a verdict or records."""
    out = request.output
    if request.overwrite:
        remove_earlier_check(out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "figures.jsonl"
    recipe_file = out / "recipe.yaml"
    save_recipe(request.recipe, recipe_file)
    say(f"check: recipe {request.recipe.name}, budget {request.budget_s:.0f} s, results in {out}")
    started = time.monotonic()
    statuses: dict[str, list[str]] = {}
    try:
        run_parts(request, recipe_file, results, statuses, say)
        interrupted = None
    except KeyboardInterrupt as exc:
        interrupted = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
        say(f"interrupted ({interrupted}): the part running was stopped; what the parts measured before is kept")
    figures = read_figures(results)
    lines = [] if interrupted else conclude(request.recipe, figures, say)
    result = {
        "recipe": request.recipe.name,
        "date": datetime.date.today().isoformat(),
        "budget_s": request.budget_s,
        "seconds": round(time.monotonic() - started, 1),
        "parts": statuses,
        "figures": [asdict(f) for f in figures],
        "verdict": lines,
    } | ({"interrupted": True, "stopped_by": interrupted} if interrupted else {})
    (out / "check.json").write_text(json.dumps(result, indent=1))
    record_written(out, files_under(out), CHECK_COMMAND)  # a later check may replace only these
    say(f"written: {out / 'check.json'} ({result['seconds']:.0f} s)")
    return result


def conclude(recipe: Recipe, figures: list[Figure], say=print) -> list[str]:
    """Say the verdict and keep every figure in the measurement store; the verdict's lines."""
    # torch and the economics: after the parse, not for --help
    from hf_pretrain.check.verdict import measured_device, plan_best, verdict
    from hf_pretrain.economics.check_records import StoreNotWritten, record_checks
    from hf_pretrain.machine.what_if import measured_card, profile_on

    say("verdict:")
    device = measured_device(figures)
    # the recipe's step on the card the parts measured (they ran in processes of their own): what it is priced
    # and keyed by; a CPU prices no card
    step = profile_on(recipe.step_as_written, measured_card(device)).step if device else None
    lines = verdict(
        figures,
        recipe.model,
        recipe.data,
        step=step,
        global_batch_tokens=recipe.train.global_batch_tokens,
        plan=plan_best(model=recipe.model, data=recipe.data, train=recipe.train, written=recipe.step_as_written),
        price_per_hour=recipe.reporting.price_per_hour,
        recipe_name=recipe.name,
    )
    for line in lines:
        say(f"  {line}")
    try:
        stored = record_checks(check_records(figures))
        recorded = record_step_measurements(recipe, figures)
    except StoreNotWritten as exc:
        say(f"recorded nothing: {exc}")
        return lines
    measured = len([f for f in figures if f.value is not None])
    say(
        f"recorded {measured} figure(s) in {stored}"
        if stored
        else "recorded nothing (no figure, or HF_PRETRAIN_RECORD=0)"
    )
    if recorded:
        say(f"  and {recorded} step measurement(s) for plan and the doctor (economics/measurements.py)")
    return lines


def check_records(figures: list[Figure]) -> list:
    from hf_pretrain.economics.check_records import new_record

    return [new_record(f.part, f.name, f.value, f.unit, f.device, **f.detail) for f in figures if f.value is not None]


def record_step_measurements(recipe: Recipe, figures: list[Figure]) -> int:
    """On a GPU, each step figure as the measurement of its configuration (`plan`, the doctor); none on a CPU."""
    from hf_pretrain.economics.measurements import configuration, record_measurement
    from hf_pretrain.machine.what_if import measured_card, profile_on

    count = 0
    for f in figures:
        if f.part == "step" and f.value and f.device:
            configured = build_recipe(recipe.to_dict(), f.detail.get("overrides") or {})
            step = profile_on(configured.step_as_written, measured_card(f.device)).step  # on the card that measured it
            batch = configured.train.global_batch_tokens
            measured = configuration(configured.model, configured.data, step, global_batch_tokens=batch)
            count += bool(record_measurement(measured, f.device, f.value, f.detail.get("peak_memory_gib"), "check"))
    return count


def main(argv: list[str] | None = None) -> int:
    recipe, args = parse_recipe_args(argv, prog=PROG, description=__doc__.split("\n")[0], extra=add_check_arguments)
    try:
        request = check_request(recipe, args)
    except (RecipeError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    import signal

    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        result = run_check(request)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if result.get("interrupted"):
        # SIGTERM is a preemption: nothing is lost and the same command is worth rerunning (an engine's task
        # requeues on 75); Ctrl-C is a person's: 130, as a shell reports it
        code = EXIT_PREEMPTED if result.get("stopped_by") == "SIGTERM" else EXIT_INTERRUPTED
        print(
            f"{PROG}: interrupted by {result['stopped_by']}; {request.output / 'check.json'} holds what was "
            f"measured (exit {code})",
            file=sys.stderr,
        )
        return code
    sent_away = machine_sent_away(request, result["figures"])
    if sent_away is not None:
        return sent_away
    from hf_pretrain.check.verdict import RECIPE_AS_WRITTEN

    as_written = [f for f in result["figures"] if f["part"] == "step" and f["name"] == RECIPE_AS_WRITTEN]
    if "step" not in request.parts or (as_written and as_written[0]["value"]):
        return 0
    # exit 1 (exit_codes.py: what it ran failed) after a screen that ends "written: ...": say why and what helps.
    # The command's door asks which machine this is; `device_kind` leaves CUDA to the parts' own processes.
    from hf_pretrain.machine.run_profile import device_kind

    helps = what_helps(request, on_gpu=device_kind() == "cuda")
    print(
        f"{PROG}: the recipe's step gave no figure ({', '.join(result['parts'].get('step', []))}); {helps}",
        file=sys.stderr,
    )
    return 1


def machine_sent_away(request: CheckRequest, figures: list[dict]) -> int | None:
    """The exit code of a machine the run should not train on, its one line said; None for a machine to keep."""
    from hf_pretrain.check.verdict import faulty_lines, plan_best, plan_shortfall, store_failures

    # First: a run that cannot reach its store loses every step it trains (nothing reaches the store, and a
    # preemption loses it all). A store that does not answer this machine is this machine's network (a
    # route, a firewall, a region's endpoint) as far as the check can tell: 71, the code on which an engine
    # relaunches elsewhere, where it may answer. A store that answered no (no such bucket, a key refused)
    # answers the same everywhere: 78, fix the input, since relaunching would only pay for more machines.
    failed = store_failures(figures)
    if failed:
        unreachable = any(how == "unreachable" for how, _ in failed)
        code = EXIT_FAULTY_HOST if unreachable else EXIT_CONFIG
        where = "rent another machine" if unreachable else "fix it, then check again"
        lines = "; ".join(text.split(": failed: ", 1)[-1] for _, text in failed)
        print(
            f"{PROG}: the run cannot use its store from this machine: {lines}; {where} (exit {code})", file=sys.stderr
        )
        return code
    faulty = faulty_lines(figures)
    if faulty:  # a scheduler relaunches elsewhere on this code (hf_pretrain/engines/)
        print(
            f"{PROG}: this machine is faulty: {'; '.join(faulty)}; rent another (exit {EXIT_FAULTY_HOST})",
            file=sys.stderr,
        )
        return EXIT_FAULTY_HOST
    # a card well under what the plan rented it for is a bad offer: the task pays the plan's price for fewer tokens
    r, slower = request.recipe, request.slower_than_plan
    plan = slower and plan_best(model=r.model, data=r.data, train=r.train, written=r.step_as_written)[0]
    short = slower and plan_shortfall(plan, figures, slower)
    if short:
        print(
            f"{PROG}: this machine is slower than the plan: {short}; rent another (exit {EXIT_FAULTY_HOST})",
            file=sys.stderr,
        )
        return EXIT_FAULTY_HOST
    return None


def what_helps(request: CheckRequest, on_gpu: bool) -> str:
    """After a step with no figure: on a machine without a GPU a larger budget cannot help (a GPU's recipe
    is a GPU's work), so name what can; on a GPU, the lines above and the budget."""
    if not on_gpu:
        return (
            f"this machine has no GPU, so a larger --budget_s will not help: `{PROG} --recipe smoke` checks the "
            f"plumbing here, and `{PROG} --recipe {request.recipe.name}` on the rented card measures the pod"
        )
    return "its lines above say why (a --budget_s of 300 leaves each part room)"
