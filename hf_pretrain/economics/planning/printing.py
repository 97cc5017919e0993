"""The plans as a person reads them: the plan with its markdown tables (the ranked GPUs, 1..N GPUs), the FP8
line, and what going further buys a run (`plan --run`). `--json` prints the same plans as they are."""

from __future__ import annotations

from hf_pretrain.economics.forecast import BAND_SIGMAS
from hf_pretrain.economics.planning.further import FurtherPlan
from hf_pretrain.economics.planning.gpu_ranking import GpuRow
from hf_pretrain.economics.planning.offers import RankedOffers, SpotAssumptions
from hf_pretrain.economics.planning.plan import Plan
from hf_pretrain.economics.planning.request import ALL_GPUS
from hf_pretrain.formatting import human_count, usd
from hf_pretrain.machine.precisions import PRECISIONS, Precision

DEFAULT_OFFERS_SHOWN = 20


def format_plan(plan: Plan, offers_shown: int = DEFAULT_OFFERS_SHOWN) -> str:
    price = (
        f"{usd(plan.price_per_gpu_hour)}/h per GPU ({plan.price_source})"
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
    converting = converting_precision(plan.configuration)
    if converting is not None:
        cheapest = next((row for row in plan.gpus if row.fits), None)
        lines.append(precision_note(converting, plan.quality_per_token, cheapest))
    if plan.configuration.startswith("compiled + Liger"):
        lines.append(
            "compiled + Liger: not measured on a GPU yet (the H100 of 2026-11-25 measured eager + Liger and "
            "compiled, and this pair crashed under compile there); the model prices it as the compiled step "
            "with Liger's fused loss"
        )
    if plan.gpu == ALL_GPUS:
        if plan.offers is not None and plan.spot is not None:
            ranked = format_offers(plan.offers, plan.spot, plan.tokens, plan.prices_source, offers_shown)
        else:
            ranked = [f"prices: {plan.prices_source}", *format_gpu_rows(plan.gpus, plan.tokens, plan.configuration)]
        return "\n".join(lines + ["", *ranked, "", *format_move(plan)]) + "\n"
    if plan.gpus:
        lines += ["", *format_gpu_rows(plan.gpus, plan.tokens, plan.configuration), ""]
    if plan.tokens_per_s_per_gpu is None:
        return "\n".join(lines + [f"time and cost: unknown: {plan.throughput_source}; {price}"]) + "\n"
    lines += [
        f"GPU: {plan.gpu or '(not named)'}: {plan.tokens_per_s_per_gpu:,.0f} tokens/s each ({plan.throughput_source}), "
        f"{price}{per_billion}",
        *format_move(plan),
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


def format_move(plan: Plan) -> list[str]:
    """What a move to another machine costs in egress, per store provider (economics/egress.yaml), beside the
    GPU's $ per billion tokens."""
    move = plan.move
    if move is None:
        return []
    rates = ", ".join(
        f"{provider} {usd(per_move)} (${per_gb:.3f}/GB; data {usd(per_billion)} per billion tokens)"
        if per_gb
        else f"{provider} $0 (no egress fee)"
        for provider, per_gb, per_move, per_billion in move.providers
    )
    gpu = f"; the GPU costs {usd(plan.usd_per_billion_tokens)}" if plan.usd_per_billion_tokens is not None else ""
    return [
        f"a move to another machine: the newest checkpoint, {move.checkpoint_gb:,.1f} GB, pulled from the store; the "
        f"data, {move.data_gb:,.1f} GB ({move.data_gb_per_billion_tokens:g} GB per billion tokens{gpu}), is read once "
        f"over the run wherever it trains. Egress per move, at each provider's list price for internet egress "
        f"(economics/egress.yaml; yours may be less): {rates}"
    ]


def format_offers(
    ranked: RankedOffers, spot: SpotAssumptions, tokens: float, source: str, shown: int = DEFAULT_OFFERS_SHOWN
) -> list[str]:
    """Every offer of SkyPilot's catalog the recipe fits, ranked by the run's expected dollars (the first
    `shown`), with what the spot rows assume, and what was left out and why."""
    rows = ranked.rows
    if not rows:
        return [f"prices: {source}", "no offer of the catalog fits the recipe"]
    best = rows[0]
    rate = (
        f"{spot.preemptions_per_hour:g} an hour (--preemptions_per_hour)"
        if spot.preemptions_per_hour is not None
        else "each cloud's estimated rate an hour (economics/spot.yaml; --preemptions_per_hour)"
    )
    lines = [
        f"prices: {source}",
        f"cheapest: {best.card} {best.market} on {best.cloud} in {best.region}, "
        f"{usd(best.usd)} expected for the {human_count(tokens)} tokens ({usd(best.usd_per_billion_tokens)} per "
        f"billion), {best.hours:,.1f} h",
        "",
        f"{len(rows)} offers of one GPU (cloud, region, card, spot or on-demand) priced by the run's tokens, cheapest "
        f"expected run first, the {min(shown, len(rows))} cheapest below (--offers N). Tokens/s are the performance "
        f"model's (~) unless measured. Spot rows are expected values: "
        f"preemptions at {rate}, each costing a relaunch of {spot.relaunch_s / 60:,.1f} min ({spot.relaunch_source}), "
        f"half a save interval ({spot.save_interval_steps:,} steps) trained again and, on a GPU outside the store's "
        f"cloud and region ({spot.store.describe()}; --store), the {spot.checkpoint_gb:,.1f} GB checkpoint's egress "
        f"at ${spot.store.rate.usd_per_gb:g}/GB",
        "",
        "| cloud | region | GPU | market | $/h | tokens/s | preemptions | hours | $ per 1B tokens | run $ |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows[:shown]:
        speed = f"{row.tokens_per_s:,.0f} measured" if row.measured else f"~{row.tokens_per_s:,.0f}"
        preempted = f"{row.preemptions:,.1f}" if row.spot else "-"
        lines.append(
            f"| {row.cloud} | {row.region} | {row.card} | {row.market} | {row.price_per_hour:,.2f} | "
            f"{speed} | {preempted} | {row.hours:,.1f} | {row.usd_per_billion_tokens:,.2f} | {row.usd:,.0f} |"
        )
    if ranked.unfit:
        lines += ["", "not priced, the recipe does not fit: " + "; ".join(f"{c}: {r}" for c, r in ranked.unfit.items())]
    if ranked.machines_of_more_gpus:
        lines += [
            "",
            f"not priced, {ranked.machines_of_more_gpus} offers of several GPUs a machine: the shipped task trains on "
            f"one GPU (several: engines/skypilot/1b_multinode.yaml; `plan --recipe NAME --gpu NAME` models 1..N GPUs)",
        ]
    if ranked.unknown:
        unknown = ", ".join(f"{name} ({count} offers)" for name, count in ranked.unknown.items())
        lines += ["", f"not priced, cards the GPU table does not know (machine/gpus.yaml `skypilot`): {unknown}"]
    return lines


def converting_precision(configuration: str) -> Precision | None:
    """The precision named in a plan's configuration (`compiled, fp8, adamw, ...`) where it converts the
    decoder linears (fp8), else None."""
    words = set(configuration.split(", "))
    return next((p for p in PRECISIONS if p.converts_linears and p.name in words), None)


def precision_note(precision: Precision, quality: float, cheapest: GpuRow | None = None) -> str:
    """The FP8 line (a precision that converts the decoder linears): the quality factor the hours and
    dollars carry, where it comes from, and the 1B estimate's range, with the run's dollars at both ends
    on the first GPU that fits (the cheapest)."""
    name, label = precision.name, precision.name.upper()
    estimate = ""
    if precision.tokens_for_bf16_loss_1b is not None:
        low, high = precision.tokens_for_bf16_loss_1b
        dollars = ""
        if cheapest is not None and cheapest.usd is not None:
            bf16_tokens_usd = cheapest.usd * quality  # the run's dollars at 1.0x: they carry 1/quality
            dollars = f" (${bf16_tokens_usd * low:,.0f}-${bf16_tokens_usd * high:,.0f} on the {cheapest.gpu})"
        estimate = f"; 1B estimate {low:.2f}-{high:.2f}x tokens{dollars}"
    return (
        f"{name}: the decoder's linear layers at each card's {label} rate (performance.py's FP8 term); {label} "
        f"needs {1 / quality:.3f}x bf16's tokens for its loss, {precision.quality_source or 'not measured'}, so "
        f"hours and dollars cover {1 / quality:.3f}x the tokens{estimate}"
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
