"""`hf-pretrain plan`: tokens, FLOPs, time and money of a run before it starts, on 1..N GPUs; or what
going further would buy a run that is under way.

    hf-pretrain plan --recipe 1b                      # tokens, FLOPs, Chinchilla; time and cost when the recipe knows
    hf-pretrain plan --recipe 1b --gpu all            # every GPU of the table: fitted, modelled, ranked by the run's $
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
import math
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from hf_pretrain.config import CommandParser, Recipe, RecipeError, parse_recipe_args
from hf_pretrain.economics.cost import dollars_per_billion_tokens
from hf_pretrain.economics.forecast import BAND_SIGMAS, MIN_POINTS, MIN_TOKEN_RATIO, GoingFurther, going_further
from hf_pretrain.economics.gpus import GPU, gpu_named, gpu_table
from hf_pretrain.economics.measurements import recorded_measurement
from hf_pretrain.economics.memory import GRADIENT_BYTES, Fit, fit_in_memory, with_checkpointed_layers, with_micro_batch
from hf_pretrain.economics.performance import (
    FP8_QUALITY_PER_TOKEN,
    FP8_QUALITY_SOURCE,
    FP8_TOKENS_FOR_BF16_LOSS_1B_ESTIMATE,
    modelled_tokens_per_s,
)
from hf_pretrain.economics.prices import PriceError, table_gpu_prices
from hf_pretrain.exit_codes import EXIT_CONFIG
from hf_pretrain.formatting import human_count, usd
from hf_pretrain.model import (
    TRAINING_FLOPS_PER_PARAMETER,
    dense_flops_per_token,
    recipe_flops_per_token,
    recipe_parameter_count,
    recipe_tokenizer_size,
)
from hf_pretrain.optim import Cooldown, Schedule
from hf_pretrain.run_dir import RunDir, read_jsonl
from hf_pretrain.run_profile import A_GPU, FP8_COMPUTE_CAPABILITY, machine_with, run_profile

# Chinchilla (Hoffmann et al. 2022): about 20 training tokens per parameter is compute-optimal.
TOKENS_PER_PARAMETER = 20
# Chinchilla's parametric loss L(N, D) = E + A / N^alpha + B / D^beta ("approach 3" of Hoffmann et al.
# 2022), with the coefficients of its replication by Besiroglu, Erdil, Barnett and You 2024, "Chinchilla
# Scaling: A replication attempt" (arXiv:2404.10102, Table 1), which corrects the original fit: its
# compute-optimal split is ~20 tokens per parameter, consistent with Hoffmann's approaches 1 and 2.
CHINCHILLA_E, CHINCHILLA_A, CHINCHILLA_B = 1.8172, 482.01, 2085.43
CHINCHILLA_ALPHA, CHINCHILLA_BETA = 0.3478, 0.3658
# Per-GPU, one-direction link rates in Gbit/s: NVLink 4 on H100 SXM (450 GB/s), PCIe 4.0 x16
# (32 GB/s), and a common 100 GbE cloud NIC between nodes.
INTERCONNECT_GBPS = {"nvlink": 3600.0, "pcie": 256.0, "ethernet": 100.0}
# Share of the datasheet peak a well-tuned ~1B Llama reaches with SDPA and torch.compile (TinyLlama
# reports ~56% on A100s with fused kernels); used only when no measured tokens/s is given.
DEFAULT_MFU = 0.40
# Tokens per optimizer step when no recipe says otherwise (the `1b` recipe's batch).
DEFAULT_GLOBAL_BATCH_TOKENS = 131_072


# ---------------------------------------------------------------------- formulas
def chinchilla_tokens(n_params: float) -> float:
    return TOKENS_PER_PARAMETER * n_params


def training_flops(n_params: float, tokens: float) -> float:
    """C = 6ND: forward (2N) and backward (4N) FLOPs per token, attention left out."""
    return dense_flops_per_token(n_params) * tokens


def compute_optimal(compute_flops: float) -> tuple[float, float]:
    """(N_opt parameters, D_opt tokens) minimising Chinchilla's L(N, D) for a budget of C = 6ND FLOPs.

    With G = (alpha A / (beta B))^(1 / (alpha + beta)) (Hoffmann et al. 2022, eq. 4):
    N_opt = G (C/6)^(beta / (alpha + beta)) and D_opt = (C/6) / N_opt, so 6 N_opt D_opt = C exactly.
    """
    a, b = CHINCHILLA_ALPHA, CHINCHILLA_BETA
    g = (a * CHINCHILLA_A / (b * CHINCHILLA_B)) ** (1.0 / (a + b))
    parameter_tokens = compute_flops / TRAINING_FLOPS_PER_PARAMETER  # C/6 = N D
    n_opt = g * parameter_tokens ** (b / (a + b))
    return n_opt, parameter_tokens / n_opt


def chinchilla_loss(n_params: float, tokens: float) -> float:
    """Chinchilla's fitted loss for N parameters trained on D tokens (its data and tokenizer, not ours:
    a guide to the shape of the trade, not a prediction of this run's numbers)."""
    return CHINCHILLA_E + CHINCHILLA_A / n_params**CHINCHILLA_ALPHA + CHINCHILLA_B / tokens**CHINCHILLA_BETA


def tokens_per_s_at_mfu(peak_flops: float, mfu: float, flops_per_token_: float) -> float:
    """Throughput of one GPU running at `mfu` of its peak."""
    return mfu * peak_flops / flops_per_token_


def ring_allreduce_seconds(n_gpus: int, payload_bytes: float, gbps: float) -> float:
    """One ring all-reduce: each GPU sends and receives 2(n-1)/n of the payload over its link."""
    if n_gpus <= 1:
        return 0.0
    return 2 * (n_gpus - 1) / n_gpus * payload_bytes / (gbps * 1e9 / 8)


@dataclass(frozen=True)
class ScalingRow:
    """One line of the GPU-count table: data parallelism over `gpus` GPUs."""

    gpus: int
    tokens_per_s: float  # the job's effective rate, communication included
    compute_hours: float
    communication_hours: float
    hours: float
    cost: float | None  # None when no price is known
    cost_vs_one_gpu: float | None  # cost / cost on one GPU


def scaling_row(
    gpus: int,
    tokens: float,
    tokens_per_s_per_gpu: float,
    price_per_gpu_hour: float | None,
    optimizer_steps: int,
    gradient_bytes: float,
    gbps: float,
) -> ScalingRow:
    """Wall time and cost on `gpus` GPUs: compute split evenly, one unoverlapped all-reduce per step."""
    compute = tokens / (gpus * tokens_per_s_per_gpu) / 3600
    communication = optimizer_steps * ring_allreduce_seconds(gpus, gradient_bytes, gbps) / 3600
    hours = compute + communication
    cost = hours * gpus * price_per_gpu_hour if price_per_gpu_hour else None
    one_gpu_cost = tokens / tokens_per_s_per_gpu / 3600 * price_per_gpu_hour if price_per_gpu_hour else None
    return ScalingRow(
        gpus,
        tokens / (hours * 3600),
        compute,
        communication,
        hours,
        cost,
        cost / one_gpu_cost if cost is not None and one_gpu_cost else None,
    )


# ---------------------------------------------------------------------- one GPU: fit, model, money
ALL_GPUS = "all"
# Recipe keys that, given on the command line, are kept in every row instead of searched for.
FIT_KEYS = ("micro_batch_size", "gradient_checkpointing", "checkpointed_layers")


@dataclass(frozen=True)
class GpuRow:
    """The recipe on one GPU: how it fits, the modelled rate (an estimate), what the run costs."""

    gpu: str
    fits: bool
    micro_batch_size: int | None
    checkpointed_layers: int | None
    tokens_per_s: float | None  # the performance model's, for one GPU
    price_per_gpu_hour: float
    usd_per_billion_tokens: float | None
    hours: float | None  # the recipe's tokens on one GPU
    usd: float | None
    reason: str  # the fit, or why nothing fits
    measured: str | None = None  # where tokens/s is a recorded measurement: which (economics/measurements.py)


def quality_per_token(recipe: Recipe) -> float:
    """How much of a bf16 token one token of this recipe's precision is worth (FP8: measured on a proxy,
    see performance.py)."""
    return FP8_QUALITY_PER_TOKEN if run_profile(recipe, A_GPU).precision == "fp8" else 1.0


def gpu_row(recipe: Recipe, gpu: GPU, tokens: float, price: float, pinned: tuple[str, ...] = ()) -> GpuRow:
    """Fit `recipe` on `gpu` (keeping the `pinned` recipe keys as they are), model its rate for the
    recipe's configuration (compile, Liger, optimizer, precision), price the run. FP8 runs are charged
    for the tokens that match the bf16 run's (`quality_per_token`)."""
    on = machine_with(gpu)
    if run_profile(recipe, on).precision == "fp8" and on.fp8_refusal():
        reason = f"no FP8: compute capability {gpu.compute_capability:.1f} (fp8 needs {FP8_COMPUTE_CAPABILITY}+)"
        return GpuRow(gpu.name, False, None, None, None, price, None, None, None, reason)
    layers = (
        recipe.checkpointed_layer_count if {"gradient_checkpointing", "checkpointed_layers"} & set(pinned) else None
    )
    size = recipe.train.micro_batch_size if "micro_batch_size" in pinned else None
    fit: Fit = fit_in_memory(recipe, recipe_tokenizer_size(recipe), gpu.memory_bytes, size, layers, machine=on)
    if not fit.fits:
        return GpuRow(gpu.name, False, None, None, None, price, None, None, None, fit.reason)
    fitted = with_checkpointed_layers(with_micro_batch(recipe, fit.micro_batch_size), fit.checkpointed_layers)
    measured = recorded_measurement(fitted, gpu.name)  # what this configuration measured on this GPU wins
    rate = measured.tokens_per_s if measured else modelled_tokens_per_s(fitted, gpu)
    hours = tokens / quality_per_token(recipe) / rate / 3600
    return GpuRow(
        gpu.name,
        True,
        fit.micro_batch_size,
        fit.checkpointed_layers,
        rate,
        price,
        dollars_per_billion_tokens(rate, price),
        hours,
        hours * price,
        fit.reason,
        measured.label() if measured else None,
    )


def gpu_prices(prices_file: str | None) -> dict[str, float]:
    """Each table GPU's $/h: the table's typical price, or the entry of `prices_file` naming that GPU."""
    prices = {name: gpu.usd_per_hour for name, gpu in gpu_table().items()}
    if prices_file:  # a name the table does not know is refused (PriceError), never dropped
        prices.update(table_gpu_prices(prices_file))
    return prices


def ranked_rows(recipe: Recipe, tokens: float, prices: dict[str, float], pinned: tuple[str, ...] = ()) -> list[GpuRow]:
    """Every GPU of the table, cheapest run first (the run's dollars, not the hourly price); those the
    recipe does not fit last."""
    rows = [gpu_row(recipe, gpu, tokens, prices[gpu.name], pinned) for gpu in gpu_table().values()]
    return sorted(rows, key=lambda row: (not row.fits, row.usd if row.usd is not None else math.inf))


# ---------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Plan:
    source: str  # "recipe 1b" or "--params"
    parameters: int
    flops_per_token: float
    tokens: float
    tokens_per_parameter: float
    chinchilla_tokens: float
    total_flops: float  # flops_per_token * tokens (attention included when a recipe is known)
    compute_6nd: float
    optimal_parameters: float  # Chinchilla's compute-optimal split of C = 6ND
    optimal_tokens: float
    chinchilla_loss: float  # Chinchilla's L(N, D) for this plan
    optimal_loss: float  # ... and for the compute-optimal split of the same compute
    gpu: str | None
    tokens_per_s_per_gpu: float | None  # None: unknown, so no time or cost
    throughput_source: str
    price_per_gpu_hour: float | None
    usd_per_billion_tokens: float | None
    global_batch_tokens: int
    optimizer_steps: int
    interconnect: str
    interconnect_gbps: float
    gradient_bytes: float
    scaling: list[ScalingRow]
    gpus: list[GpuRow] = field(default_factory=list)  # with a recipe and --gpu: the fitted, modelled rows
    configuration: str = ""  # with a recipe: how the step runs (what the performance model prices)
    quality_per_token: float = 1.0  # FP8: the bf16 tokens one token is worth (FP8_QUALITY_PER_TOKEN, a proxy's)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PlanRequest:
    """What to plan: the model (a recipe, or a bare parameter count) and how it would be run.

    The fields are the command's flags; unset ones come from the recipe where it says (token budget,
    throughput, price), else from the defaults below. Contradictions raise ValueError naming the flag.
    """

    recipe: Recipe | None = None  # parameters and FLOPs of its model, its token budget, batch, rate, price
    params: float | None = None  # without a recipe: the parameter count (FLOPs per token then 6N)
    tokens: float | None = None  # token budget (unset: the recipe's, else Chinchilla's 20 per parameter)
    global_batch_tokens: int | None = None  # without a recipe: tokens per optimizer step (a recipe has its own)
    gpu: str | None = None  # a GPU of the price table: its price and datasheet peak
    prices: str | None = None  # price table YAML (unset: the shipped one)
    price_per_gpu_hour: float | None = None
    tokens_per_s: float | None = None  # measured tokens/s of one GPU
    mfu: float | None = None  # with --params and a GPU: assume this share of its peak (else DEFAULT_MFU)
    pinned: tuple[str, ...] = ()  # FIT_KEYS given on the command line: kept in every GPU row
    max_gpus: int = 8
    interconnect: str = "nvlink"
    interconnect_gbps: float | None = None  # overrides `interconnect`
    gradient_bytes: float = GRADIENT_BYTES  # bytes per parameter all-reduced each step

    def __post_init__(self) -> None:
        if (self.recipe is None) == (self.params is None):
            raise ValueError("plan a recipe (--recipe) or a parameter count (--params): one of them")
        if self.recipe is not None and self.global_batch_tokens is not None:
            raise ValueError("a recipe's batch is its own: override its global_batch_tokens key instead")
        for name in (
            "params",
            "tokens",
            "global_batch_tokens",
            "price_per_gpu_hour",
            "tokens_per_s",
            "mfu",
            "interconnect_gbps",
            "gradient_bytes",
        ):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"--{name} must be positive")
        if self.max_gpus < 1:
            raise ValueError("--max_gpus must be at least 1")
        if self.interconnect not in INTERCONNECT_GBPS:
            raise ValueError(f"--interconnect must be one of {', '.join(sorted(INTERCONNECT_GBPS))}")
        if self.gpu == ALL_GPUS:
            if self.recipe is None:
                raise ValueError("--gpu all fits and models a recipe's model: give --recipe NAME")
            if self.price_per_gpu_hour is not None:
                raise ValueError("--price_per_gpu_hour prices one GPU: with --gpu all, give --prices FILE")


def make_plan(request: PlanRequest) -> Plan:
    """The plan of `request`; raises ValueError (or PriceError) saying what to give instead."""
    if request.recipe is not None:
        recipe = request.recipe
        n_params, per_token = recipe_flops_per_token(recipe)
        source = f"recipe {recipe.name}"
        default_tokens = recipe.train.max_steps * recipe.train.global_batch_tokens
        batch_tokens = recipe.train.global_batch_tokens
        recipe_rate, recipe_price = recipe.reporting.expected_tokens_per_s, recipe.reporting.price_per_hour
    else:
        n_params = int(request.params)
        per_token = dense_flops_per_token(n_params)
        source, default_tokens = "--params", chinchilla_tokens(n_params)
        batch_tokens = request.global_batch_tokens or DEFAULT_GLOBAL_BATCH_TOKENS
        recipe_rate = recipe_price = 0.0
    tokens = float(request.tokens) if request.tokens else float(default_tokens)

    rows: list[GpuRow] = []
    prices = gpu_prices(request.prices)  # read (and checked) even where no GPU is named: never silently unused
    if request.gpu == ALL_GPUS:
        rows = ranked_rows(request.recipe, tokens, prices, request.pinned)
    gpu = gpu_named(request.gpu) if request.gpu and request.gpu != ALL_GPUS else None
    on = machine_with(gpu) if gpu else A_GPU
    if gpu and request.recipe is not None and run_profile(request.recipe, on).precision == "fp8" and on.fp8_refusal():
        raise ValueError(on.fp8_refusal())
    price = request.price_per_gpu_hour or (prices[gpu.name] if gpu else None) or recipe_price or None
    if gpu and request.recipe is not None:
        rows = [gpu_row(request.recipe, gpu, tokens, price, request.pinned)]

    rate: float | None
    if request.tokens_per_s:
        rate, rate_source = request.tokens_per_s, "--tokens_per_s"
    elif gpu and rows:
        rate = rows[0].tokens_per_s
        fitted = run_profile(request.recipe, on, 1, rows[0].micro_batch_size, rows[0].checkpointed_layers).step
        rate_source = (
            f"{rows[0].measured}, for {fitted.describe()}"
            if rows[0].measured
            else f"an estimate of the performance model (economics/performance.py) for {fitted.describe()}; "
            f"measure it with `hf-pretrain bench`"
            if rows[0].fits
            else f"none: {rows[0].reason}"
        )
    elif recipe_rate and request.gpu != ALL_GPUS:
        rate, rate_source = recipe_rate, "the recipe's expected_tokens_per_s"
    elif gpu:
        mfu = request.mfu or DEFAULT_MFU
        rate = tokens_per_s_at_mfu(gpu.bf16_flops, mfu, per_token)
        rate_source = (
            f"assumed {mfu:.0%} MFU of the {gpu.bf16_flops / 1e12:,.0f} TFLOP/s datasheet peak (a parameter "
            f"count has no shape to model; --recipe has); measure it with `hf-pretrain bench`"
        )
    else:
        rate = None
        rate_source = (
            "time and cost need a throughput: --gpu NAME (the performance model with a recipe), "
            "--gpu all, --tokens_per_s, or the recipe's expected_tokens_per_s (`hf-pretrain bench` measures it)"
        )

    gbps = request.interconnect_gbps or INTERCONNECT_GBPS[request.interconnect]
    # FP8 is charged for the tokens that reach the bf16 run's loss, as the GPU rows are
    priced_tokens = tokens / quality_per_token(request.recipe) if request.recipe is not None else tokens
    gradient_bytes = request.gradient_bytes * n_params
    steps = math.ceil(tokens / batch_tokens)
    c_6nd = training_flops(n_params, tokens)
    n_opt, d_opt = compute_optimal(c_6nd)
    return Plan(
        source=source,
        parameters=n_params,
        flops_per_token=per_token,
        tokens=tokens,
        tokens_per_parameter=tokens / n_params,
        chinchilla_tokens=chinchilla_tokens(n_params),
        total_flops=per_token * tokens,
        compute_6nd=c_6nd,
        optimal_parameters=n_opt,
        optimal_tokens=d_opt,
        chinchilla_loss=chinchilla_loss(n_params, tokens),
        optimal_loss=chinchilla_loss(n_opt, d_opt),
        gpu=gpu.name if gpu else request.gpu,
        tokens_per_s_per_gpu=rate,
        throughput_source=rate_source,
        price_per_gpu_hour=price,
        usd_per_billion_tokens=dollars_per_billion_tokens(rate, price) if price and rate else None,
        global_batch_tokens=batch_tokens,
        optimizer_steps=steps,
        interconnect=request.interconnect if not request.interconnect_gbps else "custom",
        interconnect_gbps=gbps,
        gradient_bytes=gradient_bytes,
        scaling=[
            scaling_row(n, priced_tokens, rate, price, steps, gradient_bytes, gbps)
            for n in range(1, request.max_gpus + 1)
        ]
        if rate and request.gpu != ALL_GPUS
        else [],
        gpus=rows,
        configuration=run_profile(request.recipe, on).step.describe() if request.recipe is not None else "",
        quality_per_token=quality_per_token(request.recipe) if request.recipe is not None else 1.0,
    )


# ---------------------------------------------------------------------- printing
def format_plan(plan: Plan) -> str:
    price = (
        f"{usd(plan.price_per_gpu_hour)}/h per GPU"
        if plan.price_per_gpu_hour
        else "price unknown (--price_per_gpu_hour)"
    )
    per_billion = (
        f", {usd(plan.usd_per_billion_tokens)} per billion tokens" if plan.usd_per_billion_tokens is not None else ""
    )
    lines = [
        f"model: {human_count(plan.parameters)} parameters ({plan.source}), {plan.flops_per_token / 1e9:,.2f} GFLOP "
        f"per training token",
        f"tokens: {human_count(plan.tokens)} = {plan.tokens_per_parameter:.1f} per parameter "
        f"(Chinchilla's 20 per parameter: {human_count(plan.chinchilla_tokens)})",
        f"compute: {plan.total_flops:.3g} FLOPs; for C = 6ND = {plan.compute_6nd:.3g} Chinchilla's fit "
        f"(Besiroglu et al. 2024) splits it best as N_opt {human_count(plan.optimal_parameters)} parameters x "
        f"D_opt {human_count(plan.optimal_tokens)} tokens ({plan.optimal_tokens / plan.optimal_parameters:.1f} "
        f"per parameter); its L(N, D): {plan.chinchilla_loss:.3f} for this plan, {plan.optimal_loss:.3f} at the "
        f"optimum (Chinchilla's data, not yours: the shape of the trade, not this run's loss)",
    ]
    if plan.quality_per_token != 1.0 or "fp8" in plan.configuration:
        lines.append(fp8_note(plan.quality_per_token, next((row for row in plan.gpus if row.fits), None)))
    if plan.configuration.startswith("compiled + Liger"):
        lines.append(
            "compiled + Liger: not measured on a GPU yet (the H100 of 2026-11-25 measured eager + Liger and "
            "compiled, and this pair crashed under compile there); the model prices it as the compiled step "
            "with Liger's fused loss"
        )
    if plan.gpu == ALL_GPUS:
        return "\n".join(lines + ["", *format_gpu_rows(plan.gpus, plan.tokens, plan.configuration)]) + "\n"
    if plan.gpus:
        lines += ["", *format_gpu_rows(plan.gpus, plan.tokens, plan.configuration), ""]
    if plan.tokens_per_s_per_gpu is None:
        return "\n".join(lines + [f"time and cost: unknown: {plan.throughput_source}; {price}"]) + "\n"
    lines += [
        f"GPU: {plan.gpu or '(not named)'}: {plan.tokens_per_s_per_gpu:,.0f} tokens/s each ({plan.throughput_source}), "
        f"{price}{per_billion}",
        f"several GPUs: data parallel, {plan.optimizer_steps:,} optimizer steps of {plan.global_batch_tokens:,} "
        f"tokens, each ends with a ring all-reduce of {plan.gradient_bytes / 1e9:,.2f} GB of gradients over "
        f"{plan.interconnect} at {plan.interconnect_gbps:,.0f} Gbit/s per GPU, not overlapped with compute",
        "",
        "| GPUs | job tokens/s | compute h | all-reduce h | wall h | cost ($) | cost vs 1 GPU |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in plan.scaling:
        cost = f"{row.cost:,.2f}" if row.cost is not None else "n/a"
        ratio = f"{row.cost_vs_one_gpu:.3f}x" if row.cost_vs_one_gpu is not None else "n/a"
        lines.append(
            f"| {row.gpus} | {row.tokens_per_s:,.0f} | {row.compute_hours:,.2f} | "
            f"{row.communication_hours:,.2f} | {row.hours:,.2f} | {cost} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def fp8_note(quality: float, cheapest: GpuRow | None = None) -> str:
    """The FP8 line: the quality factor the hours and dollars carry, where it comes from, and the 1B
    estimate's range, with the run's dollars at both ends on the first GPU that fits (the cheapest)."""
    low, high = FP8_TOKENS_FOR_BF16_LOSS_1B_ESTIMATE
    dollars = ""
    if cheapest is not None and cheapest.usd is not None:
        bf16_tokens_usd = cheapest.usd * quality  # the run's dollars at 1.0x: they carry 1/quality
        dollars = f" (${bf16_tokens_usd * low:,.0f}-${bf16_tokens_usd * high:,.0f} on the {cheapest.gpu})"
    return (
        f"fp8: the decoder's linear layers at each card's FP8 rate (performance.py's FP8 term); FP8 needs "
        f"{1 / quality:.3f}x bf16's tokens for its loss, {FP8_QUALITY_SOURCE}, so hours and dollars cover "
        f"{1 / quality:.3f}x the tokens; 1B estimate {low:.2f}-{high:.2f}x tokens{dollars}"
    )


def format_gpu_rows(rows: list[GpuRow], tokens: float, configuration: str = "") -> list[str]:
    """The ranked GPU table: fit, modelled rate (an estimate), $ per billion tokens, hours and dollars."""
    priced = f" for {configuration.split(', micro-batch')[0]}" if configuration else ""
    lines = [
        f"one GPU of each kind for the {human_count(tokens)} tokens, cheapest run first; tokens/s are the "
        f"performance model's estimates{priced} (~, economics/performance.py, docs/benchmarks.md) unless marked "
        f"measured (a bench or training run of the same configuration on that GPU, yours or the project's); "
        f"`hf-pretrain bench` measures yours",
        "",
        "| GPU | fit: micro-batch, checkpointed layers | tokens/s | $/h | $ per 1B tokens | hours | run $ |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if not row.fits:
            lines.append(f"| {row.gpu} | {row.reason} | - | {row.price_per_gpu_hour:,.2f} | - | - | - |")
            continue
        rate = f"{row.tokens_per_s:,.0f} measured" if row.measured else f"~{row.tokens_per_s:,.0f}"
        lines.append(
            f"| {row.gpu} | {row.micro_batch_size}, {row.checkpointed_layers} | {rate} | "
            f"{row.price_per_gpu_hour:,.2f} | {row.usd_per_billion_tokens:,.2f} | {row.hours:,.1f} | {row.usd:,.0f} |"
        )
    measured = [f"- {row.gpu}: {row.measured}" for row in rows if row.measured]
    return lines + (["", "measured rows:", *measured] if measured else [])


# ---------------------------------------------------------------------- going further with a run
@dataclass(frozen=True)
class FurtherPlan:
    run: str
    parameters: int | None
    chinchilla_tokens: float | None
    stable_steps: tuple[int, int]
    steps_so_far: int
    price_per_hour: float
    further: GoingFurther

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def lineage_cooldown(records: list[dict[str, Any]]) -> Cooldown | None:
    """The cooldown of the run as it goes on: the last one logged, unless the run trained past its end (it
    went further after that stop, from its checkpoint before the decay: its stable phase goes on)."""
    cooldowns = [r for r in records if r.get("kind") == "cooldown"]
    if not cooldowns:
        return None
    last = cooldowns[-1]
    if any(r.get("kind") == "train" and r["step"] > last["end"] for r in records):
        return None
    return Cooldown(last["step"], last["end"])


def too_few_steps(run: RunDir, records: list[dict[str, Any]], stable: tuple[int, int], log_interval: int) -> str:
    """Why the loss curve has no fit yet, and when it will: the fit wants `MIN_POINTS` logged losses in the
    later half of the stable steps logged, spanning `MIN_TOKEN_RATIO` x the tokens."""
    first, last = stable
    logged = [r["step"] for r in records if r.get("kind") == "train" and first <= r["step"] <= last]
    # the later half of first..N holds MIN_POINTS records, and N / ((first + N) / 2) >= MIN_TOKEN_RATIO
    ratio = MIN_TOKEN_RATIO / (2 - MIN_TOKEN_RATIO)
    needed = max(first + 2 * MIN_POINTS * log_interval, math.ceil(ratio * first))
    said = (
        f"{run.metrics} has {len(logged)} logged step(s) between steps {first:,} and {last:,} (after the warmup, "
        f"before any decay), too few to fit the loss curve"
    )
    if needed <= last:
        return f"{said}: rerun `hf-pretrain plan --run {run.path}` once the run has logged step {needed:,}"
    return (
        f"{said}, and its stable phase ends before there can be enough (about step {needed:,} at log_interval "
        f"{log_interval}): a run with a smaller log_interval or more steps before its decay has a forecast"
    )


def plan_further(run_dir: str, target_tokens: float | None, price_per_hour: float | None) -> FurtherPlan:
    """What training the run in `run_dir` on to `target_tokens` (unset: Chinchilla's 20 per parameter)
    buys, from its own loss curve, pace and price; raises ValueError saying what is missing."""
    if target_tokens is not None and target_tokens <= 0:
        raise ValueError("--tokens must be positive")
    if price_per_hour is not None and price_per_hour < 0:
        raise ValueError("--price_per_hour must not be negative")
    run = RunDir(run_dir)
    recipe = run.load_recipe()
    if recipe is None:
        raise ValueError(f"{run.resolved_recipe} is missing or unreadable: is {run_dir} a run folder?")
    records = read_jsonl(run.metrics)
    stable = Schedule(recipe).stable_steps(lineage_cooldown(records))
    n_params = recipe_parameter_count(recipe)
    target = target_tokens or chinchilla_tokens(n_params)
    price = recipe.reporting.price_per_hour if price_per_hour is None else price_per_hour
    further = going_further([r for r in records if r.get("kind") == "train"], stable, target, price)
    if further is None:
        raise ValueError(too_few_steps(run, records, stable, recipe.reporting.log_interval))
    steps = max(r["step"] for r in records if r.get("kind") == "train")
    return FurtherPlan(str(run_dir), n_params, chinchilla_tokens(n_params), stable, steps, price, further)


def format_further(plan: FurtherPlan) -> str:
    f, fit = plan.further, plan.further.fit
    tokens_per_step = f.tokens_now / plan.steps_so_far
    lines = [
        f"run {plan.run}: {human_count(f.tokens_now)} tokens so far; the loss curve over steps "
        f"{round(fit.first_tokens / tokens_per_step):,}-{round(fit.last_tokens / tokens_per_step):,} (the later "
        f"half of its stable phase) fits L = {fit.irreducible:.3f} + "
        f"{fit.amplitude:.3f} x (D / {human_count(fit.tokens_0)})^-{fit.exponent:.3f}"
    ]
    if plan.chinchilla_tokens:
        lines.append(
            f"target: {human_count(f.target_tokens)} tokens = {f.target_tokens / plan.parameters:.1f} per "
            f"parameter (Chinchilla's 20: {human_count(plan.chinchilla_tokens)})"
        )
    if f.steps == 0:
        return "\n".join(lines + ["the run has already read that many tokens"]) + "\n"
    cost = f"{usd(f.cost)}" if f.cost is not None else "cost unknown (the run has no price_per_hour; --price_per_hour)"
    lines.append(f"going there: {f.steps:,} more steps, {f.hours:,.2f} h at the run's own pace, {cost}")
    per_point = f", {usd(f.usd_per_loss_point)} per loss point" if f.usd_per_loss_point is not None else ""
    lines.append(
        f"loss (fitted curve, +/- {BAND_SIGMAS:g} sd): {f.loss_now:.3f} +/- {BAND_SIGMAS * f.loss_now_sd:.3f} "
        f"now -> {f.loss_target:.3f} +/- {BAND_SIGMAS * f.loss_target_sd:.3f}, a drop of "
        f"{f.loss_now - f.loss_target:.3f}{per_point}"
    )
    lines.append(
        "the fit describes the curve before any final decay: a wsd run's decay (or a cooldown) drops the loss "
        "further at the end; go further with `--max_steps` on the same output_dir (docs/stopping.md)"
    )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- the command
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
)


def add_plan_options(parser: argparse.ArgumentParser, with_recipe: bool) -> None:
    """The command's own flags. With a recipe, `--global_batch_tokens` and `--price_per_hour` are the
    recipe's keys (its batch, its price), so the plan's flags of those names are left out."""
    group = parser.add_argument_group("plan options")
    group.add_argument(
        "--tokens",
        type=float,
        help="token budget (unset: the recipe's max_steps x global_batch_tokens, else 20 x params; "
        "with --run, 20 x the run's parameters)",
    )
    if not with_recipe:
        group.add_argument(
            "--global_batch_tokens",
            type=int,
            help=f"tokens per optimizer step with --params (unset: {DEFAULT_GLOBAL_BATCH_TOKENS:,})",
        )
    group.add_argument(
        "--gpu",
        help="a GPU of the table (hf_pretrain/economics/gpus.yaml), e.g. H100: its fit, modelled rate and price, "
        "and the several-GPU table; `all`: every GPU of the table ranked by the run's dollars (with --recipe)",
    )
    group.add_argument(
        "--prices",
        help="YAML of GPU names to $ per GPU-hour, overriding the table's typical prices of the GPUs it names",
    )
    group.add_argument(
        "--price_per_gpu_hour",
        type=float,
        help="$ per GPU-hour of the one --gpu (unset: its typical price in the table, else the recipe's price_per_hour)",
    )
    group.add_argument(
        "--tokens_per_s",
        type=float,
        help="measured tokens/s of one GPU (unset: the recipe's expected_tokens_per_s, else --gpu's peak x --mfu)",
    )
    group.add_argument(
        "--mfu",
        type=float,
        help=f"with --params and --gpu: assumed model FLOPs utilisation (unset: {DEFAULT_MFU}); a recipe is modelled",
    )
    group.add_argument("--max_gpus", type=int, default=8, help="table rows for 1..N GPUs")
    group.add_argument(
        "--interconnect",
        choices=sorted(INTERCONNECT_GBPS),
        default="nvlink",
        help="link between the GPUs: " + ", ".join(f"{k} {v:,.0f} Gbit/s" for k, v in INTERCONNECT_GBPS.items()),
    )
    group.add_argument(
        "--interconnect_gbps", type=float, help="link rate in Gbit/s per GPU, one direction (overrides --interconnect)"
    )
    group.add_argument(
        "--gradient_bytes",
        type=float,
        default=GRADIENT_BYTES,
        help="bytes per parameter all-reduced each step (4: fp32 gradients; 2 with a bf16 compression hook)",
    )
    if not with_recipe:
        group.add_argument(
            "--price_per_hour",
            type=float,
            help="with --run: $ per hour of the whole job (unset: the run's price_per_hour)",
        )
    group.add_argument("--json", action="store_true", help="print the plan as JSON")


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
    model.add_argument("--params", type=float, help="parameter count, e.g. 1.04e9 (FLOPs per token then 6N)")
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
    print(json.dumps(plan.to_dict(), indent=1) if args.json else format_plan(plan))
    return 0
