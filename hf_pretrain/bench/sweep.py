"""One bench from start to end: the recipe as written (the baseline), every variant asked for, the
largest micro-batch without gradient checkpointing, then peaks, money and the verdict, written to
bench.json and bench.md. `command.py` parses the command line into a `BenchRequest`; `run_bench`
does the rest.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from hf_pretrain.bench.measure import add_mfu, add_money, measured_matmul_peak
from hf_pretrain.bench.results import advice, markdown_report
from hf_pretrain.bench.search import ProbeError, SearchResult, search_micro_batch
from hf_pretrain.bench.variants import VariantResult, VariantRunner
from hf_pretrain.config import DataConfig, ModelConfig, Recipe, build_recipe
from hf_pretrain.data.prepare_run import prepare
from hf_pretrain.data.prepared import DataMismatchError, check_prepared_data
from hf_pretrain.economics.measurements import Configuration, configuration, record_measurement
from hf_pretrain.economics.performance import modelled_tokens_per_s, slow_node_warning
from hf_pretrain.economics.resolved_run import complete_profile
from hf_pretrain.economics.workload import Workload, run_workload
from hf_pretrain.machine.gpus import best_match, find_gpu
from hf_pretrain.machine.hardware import device_name
from hf_pretrain.machine.run_profile import Machine, Step, device_kind, this_machine
from hf_pretrain.model.llama import model_flops_per_token
from hf_pretrain.store.location import Location

Say = Callable[[str], None]


@dataclass(frozen=True)
class BenchRequest:
    """What to measure, and where to write it. Raises ValueError for a contradiction."""

    recipe: Recipe
    data: Location  # where the recipe's data lives, as the command's door placed it
    output: Path  # bench.json, bench.md, and each variant's short run
    variants: list[dict[str, str]]  # recipe overrides, one dict per variant (`variants.variant_grid`)
    prices: dict[str, float]  # GPU name -> $ per GPU-hour (`economics.prices.price_table`)
    steps: int = 20  # optimizer steps per variant
    warmup: int = 5  # first steps left out of the timing
    memory_gib: float | None = None  # the micro-batch search's budget (on the CPU, its only limit)
    search: bool = True  # look for the largest micro-batch without gradient checkpointing

    def __post_init__(self) -> None:
        if not 0 <= self.warmup < self.steps:
            raise ValueError("--warmup must be at least 0 and below --steps")


def recipe_with_data(recipe: Recipe, data: Location, out: Path, steps: int, say: Say) -> Recipe:
    """The recipe itself when its data (at `data`, the door's) is prepared, else the recipe on a slice of its
    corpus in `out`."""
    try:
        check_prepared_data(recipe, data)
        return recipe
    except (DataMismatchError, FileNotFoundError) as exc:
        say(f"the recipe's data cannot be used ({exc})")
    # every 2nd document held out: a slice of a few long documents holds no val_every-th one (a refusal)
    tokens = (steps + 1) * recipe.train.global_batch_tokens
    sliced = build_recipe(recipe.to_dict(), {"data_dir": str(out / "data"), "max_tokens": tokens, "val_every": 2})
    say(f"preparing {sliced.data.max_tokens:,} tokens of the recipe's corpus in {sliced.data.data_dir}")
    prepare(sliced, log=say)
    return sliced


def largest_micro_batch(
    runner: VariantRunner, request: BenchRequest, say: Say, on_gpu: bool
) -> tuple[SearchResult | None, str | None]:
    """(the search, why it stopped early) of the largest micro-batch of the runner's recipe that fits; it is
    measured like a variant when no variant has run it yet."""
    if not request.search:
        say("micro-batch search skipped (--no_search)")
        return None, None
    if not on_gpu and request.memory_gib is None:
        say("micro-batch search skipped: on the CPU it needs a budget (--memory_gib)")
        return None, None
    say("largest micro-batch without gradient checkpointing:")
    search, error = None, None
    try:
        search = search_micro_batch(runner.recipe, runner.short_run, request.output / "search", request.memory_gib, say)
    except ProbeError as exc:
        error = str(exc)
        say(f"micro-batch search stopped: {exc}")
    best = {"micro_batch_size": search.largest_fitting if search else None, "checkpointed_layers": 0}
    if best["micro_batch_size"] and not runner.has_run(best):
        runner.run(best)
    return search, error


def variant_recipe(recipe: Recipe, variant: VariantResult) -> Recipe:
    """The configuration a variant ran (its short-run settings change nothing that is measured)."""
    return build_recipe(recipe.to_dict(), variant.overrides)


def variant_economics(
    model: ModelConfig, data: DataConfig, step: Step, *, global_batch_tokens: int
) -> tuple[Workload, Configuration]:
    """(what the performance model prices, what the measurement is keyed by) of a variant's configuration:
    its model and data sections, batch, and the step it ran on this machine."""
    work = run_workload(model, data, step, global_batch_tokens)
    return work, configuration(model, data, step, global_batch_tokens=global_batch_tokens)


def bench_result(
    recipe: Recipe,
    request: BenchRequest,
    runner: VariantRunner,
    search: SearchResult | None,
    search_error: str | None,
    machine: Machine,
) -> dict[str, Any]:
    """Peaks, money and the verdict of the variants run: every field of bench.json. CUDA is touched in
    this process only now, so that the children before had the whole GPU. On a GPU, what each variant
    measured is recorded for `plan` and the doctor (economics/measurements.py)."""
    variants = runner.results
    device = torch.device("cuda" if machine.on_gpu else "cpu")
    name = device_name(device)
    matmul = measured_matmul_peak(device)
    datasheet = machine.peak_flops
    n_params, per_token = model_flops_per_token(recipe.model, recipe.data)
    # only a GPU the table knows has a modelled figure to scale the others' by; a CPU prices no GPU
    gpu = find_gpu(name) if device.type == "cuda" else None
    price_entry = best_match(name, request.prices) if device.type == "cuda" else None
    recorded_on = machine.gpu_name  # None on a CPU: nothing is recorded
    for variant in variants:
        add_mfu(variant, datasheet, matmul.flops)
        if variant.tokens_per_s is None:
            continue
        configured = variant_recipe(recipe, variant)
        model, data, batch = configured.model, configured.data, configured.train.global_batch_tokens
        step = complete_profile(configured.step_as_written, machine, model=model, seq_len=data.seq_len).step  # as run
        work, measured = variant_economics(model, data, step, global_batch_tokens=batch)
        add_money(variant, work, gpu, price_entry, request.prices)
        if variants[0].tokens_per_s:
            variant.speedup_vs_recipe = variant.tokens_per_s / variants[0].tokens_per_s - 1
        record_measurement(measured, recorded_on, variant.tokens_per_s, variant.peak_memory_gib, "bench")
    # the recipe as written, on this machine
    written = complete_profile(recipe.step_as_written, machine, model=recipe.model, seq_len=recipe.data.seq_len).step
    left_on_table, notes = advice(variants, search, written)
    # the recipe as written against the performance model for this GPU: a slow or faulty node shows here
    work = run_workload(recipe.model, recipe.data, written, recipe.train.global_batch_tokens) if gpu else None
    modelled = modelled_tokens_per_s(work, gpu) if work else None
    slow_node = slow_node_warning(variants[0].tokens_per_s or 0.0, name, work) if work else None
    if slow_node:
        notes.append(f"warning: {slow_node}")
    return {
        "recipe": recipe.name,
        "device": name,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "parameters": n_params,
        "flops_per_token": per_token,
        "steps": request.steps,
        "warmup": request.warmup,
        "tokens_per_step": recipe.train.global_batch_tokens,
        "peak_flops": {
            "datasheet": datasheet,
            "measured": matmul.flops,
            "measured_with": matmul.describe(),
            "measured_by_size": matmul.rates,
            "on_cpu": matmul.on_cpu,
        },
        "prices": request.prices,
        "price_entry_of_device": price_entry,
        "variants": [asdict(v) for v in variants],
        "micro_batch_search": asdict(search) if search else None,
        "micro_batch_search_error": search_error,
        "modelled_tokens_per_s": modelled,  # the performance model's estimate for this GPU (economics/performance.py)
        "slow_node": slow_node,
        "leaves_speed_on_the_table": left_on_table,
        "advice": notes,
    }


def run_bench(request: BenchRequest, say: Say = print) -> dict[str, Any]:
    """Run the bench `request` asks for; write bench.json and bench.md and return what bench.json holds."""
    out = request.output
    out.mkdir(parents=True, exist_ok=True)
    recipe = recipe_with_data(request.recipe, request.data, out, request.steps, say)
    runner = VariantRunner(recipe, out, request.steps, request.warmup, say)
    for overrides in [{}] + [point for point in request.variants if not runner.is_the_recipe(point)]:
        runner.run(overrides)
    # The bench's door asks which machine this is, twice and no more: whether it has CUDA (without touching
    # it: the children below get the whole GPU), then, once they are done, the card itself for the peaks.
    search, search_error = largest_micro_batch(runner, request, say, on_gpu=device_kind() == "cuda")
    result = bench_result(recipe, request, runner, search, search_error, this_machine())
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    table = markdown_report(result)
    (out / "bench.md").write_text(table)
    say("\n" + table + f"\nwritten: {out / 'bench.json'}, {out / 'bench.md'}")
    return result
