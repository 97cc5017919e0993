"""Time and money the whole run will take, from the recipe's expected throughput and price; without
an expected throughput, on a GPU of the table, from the performance model for the recipe's
configuration (labelled an estimate)."""

from __future__ import annotations

from hf_pretrain.config import KEY_SECTION, Recipe, ReportingConfig, TrainConfig, build_recipe
from hf_pretrain.config.recipe_command import recipe_command
from hf_pretrain.economics.cost import dollars, dollars_per_billion_tokens
from hf_pretrain.economics.measurements import Measurement, configuration, measured_here, measured_on_a_gpu
from hf_pretrain.economics.performance import modelled_tokens_per_s
from hf_pretrain.economics.workload import Workload, run_workload
from hf_pretrain.formatting import usd
from hf_pretrain.machine.gpus import find_gpu
from hf_pretrain.machine.what_if import measured_card, profile_on, profile_on_any_card
from hf_pretrain.preflight.result import CheckResult


def run_tokens(train: TrainConfig) -> int:
    """The tokens the whole run reads: a figure of the train section alone."""
    return train.max_steps * train.global_batch_tokens


def run_hours(train: TrainConfig, reporting: ReportingConfig) -> float | None:
    """Wall-clock hours at expected_tokens_per_s, or None when the throughput is unknown (0)."""
    rate = reporting.expected_tokens_per_s
    return run_tokens(train) / rate / 3600 if rate else None


def run_cost(train: TrainConfig, reporting: ReportingConfig) -> float | None:
    """Dollars at price_per_hour for the whole job, or None when throughput or price is unknown."""
    hours, price = run_hours(train, reporting), reporting.price_per_hour
    return dollars(hours, price) if hours is not None and price else None


def modelled_rate(work: Workload, gpu_name: str | None) -> float | None:
    """The performance model's job tokens/s for `work` (one of its world size's data-parallel processes) on
    GPUs named `gpu_name` (communication left out), or None: no GPU, a GPU the table does not know, or a
    configuration the card cannot run (fp8 without FP8: the cuda check says so)."""
    gpu = find_gpu(gpu_name) if gpu_name else None
    if gpu is None:
        return None
    try:
        return work.config.world_size * modelled_tokens_per_s(work, gpu)
    except ValueError:
        return None


def check_cost(recipe: Recipe, gpu_name: str | None = None, world_size: int = 1) -> CheckResult:
    """Time and cost at the recipe's expected_tokens_per_s, else at what this configuration measured on
    this GPU, `gpu_name` (economics/measurements.py), else at the model's for it. `gpu_name`: the card
    the run is on, None on a CPU."""
    # a what-if on the card named (the doctor's own), else on any card of the table (a CPU asks what the
    # configuration measured on one): what a measurement is keyed by, and what the performance model prices
    step = (
        profile_on(recipe.step_as_written, measured_card(gpu_name), world_size)
        if gpu_name
        else profile_on_any_card(recipe.step_as_written, world_size)
    ).step
    batch = recipe.train.global_batch_tokens
    wanted = (
        None
        if recipe.reporting.expected_tokens_per_s
        else configuration(recipe.model, recipe.data, step, global_batch_tokens=batch)
    )
    measured = measured_here(wanted, gpu_name) if wanted else None
    if measured:  # what this configuration measured on this GPU stands in for the unknown rate
        recipe = build_recipe(recipe.to_dict(), {"expected_tokens_per_s": measured.tokens_per_s * world_size})
    t = recipe.train
    tokens = f"{run_tokens(recipe.train):,} tokens ({t.max_steps:,} steps x {t.global_batch_tokens:,})"
    hours, cost = run_hours(recipe.train, recipe.reporting), run_cost(recipe.train, recipe.reporting)
    elsewhere = measured_on_a_gpu(wanted) if wanted and hours is None and gpu_name is None else None
    if elsewhere:  # no GPU here: the configuration's measurement on a card of the table, said as that card's
        return measured_elsewhere(recipe.train, recipe.name, elsewhere, tokens, world_size)
    modelled = None  # the performance model's rate, for a GPU here (the workload is built for one only)
    if hours is None and gpu_name:
        modelled = modelled_rate(run_workload(recipe.model, recipe.data, step, batch), gpu_name)
    if modelled:
        hours = run_tokens(recipe.train) / modelled / 3600
        gpus = f"{world_size} x {gpu_name}" if world_size > 1 else gpu_name
        duration = (
            f"{hours:,.1f} h at ~{modelled:,.0f} tokens/s (an estimate of the performance model for {gpus}; "
            f"`hf-pretrain bench` measures it)"
        )
        price = (
            f", {usd(dollars(hours, recipe.reporting.price_per_hour))} at {usd(recipe.reporting.price_per_hour)}/h"
            if recipe.reporting.price_per_hour
            else ""
        )
        return CheckResult("time and cost", "pass", f"{tokens}: {duration}{price}")
    if hours is None:
        return CheckResult(
            "time and cost",
            "warn",
            f"{tokens}: time and cost unknown (expected_tokens_per_s=0)",  # the bench: this recipe's file and keys
            f"measure with `{recipe_command(recipe, 'bench', KEY_SECTION)}`, then set --expected_tokens_per_s"
            + ("" if recipe.reporting.price_per_hour else " and --price_per_hour"),
        )
    duration = f"{hours:,.1f} h at {recipe.reporting.expected_tokens_per_s:,.0f} tokens/s" + (
        f" ({measured.label()})" if measured else ""
    )
    if cost is None:
        return CheckResult(
            "time and cost",
            "warn",
            f"{tokens}: {duration}; cost unknown (price_per_hour=0)",
            "set --price_per_hour (the job's $/hour, all GPUs)",
        )
    per_billion = dollars_per_billion_tokens(recipe.reporting.expected_tokens_per_s, recipe.reporting.price_per_hour)
    return CheckResult(
        "time and cost",
        "pass",
        f"{tokens}: {duration}, {usd(cost)} at {usd(recipe.reporting.price_per_hour)}/h ({usd(per_billion)} per billion tokens)",
    )


def measured_elsewhere(
    train: TrainConfig, recipe_name: str, measured: Measurement, tokens: str, world_size: int
) -> CheckResult:
    """Time and cost on the card that measured this configuration, at that card's typical price (the
    recipe's price_per_hour may be another card's): a machine without a GPU has none of its own."""
    gpu = find_gpu(measured.gpu)
    rate = measured.tokens_per_s * world_size
    hours = run_tokens(train) / rate / 3600
    gpus = f"{world_size} x {measured.gpu}" if world_size > 1 else f"one {measured.gpu}"
    price = gpu.usd_per_hour * world_size if gpu is not None else 0.0
    cost = f", {usd(dollars(hours, price))} at {usd(price)}/h (its typical price)" if price else ""
    return CheckResult(
        "time and cost",
        "pass",
        f"{tokens}: {hours:,.1f} h at {rate:,.0f} tokens/s on {gpus}{cost} ({measured.label()}; no GPU here: "
        f"`hf-pretrain plan --recipe {recipe_name} --gpu all` ranks the other cards)",
    )
