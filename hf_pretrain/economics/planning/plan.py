"""The plan of a `PlanRequest` (`make_plan`): tokens, FLOPs and Chinchilla's split; the GPU rows; the rate of
one GPU and where it comes from; time and money on 1..N GPUs. Every number comes from a pure function."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hf_pretrain.economics.cost import dollars_per_billion_tokens
from hf_pretrain.economics.egress import MoveCost, StorePlace, move_cost, store_place
from hf_pretrain.economics.planning.data_parallel import INTERCONNECT_GBPS, ScalingRow, scaling_row
from hf_pretrain.economics.planning.gpu_ranking import GpuRow, gpu_prices, gpu_row, quality_per_token, ranked_rows
from hf_pretrain.economics.planning.offers import PricedRun, RankedOffers, SpotAssumptions, rank_offers
from hf_pretrain.economics.planning.request import ALL_GPUS, DEFAULT_GLOBAL_BATCH_TOKENS, DEFAULT_MFU, PlanRequest
from hf_pretrain.economics.planning.scaling_laws import (
    chinchilla_loss,
    chinchilla_tokens,
    compute_optimal,
    training_flops,
)
from hf_pretrain.economics.skypilot_catalog import CatalogError, catalog_folder, read_catalog
from hf_pretrain.economics.spot import (
    BEFORE_THE_PROCESS_S,
    PULL_GB_PER_S,
    RELAUNCH_ESTIMATE_S,
    measured_relaunch_s,
    relaunch_estimate_s,
)
from hf_pretrain.machine.gpus import GPU, gpu_named
from hf_pretrain.machine.what_if import profile_on, profile_on_any_card
from hf_pretrain.model.llama import dense_flops_per_token, model_flops_per_token
from hf_pretrain.run_folder.sessions import sessions


def tokens_per_s_at_mfu(peak_flops: float, mfu: float, flops_per_token_: float) -> float:
    """Throughput of one GPU running at `mfu` of its peak."""
    return mfu * peak_flops / flops_per_token_


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
    price_source: str  # where the price comes from, said beside it: the recipe's is of its own GPU
    usd_per_billion_tokens: float | None
    global_batch_tokens: int
    optimizer_steps: int
    interconnect: str
    interconnect_gbps: float
    gradient_bytes: float
    scaling: list[ScalingRow]
    gpus: list[GpuRow] = field(default_factory=list)  # with a recipe and --gpu: the fitted, modelled rows
    configuration: str = ""  # with a recipe: how the step runs (what the performance model prices)
    quality_per_token: float = 1.0  # FP8: the bf16 tokens one token is worth (precisions.py, a proxy's)
    move: MoveCost | None = None  # what moving the run to another machine costs in egress (economics/egress.py)
    offers: RankedOffers | None = None  # with --gpu all and SkyPilot's catalog: every offer, priced by the token
    prices_source: str = ""  # with --gpu all: where the prices come from (the catalog, or the typical table)
    spot: SpotAssumptions | None = None  # what the spot offers' preemptions are priced at

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PlannedModel:
    """What is planned, before any GPU: a recipe's model, or a bare parameter count (FLOPs per token then 6N)."""

    source: str  # "recipe 1b" or "--params"
    parameters: int
    flops_per_token: float
    default_tokens: float  # the budget when --tokens is unset: the recipe's, else Chinchilla's 20 per parameter
    global_batch_tokens: int
    recipe_rate: float  # the recipe's expected_tokens_per_s (0: unknown)
    recipe_price: float  # the recipe's price_per_hour (0: unknown)


def planned_model(request: PlanRequest) -> PlannedModel:
    """The model of `request`, its default token budget, batch, and the rate and price its recipe says."""
    if request.recipe is not None:
        recipe = request.recipe
        n_params, per_token = model_flops_per_token(recipe.model, recipe.data)
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
    return PlannedModel(source, n_params, per_token, default_tokens, batch_tokens, recipe_rate, recipe_price)


def named_gpu_row(request: PlanRequest, gpu: GPU, tokens: float, price: float | None) -> GpuRow:
    """The recipe's row on the one `--gpu`; an FP8 recipe on a card without FP8 is refused."""
    on = profile_on(request.recipe.step_as_written, gpu)  # a what-if: the recipe on the card named
    if refusal := on.machine.refusal(on.step.precision_facts):
        raise ValueError(refusal)
    return gpu_row(gpu, tokens, price, request.pinned, **request.sections)


def one_gpu_rate(
    request: PlanRequest, gpu: GPU | None, rows: list[GpuRow], model: PlannedModel
) -> tuple[float | None, str]:
    """Tokens/s of one GPU and where they come from, the first that applies: --tokens_per_s; the named GPU's
    row (measured, else the performance model); the recipe's expected_tokens_per_s; the GPU's datasheet peak
    at an assumed MFU (a parameter count has no shape to model); else none, and what would give one."""
    rate: float | None
    if request.tokens_per_s:
        rate, rate_source = request.tokens_per_s, "--tokens_per_s"
    elif gpu and rows:
        best = rows[0]
        rate = best.tokens_per_s
        fitted = profile_on(
            request.recipe.step_as_written, gpu, 1, best.micro_batch_size, best.checkpointed_layers
        ).step
        rate_source = (
            f"{best.measured}, for {fitted.describe()}"
            if best.measured
            else f"an estimate of the performance model (economics/performance.py) for {fitted.describe()}; "
            f"measure it with `hf-pretrain bench`"
            if best.fits
            else f"none: {best.reason}"
        )
    elif model.recipe_rate and request.gpu != ALL_GPUS:
        rate, rate_source = model.recipe_rate, "the recipe's expected_tokens_per_s"
    elif gpu:
        mfu = request.mfu or DEFAULT_MFU
        rate = tokens_per_s_at_mfu(gpu.bf16_flops, mfu, model.flops_per_token)
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
    return rate, rate_source


def plan_price(
    request: PlanRequest, gpu: GPU | None, prices: dict[str, float], model: PlannedModel
) -> tuple[float | None, str]:
    """$ per GPU-hour and where it comes from: --price_per_gpu_hour, the price table's for --gpu, else the
    recipe's price_per_hour (whatever GPU its comment names: said as the recipe's, not as any card's)."""
    if request.price_per_gpu_hour:
        return request.price_per_gpu_hour, "--price_per_gpu_hour"
    if gpu is not None and prices.get(gpu.name):
        return prices[gpu.name], f"the {gpu.name}'s typical price"
    if model.recipe_price:
        return model.recipe_price, "the recipe's price_per_hour; --gpu NAME prices a GPU of the table"
    return None, ""


# The store a run's output_dir names, by its scheme, where --store says nothing (an assumption, said in the plan)
STORE_OF_SCHEME = {"s3": "aws_s3", "gs": "gcs", "hf": "huggingface"}
NO_CATALOG = "none"  # --catalog none: the shipped table, even where SkyPilot's catalog exists


def default_store(request: PlanRequest) -> StorePlace:
    """`--store`, else the provider of the recipe's output_dir scheme, else AWS S3 (the docs' store)."""
    if request.store:
        return store_place(request.store)
    scheme = request.recipe.train.output_dir.partition("://")[0] if request.recipe is not None else ""
    return store_place(STORE_OF_SCHEME.get(scheme, "aws_s3"))


def relaunch_times(output_dir: str) -> list[float]:
    """The seconds to the first step of each session after the first of the run in `output_dir` (a local run
    folder; none for a URL or a run not started)."""
    if "://" in output_dir or not Path(output_dir).is_dir():
        return []
    past = sessions(output_dir)[1:]
    return [float(s.first_step["to_first_step_s"]) for s in past if s.first_step.get("to_first_step_s")]


def spot_assumptions(request: PlanRequest, move: MoveCost) -> SpotAssumptions:
    """What a preemption costs this run: the relaunch (--relaunch_s, else the estimate), half a save interval
    of the recipe, the newest checkpoint pulled from the store."""
    relaunches = relaunch_times(request.recipe.train.output_dir)
    if request.relaunch_s is not None:
        relaunch, source = request.relaunch_s, "--relaunch_s"
    elif (measured := measured_relaunch_s(relaunches)) is not None:
        relaunch = measured
        source = (
            f"the run's own: the median time to the first step of its {len(relaunches)} relaunches (sessions.jsonl), "
            f"and {BEFORE_THE_PROCESS_S / 60:.1f} min to notice, provision and install (an estimate)"
        )
    else:
        relaunch = relaunch_estimate_s(move.checkpoint_gb)
        source = (
            f"an estimate: {RELAUNCH_ESTIMATE_S / 60:.1f} min to notice, provision, install, check and compile "
            f"(docs/engines.md), and the {move.checkpoint_gb:,.1f} GB checkpoint pulled at {PULL_GB_PER_S:g} GB/s; "
            f"--relaunch_s"
        )
    return SpotAssumptions(
        relaunch_s=relaunch,
        relaunch_source=source,
        save_interval_steps=request.recipe.checkpoints.save_interval,
        checkpoint_gb=move.checkpoint_gb,
        store=default_store(request),
        preemptions_per_hour=request.preemptions_per_hour,
    )


def catalog_offers(
    request: PlanRequest, cards: list[GpuRow], tokens: float, move: MoveCost, gradient_bytes: float
) -> tuple[RankedOffers | None, str, SpotAssumptions | None]:
    """With --gpu all: every offer of SkyPilot's catalog priced for the run, and where the prices come from;
    without a catalog (or with one that cannot be read: said in one line), None and the typical table's source."""
    typical = "typical on-demand prices of the GPU table (machine/gpus.yaml"
    typical += f", {request.prices}'s where it names the GPU)" if request.prices else ")"
    typical += "; `sky check` fetches SkyPilot's catalog of today's, which plan reads"
    if request.catalog == NO_CATALOG:
        return None, typical, None
    try:
        folder = catalog_folder(request.catalog)
        if folder is None:
            return None, typical, None
        catalog = read_catalog(folder)
    except CatalogError as exc:
        return None, f"{typical} ({exc})", None
    spot = spot_assumptions(request, move)
    recipe = request.recipe
    run = PricedRun(
        tokens,
        quality_per_token(profile_on_any_card(recipe.step_as_written).step),  # each offer's card: the table's, alike
        math.ceil(tokens / recipe.train.global_batch_tokens),
        gradient_bytes,
        recipe.train.global_batch_tokens,
        spot,
    )
    ranked = rank_offers(catalog.offers, {row.gpu: row for row in cards}, run)
    return ranked, catalog.describe(), spot


def make_plan(request: PlanRequest) -> Plan:
    """The plan of `request`; raises ValueError (or PriceError) saying what to give instead."""
    model = planned_model(request)
    n_params, per_token, batch_tokens = model.parameters, model.flops_per_token, model.global_batch_tokens
    tokens = float(request.tokens) if request.tokens else float(model.default_tokens)

    prices = gpu_prices(request.prices)  # read (and checked) even where no GPU is named: never silently unused
    rows = ranked_rows(tokens, prices, request.pinned, **request.sections) if request.gpu == ALL_GPUS else []
    gpu = gpu_named(request.gpu) if request.gpu and request.gpu != ALL_GPUS else None
    price, price_source = plan_price(request, gpu, prices, model)
    if gpu and request.recipe is not None:
        rows = [named_gpu_row(request, gpu, tokens, price)]
    rate, rate_source = one_gpu_rate(request, gpu, rows, model)
    # a what-if: the recipe on the card named, else on any card of the table (the step is alike on each)
    recipe = request.recipe
    written = None if recipe is None else recipe.step_as_written
    planned = None if written is None else profile_on(written, gpu) if gpu else profile_on_any_card(written)

    gbps = request.interconnect_gbps or INTERCONNECT_GBPS[request.interconnect]
    # FP8 is charged for the tokens that reach the bf16 run's loss, as the GPU rows are
    quality = quality_per_token(planned.step) if planned else 1.0
    priced_tokens = tokens / quality
    gradient_bytes = request.gradient_bytes * n_params
    steps = math.ceil(tokens / batch_tokens)
    c_6nd = training_flops(n_params, tokens)
    n_opt, d_opt = compute_optimal(c_6nd)
    move = move_cost(n_params, tokens, request.recipe.data.vocab_size if request.recipe is not None else None)
    offers, prices_source, spot = (
        catalog_offers(request, rows, tokens, move, gradient_bytes) if request.gpu == ALL_GPUS else (None, "", None)
    )
    return Plan(
        source=model.source,
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
        price_source=price_source,
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
        configuration=planned.step.describe() if planned else "",
        move=move,
        quality_per_token=quality,
        offers=offers,
        prices_source=prices_source,
        spot=spot,
    )
