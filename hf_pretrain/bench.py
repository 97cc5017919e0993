"""`hf-pretrain bench`: tokens/s, MFU, memory, data wait and $ per billion tokens of recipe variants.

    hf-pretrain bench --recipe 1b --variants gradient_checkpointing=true,false micro_batch_size=8,16
    hf-pretrain bench --recipe smoke --steps 12 --warmup 4 --memory-gib 2 --output runs/bench-smoke

Every variant is a short run of the real training loop (`hf_pretrain.train.train`) in its own
process: Accelerate's state is a process singleton, and a fresh process also gives each variant a
clean peak-memory count. `--variants` takes KEY=V1,V2 axes of recipe keys and runs every
combination; the recipe as written always runs first and is the baseline. Throughput is read
from the run's metrics.jsonl (which leaves checkpoint writes out), the first `--warmup` steps
excluded.

Then it looks for the largest micro-batch that fits without gradient checkpointing: doubling from
the recipe's micro_batch_size until a probe fails, then bisecting. A probe fails on a CUDA
out-of-memory error, on a preflight memory verdict, or when its peak memory exceeds `--memory-gib`
(on the CPU, where nothing runs out, the budget is the only limit and the peak is the process's
peak RSS). Only micro-batches that divide the recipe's batch are tried, since a larger one would
change the global batch, not just its speed. The largest one is then measured like any variant,
and the bench says whether the recipe's settings leave speed on the table.

Results go to `--output`: bench.json (every field) and bench.md (the tables).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from hf_pretrain.config import Recipe, RecipeError, build_recipe, parse_recipe_args, save_recipe
from hf_pretrain.data import DataMismatchError, check_prepared_data, prepare
from hf_pretrain.economics.cost import dollars_per_billion_tokens
from hf_pretrain.economics.prices import PriceError, price_table
from hf_pretrain.hardware import best_match, device_peak_flops
from hf_pretrain.model import recipe_flops_per_token
from hf_pretrain.run_dir import read_jsonl

# A variant must beat the recipe by more than this to count as speed left on the table: short
# runs on a busy machine wobble by a few percent.
SPEEDUP_THRESHOLD = 0.03
# Optimizer steps of a micro-batch probe: the second step is the first with AdamW's moments
# allocated, so it holds the true peak.
PROBE_STEPS = 2
# Worker statuses that mean "does not fit" rather than "broken".
OUT_OF_MEMORY = ("oom", "oom-estimated")


# ---------------------------------------------------------------------- results
class ProbeError(RuntimeError):
    """A micro-batch probe that failed for another reason than memory: the search cannot go on."""


@dataclass
class RunResult:
    """What a worker process reports about one short training run."""

    status: str  # ok | oom | oom-estimated (refused by preflight's memory check) | preflight | failed
    message: str = ""
    peak_memory_gib: float | None = None  # CUDA max allocated, or the process's peak RSS on CPU


@dataclass
class VariantResult:
    name: str
    overrides: dict[str, Any]  # recipe keys this variant changes
    status: str
    message: str = ""
    flops_per_token: float | None = None
    tokens_per_s: float | None = None
    step_seconds: float | None = None
    mfu: float | None = None  # against the datasheet bf16 peak (GPUs in metrics.PEAK_BF16_FLOPS)
    mfu_measured_peak: float | None = None  # against the matmul rate measured in this run
    peak_memory_gib: float | None = None
    data_wait_share: float | None = None  # None when the run's metrics do not log it
    usd_per_billion_tokens: dict[str, float] = field(default_factory=dict)
    speedup_vs_recipe: float | None = None


@dataclass
class Probe:
    micro_batch_size: int
    fits: bool
    status: str
    peak_memory_gib: float | None


@dataclass
class SearchResult:
    candidates: list[int]  # micro-batches that divide the recipe's batch
    memory_budget_gib: float | None
    probes: list[Probe]
    largest_fitting: int | None


# ---------------------------------------------------------------------- variants
def variant_grid(specs: list[str]) -> list[dict[str, str]]:
    """`["compile=true,false", "micro_batch_size=4,8"]` -> every combination, as override dicts."""
    axes: list[tuple[str, list[str]]] = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or not key or not values:
            raise RecipeError(f"--variants {spec!r} must look like KEY=VALUE[,VALUE...], e.g. compile=true,false")
        axes.append((key, [v.strip() for v in values.split(",") if v.strip()]))
    keys = [key for key, _ in axes]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(values for _, values in axes))]


def _recipe_value(value: Any) -> str:
    """A value the way a recipe or the command line spells it (`true`, not `True`)."""
    return json.dumps(value) if isinstance(value, bool) else str(value)


def variant_name(overrides: dict[str, Any]) -> str:
    return " ".join(f"{k}={_recipe_value(v)}" for k, v in overrides.items()) or "recipe as written"


def short_run_overrides(steps: int, warmup_steps: int, output_dir: Path) -> dict[str, Any]:
    """A short timed run: no evaluation, one checkpoint at the end, a metrics line per step."""
    return {"max_steps": steps, "warmup_steps": warmup_steps, "eval_interval": 0, "save_interval": steps,
            "log_interval": 1, "resume": "none", "report_to": "none", "output_dir": str(output_dir),
            "stop_at_step": 0, "milestone_interval": 0, "keep_checkpoints": 1, "phases": {},
            "early_stop_cost_per_loss_point": 0.0, "early_stop_patience": 0}


def settings_of(recipe: Recipe, keys: list[str]) -> dict[str, Any]:
    """The recipe's values for `keys` (top-level or section keys), for comparing variants."""
    flat = {k: v for section in ("model", "data", "train") for k, v in recipe.to_dict()[section].items()}
    return {k: flat.get(k, getattr(recipe, k, None)) for k in keys}


def is_recipe_as_written(recipe: Recipe, overrides: dict[str, Any]) -> bool:
    """Whether `overrides` change nothing (that variant is the baseline); invalid ones change something."""
    try:
        changed = build_recipe(recipe.to_dict(), overrides)
    except RecipeError:
        return False
    return settings_of(changed, list(overrides)) == settings_of(recipe, list(overrides))


def usable_micro_batches(recipe: Recipe) -> list[int]:
    """Micro-batches that split the recipe's global batch on one process (whole accumulation steps)."""
    sequences = recipe.train.global_batch_tokens // recipe.data.seq_len
    return [n for n in range(1, sequences + 1) if recipe.train.global_batch_tokens % (n * recipe.data.seq_len) == 0]


def largest_fitting(candidates: list[int], start: int, fits: Callable[[int], bool]) -> int | None:
    """The largest candidate for which `fits` holds, assuming fitting is monotone in size.

    Doubles from `start` (or the nearest candidate) until a probe fails or the candidates end,
    then bisects between the last fit and the first failure; starting from a failure it bisects
    below. Each candidate is probed at most once.
    """
    candidates = sorted(set(candidates))
    low, high = -1, len(candidates)  # indices of the largest known fit and the smallest known failure
    index = min(range(len(candidates)), key=lambda i: abs(candidates[i] - start), default=0)
    while index < high:  # doubling
        if not fits(candidates[index]):
            high = index
            break
        low = index
        doubled = [i for i in range(index + 1, len(candidates)) if candidates[i] >= 2 * candidates[index]]
        # past the last doubling, the largest candidate is the last one worth a probe
        index = doubled[0] if doubled else (len(candidates) - 1 if index < len(candidates) - 1 else high)
    while high - low > 1:  # bisection between what fits and what does not
        middle = (low + high) // 2
        if fits(candidates[middle]):
            low = middle
        else:
            high = middle
    return candidates[low] if low >= 0 else None


# ---------------------------------------------------------------------- measuring
def timed_throughput(records: list[dict[str, Any]], warmup: int) -> tuple[float, float, float | None] | None:
    """(tokens/s, seconds per step, data-wait share) over the logged steps after `warmup`.

    Each train record's window runs from the previous record, so its seconds are the tokens it
    added over its rate; the data-wait share is weighted by those seconds.
    """
    train = [r for r in records if r.get("kind") == "train"]
    tokens = seconds = waited = 0.0
    steps, has_wait = 0, True
    previous = None
    for record in train:
        if previous is not None and record["step"] > warmup:
            window_tokens = record["tokens"] - previous["tokens"]
            window_seconds = window_tokens / record["tokens_per_s"]
            tokens += window_tokens
            seconds += window_seconds
            steps += record["step"] - previous["step"]
            if "data_wait_share" in record:
                waited += record["data_wait_share"] * window_seconds
            else:
                has_wait = False
        previous = record
    if not steps:
        return None
    return tokens / seconds, seconds / steps, (waited / seconds if has_wait else None)


def measured_matmul_flops(device: torch.device, min_seconds: float = 0.5) -> tuple[float, str]:
    """FLOP/s of a large square matmul: bf16 on a GPU (the training precision), fp32 on the CPU."""
    size, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (2048, torch.float32)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    torch.matmul(a, b)  # warm-up: kernel selection, thread pools
    sync()
    count, start = 0, time.perf_counter()
    while count < 3 or time.perf_counter() - start < min_seconds:
        torch.matmul(a, b)
        count += 1
        sync()
    flops = 2 * size**3 * count / (time.perf_counter() - start)
    del a, b
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return flops, f"{str(dtype).removeprefix('torch.')} {size}x{size} matmul"


def process_peak_memory_gib(device: torch.device) -> float:
    """This process's peak: CUDA memory allocated by torch, or resident set size on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / 2**30 if sys.platform == "darwin" else rss / 2**20


def model_flops_per_token(recipe: Recipe) -> tuple[int, float]:
    return recipe_flops_per_token(recipe)


# ---------------------------------------------------------------------- worker (child process)
def run_in_this_process(recipe: Recipe, result_path: Path) -> int:
    """Train `recipe` here and write a RunResult; what `--worker-result` runs in each child."""
    from hf_pretrain.preflight import PreflightError
    from hf_pretrain.train import train

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        outcome = train(recipe)
        result = RunResult("ok" if outcome.exit_code == 0 else "failed", outcome.message)
    except PreflightError as exc:
        # preflight refuses a micro-batch its memory estimate says cannot fit, before trying it
        memory_only = all(r.name == "gpu memory" for r in exc.results if r.status == "fail")
        result = RunResult("oom-estimated" if memory_only else "preflight", str(exc))
    except torch.cuda.OutOfMemoryError as exc:
        result = RunResult("oom", str(exc).splitlines()[0])
    except RuntimeError as exc:
        # compiled graphs and some kernels report CUDA running out of memory as a plain RuntimeError
        if "out of memory" not in str(exc):
            raise
        result = RunResult("oom", str(exc).splitlines()[0])
    result.peak_memory_gib = process_peak_memory_gib(device)
    result_path.write_text(json.dumps(asdict(result)))
    return 0


def run_in_child(recipe: Recipe, folder: Path) -> RunResult:
    """Run `recipe` in a fresh process; its log, recipe and result stay in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    recipe_file, result_file, log_file = folder / "recipe.yaml", folder / "result.json", folder / "log.txt"
    save_recipe(recipe, recipe_file)
    result_file.unlink(missing_ok=True)
    package_root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "hf_pretrain.bench", "--recipe", str(recipe_file),
               "--worker-result", str(result_file)]
    with log_file.open("w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    # A checkpoint of a 1B model is 12 GB: keep the metrics, drop the weights.
    for heavy in ("checkpoints", "final"):
        shutil.rmtree(Path(recipe.train.output_dir) / heavy, ignore_errors=True)
    if result_file.exists():
        return RunResult(**json.loads(result_file.read_text()))
    tail = log_file.read_text()[-2000:]
    if code in (-9, 137):  # SIGKILL: on Linux, most often the kernel's out-of-memory killer
        return RunResult("oom", f"killed (exit {code}), probably out of memory; see {log_file}")
    return RunResult("failed", f"exit {code}; see {log_file}:\n{tail}")


# ---------------------------------------------------------------------- the bench
def measure_variant(recipe: Recipe, overrides: dict[str, Any], folder: Path, warmup: int) -> VariantResult:
    run = run_in_child(recipe, folder)
    result = VariantResult(variant_name(overrides), overrides, run.status, run.message,
                           peak_memory_gib=run.peak_memory_gib)
    timed = timed_throughput(read_jsonl(Path(recipe.train.output_dir) / "metrics.jsonl"), warmup)
    if run.status == "ok" and timed:
        result.tokens_per_s, result.step_seconds, result.data_wait_share = timed
        result.message = ""
    elif run.status == "ok":
        result.status, result.message = "failed", "no train records after the warm-up steps"
    return result


def add_money_and_mfu(result: VariantResult, datasheet_peak: float | None, measured_peak: float,
                      prices: dict[str, float]) -> None:
    if result.tokens_per_s is None or result.flops_per_token is None:
        return
    achieved = result.tokens_per_s * result.flops_per_token
    result.mfu = achieved / datasheet_peak if datasheet_peak else None
    result.mfu_measured_peak = achieved / measured_peak
    result.usd_per_billion_tokens = {name: dollars_per_billion_tokens(result.tokens_per_s, price)
                                     for name, price in prices.items()}


def search_micro_batch(recipe: Recipe, short_run: dict[str, Any], folder: Path, budget_gib: float | None,
                       say: Callable[[str], None]) -> SearchResult:
    """The largest usable micro-batch that fits without gradient checkpointing (see the module doc)."""
    candidates = usable_micro_batches(recipe)
    probes: list[Probe] = []

    def fits(size: int) -> bool:
        probe_recipe = build_recipe(recipe.to_dict(), {
            **short_run, "max_steps": PROBE_STEPS, "warmup_steps": 1, "save_interval": PROBE_STEPS,
            "output_dir": str(folder / f"micro_batch_{size}" / "run"), "micro_batch_size": size,
            "global_batch_tokens": size * recipe.data.seq_len, "gradient_checkpointing": False})
        run = run_in_child(probe_recipe, folder / f"micro_batch_{size}")
        if run.status not in ("ok", *OUT_OF_MEMORY):
            raise ProbeError(f"the probe at micro_batch_size {size} failed ({run.status}): {run.message}")
        ok = run.status == "ok" and (budget_gib is None or (run.peak_memory_gib or 0.0) <= budget_gib)
        probes.append(Probe(size, ok, run.status, run.peak_memory_gib))
        memory = f"{run.peak_memory_gib:.2f} GiB" if run.peak_memory_gib is not None else "?"
        say(f"  micro_batch_size {size}: {'fits' if ok else 'does not fit'} ({run.status}, peak {memory})")
        return ok

    best = largest_fitting(candidates, recipe.train.micro_batch_size, fits)
    return SearchResult(candidates, budget_gib, probes, best)


def advice(recipe: Recipe, variants: list[VariantResult], search: SearchResult | None) -> tuple[bool, list[str]]:
    """(does the recipe leave speed on the table, what to change)."""
    base = variants[0]
    notes: list[str] = []
    if base.tokens_per_s is None:
        first_line = base.message.splitlines()[0] if base.message else ""
        return False, [f"the recipe as written did not run ({base.status}): {first_line}"]
    left_on_table = False
    mb, checkpointing = recipe.train.micro_batch_size, recipe.train.gradient_checkpointing
    if search and search.largest_fitting:
        if checkpointing and search.largest_fitting >= mb:
            left_on_table = True
            notes.append(f"gradient checkpointing is on, but micro_batch_size {mb} fits without it: "
                         f"--gradient_checkpointing false saves the recomputation")
        elif search.largest_fitting > mb:
            notes.append(f"micro_batch_size {search.largest_fitting} fits without gradient checkpointing "
                         f"(the recipe uses {mb})")
    measured = [v for v in variants if v.tokens_per_s is not None]
    fastest = max(measured, key=lambda v: v.tokens_per_s or 0.0)
    gain = fastest.tokens_per_s / base.tokens_per_s - 1
    if fastest is not base and gain > SPEEDUP_THRESHOLD:
        left_on_table = True
        flags = " ".join(f"--{k} {_recipe_value(v)}" for k, v in fastest.overrides.items())
        notes.append(f"fastest measured: {fastest.name}, {gain:+.1%} tokens/s over the recipe: {flags}")
    else:
        notes.append(f"no measured variant beats the recipe by more than {SPEEDUP_THRESHOLD:.0%}")
    return left_on_table, notes


def device_description() -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return torch.device("cuda"), f"{props.name} ({props.total_memory / 2**30:.0f} GiB)"
    return torch.device("cpu"), f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def _number(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def markdown_report(result: dict[str, Any]) -> str:
    """bench.md from the bench.json dictionary."""
    peak = result["peak_flops"]
    lines = [
        f"# hf-pretrain bench: {result['recipe']}",
        "",
        f"{result['device']} | torch {result['torch']} | {result['date']}",
        f"model: {result['parameters'] / 1e6:,.2f}M parameters, {result['flops_per_token'] / 1e6:,.1f} MFLOP per "
        f"token | {result['steps']} steps per variant, the first {result['warmup']} excluded from timing",
        f"peak TFLOP/s: datasheet {_number(peak['datasheet'] and peak['datasheet'] / 1e12, ',.0f')}; measured "
        f"{peak['measured'] / 1e12:,.3f} ({peak['measured_with']})",
        "",
        "| variant | status | tokens/s | vs recipe | s/step | MFU | MFU of measured peak | peak memory (GiB) | data wait |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v in result["variants"]:
        lines.append(
            f"| {v['name']} | {v['status']} | {_number(v['tokens_per_s'], ',.0f')} | "
            f"{_number(v['speedup_vs_recipe'], '+.1%')} | {_number(v['step_seconds'], '.3f')} | "
            f"{_number(v['mfu'], '.1%')} | {_number(v['mfu_measured_peak'], '.1%')} | "
            f"{_number(v['peak_memory_gib'], '.2f')} | {_number(v['data_wait_share'], '.1%')} |")
    measured = [v for v in result["variants"] if v["usd_per_billion_tokens"]]
    if measured:
        lines += ["", "$ per billion tokens at each price, at the throughput measured here (only the GPU this ran "
                      "on describes a rental of this machine):", "",
                  "| GPU | $/hour | " + " | ".join(v["name"] for v in measured) + " |",
                  "|---|---|" + "---|" * len(measured)]
        for name, price in result["prices"].items():
            mark = " (this GPU)" if name == result["price_entry_of_device"] else ""
            lines.append(f"| {name}{mark} | {price:,.2f} | "
                         + " | ".join(f"{v['usd_per_billion_tokens'][name]:,.2f}" for v in measured) + " |")
    search = result["micro_batch_search"]
    if search:
        budget = f", budget {search['memory_budget_gib']:.2f} GiB" if search["memory_budget_gib"] else ""
        lines += ["", f"Largest micro-batch without gradient checkpointing{budget}: "
                      f"**{search['largest_fitting'] or 'none fits'}** (candidates {search['candidates']})", "",
                  "| micro_batch_size | fits | status | peak memory (GiB) |", "|---|---|---|---|"]
        lines += [f"| {p['micro_batch_size']} | {'yes' if p['fits'] else 'no'} | {p['status']} | "
                  f"{_number(p['peak_memory_gib'], '.2f')} |" for p in search["probes"]]
    if result["micro_batch_search_error"]:
        lines += ["", f"The micro-batch search stopped: {result['micro_batch_search_error']}"]
    verdict = "leaves speed on the table" if result["leaves_speed_on_the_table"] else \
        "leaves no measured speed on the table"
    lines += ["", f"The recipe as written {verdict}:", ""] + [f"- {note}" for note in result["advice"]]
    return "\n".join(lines) + "\n"


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("bench options")
    group.add_argument("--variants", nargs="+", default=[], metavar="KEY=V1,V2",
                       help="recipe keys to vary, every combination runs (e.g. gradient_checkpointing=true,false "
                            "compile=false micro_batch_size=4,8); the recipe as written always runs first")
    group.add_argument("--steps", type=int, default=20, help="optimizer steps per variant (default 20)")
    group.add_argument("--warmup", type=int, default=5, help="first steps left out of the timing (default 5)")
    group.add_argument("--output", default=None, help="results folder (default runs/bench-RECIPE)")
    group.add_argument("--prices", default=None, help="price table YAML (default: hf_pretrain/prices.yaml)")
    group.add_argument("--price", action="append", default=[], metavar="NAME=USD_PER_HOUR",
                       help="add or override a price-table entry; repeatable")
    group.add_argument("--memory-gib", type=float, default=None,
                       help="memory budget for the micro-batch search (GPU: on top of running out of memory; "
                            "CPU: required for a search, against the process's peak RSS)")
    group.add_argument("--no-search", action="store_true", help="skip the largest-micro-batch search")
    group.add_argument("--worker-result", default=None, help=argparse.SUPPRESS)


class VariantRunner:
    """Runs variants of one recipe with the same short-run settings, numbering their folders in `out`."""

    def __init__(self, recipe: Recipe, out: Path, steps: int, warmup: int, say: Callable[[str], None]) -> None:
        self.recipe, self.out, self.warmup, self.say = recipe, out, warmup, say
        self.short_run = short_run_overrides(steps, min(recipe.train.warmup_steps, steps - 1), out)
        self.results: list[VariantResult] = []
        self._settings: list[dict[str, Any]] = []  # micro-batch and checkpointing of each one run

    def run(self, overrides: dict[str, Any]) -> VariantResult:
        index = len(self.results)
        folder = self.out / "variants" / f"{index:02d}"
        try:
            variant = build_recipe(self.recipe.to_dict(), {**self.short_run, "output_dir": str(folder / "run"),
                                                           **overrides})
        except RecipeError as exc:
            result = VariantResult(variant_name(overrides), overrides, "invalid", str(exc))
        else:
            self.say(f"variant {index}: {variant_name(overrides)}")
            result = measure_variant(variant, overrides, folder, self.warmup)
            result.flops_per_token = model_flops_per_token(variant)[1]
            self.say(f"  {result.status}: {_number(result.tokens_per_s, ',.0f')} tokens/s, "
                     f"peak memory {_number(result.peak_memory_gib, '.2f')} GiB")
            self._settings.append(settings_of(variant, ["micro_batch_size", "gradient_checkpointing"]))
        self.results.append(result)
        return result

    def has_run(self, settings: dict[str, Any]) -> bool:
        return settings in self._settings


def recipe_with_data(recipe: Recipe, out: Path, steps: int, say: Callable[[str], None]) -> Recipe:
    """The recipe itself when its data is prepared, else the recipe on a slice of its corpus in `out`."""
    try:
        check_prepared_data(recipe)
        return recipe
    except (DataMismatchError, FileNotFoundError) as exc:
        say(f"the recipe's data cannot be used ({exc})")
    sliced = build_recipe(recipe.to_dict(), {"data_dir": str(out / "data"),
                                             "max_tokens": (steps + 1) * recipe.train.global_batch_tokens})
    say(f"preparing {sliced.data.max_tokens:,} tokens of the recipe's corpus in {sliced.data.data_dir}")
    prepare(sliced, log=say)
    return sliced


def main(argv: list[str] | None = None) -> int:
    recipe, args = parse_recipe_args(argv, prog="hf-pretrain bench", description=__doc__.split("\n")[0],
                                     extra=add_bench_arguments)
    if args.worker_result:
        return run_in_this_process(recipe, Path(args.worker_result))
    if not 0 <= args.warmup < args.steps:
        print("hf-pretrain bench: error: --warmup must be at least 0 and below --steps", file=sys.stderr)
        return 2
    try:
        prices = price_table(args.prices, args.price)
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
        say("micro-batch search skipped (--no-search)")
    elif not torch.cuda.is_available() and args.memory_gib is None:
        say("micro-batch search skipped: on the CPU it needs a budget (--memory-gib)")
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
    device, device_name = device_description()
    matmul_flops, matmul_with = measured_matmul_flops(device)
    datasheet = device_peak_flops(device)
    n_params, per_token = model_flops_per_token(recipe)
    for variant in variants:
        add_money_and_mfu(variant, datasheet, matmul_flops, prices)
        if variant.tokens_per_s and variants[0].tokens_per_s:
            variant.speedup_vs_recipe = variant.tokens_per_s / variants[0].tokens_per_s - 1
    left_on_table, notes = advice(recipe, variants, search)
    result = {
        "recipe": recipe.name, "device": device_name, "torch": torch.__version__,
        "date": datetime.date.today().isoformat(), "parameters": n_params, "flops_per_token": per_token,
        "steps": args.steps, "warmup": args.warmup, "tokens_per_step": recipe.train.global_batch_tokens,
        "peak_flops": {"datasheet": datasheet, "measured": matmul_flops, "measured_with": matmul_with},
        "prices": prices,
        "price_entry_of_device": best_match(device_name, prices) if device.type == "cuda" else None,
        "variants": [asdict(v) for v in variants],
        "micro_batch_search": asdict(search) if search else None, "micro_batch_search_error": search_error,
        "leaves_speed_on_the_table": left_on_table, "advice": notes,
    }
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    table = markdown_report(result)
    (out / "bench.md").write_text(table)
    say("\n" + table + f"\nwritten: {out / 'bench.json'}, {out / 'bench.md'}")
    return 0 if variants[0].status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
