"""The check's verdict: what a billion tokens of the recipe cost on this pod at its price, where that
ranks in `plan`'s table of GPUs (economics/planning/gpu_ranking.py: the performance model, or a recorded measurement),
and whether the pod is well under what the same card measured elsewhere ("likely a slow or faulty
node"): under SLOW_NODE_FRACTION of the project's or the user's recorded step for this configuration
(economics/measurements.py, measured.jsonl), of the published matmul rate of its kind (gpus.yaml), or
of an earlier check of the same card; and under the performance model (performance.py). A CPU prices
no GPU: its verdict says so and names plan's best."""

from __future__ import annotations

from hf_pretrain.check.figures import Figure
from hf_pretrain.check.pod_price import engine_price
from hf_pretrain.config import DataConfig, ModelConfig, StepAsWritten, TrainConfig
from hf_pretrain.economics.check_records import earlier_figure
from hf_pretrain.economics.cost import dollars_per_billion_tokens
from hf_pretrain.economics.measurements import Configuration, configuration, recorded_measurement
from hf_pretrain.economics.performance import SLOW_NODE_FRACTION, slow_node_warning
from hf_pretrain.economics.planning.gpu_ranking import gpu_prices, ranked_rows
from hf_pretrain.economics.workload import Workload, run_workload
from hf_pretrain.machine.gpus import GPU, find_gpu
from hf_pretrain.machine.run_profile import Step
from hf_pretrain.model.llama import model_flops_per_token

RECIPE_AS_WRITTEN = "recipe as written"


def add_mfu(per_token: float, figures: list[Figure]) -> None:
    """MFU of each step figure (of a model of `per_token` training FLOPs a token): of the datasheet's bf16
    peak on a GPU the table knows, else (a CPU) of the matmul rate the check measured."""
    matmul = next((f for f in figures if f.part == "matmul" and f.name in ("bfloat16", "float32") and f.value), None)
    for figure in figures:
        if figure.part != "step" or not figure.value:
            continue
        gpu = find_gpu(figure.device) if figure.device else None
        datasheet = gpu.bf16_flops if gpu else None
        if datasheet:
            figure.detail["mfu"] = figure.value * per_token / datasheet
        if matmul:
            scale = 1e12 if figure.device else 1e9
            figure.detail["mfu_of_measured_matmul"] = figure.value * per_token / (matmul.value * scale)


def step_lines(figures: list[Figure]) -> list[str]:
    """`recipe as written: 77,935 tokens/s, MFU 55.5% (71.0% of the measured matmul peak), peak 37.24 GiB`."""
    lines = []
    for f in figures:
        if f.part != "step" or not f.value:
            continue
        mfu = [f"MFU {f.detail['mfu']:.1%}"] if "mfu" in f.detail else []
        if "mfu_of_measured_matmul" in f.detail:
            mfu.append(f"{f.detail['mfu_of_measured_matmul']:.1%} of the measured matmul peak")
        peak = f.detail.get("peak_memory_gib")
        lines.append(
            f"{f.name}: {f.value:,.0f} tokens/s"
            + "".join(f", {m}" for m in mfu)
            + (f", peak {peak:.2f} GiB" if peak else "")
        )
    return lines


def measured_device(figures: list[Figure]) -> str | None:
    """The card the parts measured on, by the name CUDA gave it; None where they ran on a CPU."""
    return next((f.device for f in figures if f.device), None)


def plan_best(*, model: ModelConfig, data: DataConfig, train: TrainConfig, written: StepAsWritten) -> tuple[list, str]:
    """`plan`'s rows for the recipe's sections (gpu_ranking.gpu_row's), the cards it fits cheapest first, and
    the line that names the best."""
    tokens = train.max_steps * train.global_batch_tokens
    sections = {"model": model, "data": data, "train": train, "written": written}
    rows = [row for row in ranked_rows(tokens, gpu_prices(None), **sections) if row.fits]
    rows.sort(key=lambda row: row.usd_per_billion_tokens)
    best = rows[0]
    how = "measured" if best.measured else "modelled"
    return rows, f"{best.gpu} at ${best.usd_per_billion_tokens:,.2f} per billion tokens ({how})"


def slow_node_lines(
    device: str, figures: list[Figure], step: Figure | None, *, work: Workload, wanted: Configuration
) -> list[str]:
    """Why this pod looks slow or faulty: the recipe's step (`step`) under the performance model's rate for
    `work` or under what the `wanted` configuration measured before; the bf16 matmul under its kind's."""
    gpu = find_gpu(device)
    name = gpu.name if gpu else device
    lines = []
    if step is not None:
        modelled = slow_node_warning(step.value, device, work)
        if modelled:
            lines.append(modelled)
        recorded = recorded_measurement(wanted, device)
        if recorded and step.value < SLOW_NODE_FRACTION * recorded.tokens_per_s:
            lines.append(
                f"likely a slow or faulty node: {step.value:,.0f} tokens/s, "
                f"{1 - step.value / recorded.tokens_per_s:.0%} under the {recorded.tokens_per_s:,.0f} this configuration "
                f"{recorded.label()}"
            )
    matmul = next((f for f in figures if f.part == "matmul" and f.name == "bfloat16" and f.value), None)
    if matmul and gpu:
        published = (gpu.matmul_efficiency or 0) * gpu.bf16_flops / 1e12
        earlier = earlier_figure("matmul", "bfloat16", name, [])
        for what, value in (
            ("published for its kind (gpus.yaml)", published),
            (
                f"an earlier check of a {name} measured ({earlier.date})" if earlier else "",
                earlier.value if earlier else 0,
            ),
        ):
            if value and matmul.value < SLOW_NODE_FRACTION * value:
                lines.append(
                    f"likely a slow or faulty node: bf16 matmul {matmul.value:,.0f} TFLOP/s, "
                    f"{1 - matmul.value / value:.0%} under the {value:,.0f} {what} (nvidia-smi -q -d CLOCK,PERFORMANCE)"
                )
    return lines


def faulty_lines(figures: list) -> list[str]:
    """The health part's findings that make this machine one to leave (check/gpu_health.py); figures as
    objects or as check.json's dicts."""
    lines = []
    for f in figures:
        part, detail, text = (f["part"], f["detail"], f["text"]) if isinstance(f, dict) else (f.part, f.detail, f.text)
        if part == "health" and detail.get("verdict") == "faulty":
            lines.append(text.removeprefix("FAULTY: "))
    return lines


def store_failures(figures: list) -> list[tuple[str, str]]:
    """(how, the line) of each store the run uses that failed from this machine (part f, check/store_rates.py):
    how is "unreachable" (it did not answer) or "refused" (it answered no); figures as objects or dicts."""
    failed = []
    for f in figures:
        part, detail, text = (f["part"], f["detail"], f["text"]) if isinstance(f, dict) else (f.part, f.detail, f.text)
        if part == "object_store" and detail.get("store"):
            failed.append((detail["store"], text))
    return failed


def pod_price(given: float, gpu: GPU | None) -> tuple[float, str]:
    """This pod's $/h and where it comes from: --price_per_hour, the plan's price of the offer the engine rented
    (check/pod_price.py), the GPU table's typical price; 0 where none is known."""
    if given:
        return given, "--price_per_hour"
    planned = engine_price(gpu.skypilot) if gpu else None
    if planned:
        return planned
    return (gpu.usd_per_hour, "gpus.yaml's typical price") if gpu else (0.0, "")


def plan_row(rows: list, gpu: GPU | None):
    """plan's row of this card (`rows`: plan_best's), or None for a card the table does not know."""
    return next((row for row in rows if gpu and row.gpu == gpu.name), None)


def against_the_plan(rows: list, gpu: GPU | None, step: Figure | None, price: float) -> list[str]:
    """The recipe's step here against what the plan counts on for this card, tokens/s and $ per token at this
    pod's price: the figure the plan ranked the card by, and so the figure its task rented it for."""
    row = plan_row(rows, gpu)
    if row is None or step is None or not row.tokens_per_s:
        return []
    how = "measured" if row.measured else "modelled"
    return [
        f"against the plan: {step.value:,.0f} tokens/s here, {step.value / row.tokens_per_s - 1:+.0%} of the plan's "
        f"{row.tokens_per_s:,.0f} for the {row.gpu} ({how}); "
        f"${dollars_per_billion_tokens(step.value, price):,.2f} per billion tokens against the plan's "
        f"${dollars_per_billion_tokens(row.tokens_per_s, price):,.2f} at ${price:.2f}/h"
    ]


def plan_shortfall(rows: list, figures: list, fraction: float) -> str | None:
    """Why this pod is a faulty host for a task that rented it by the plan: the recipe's step more than
    `fraction` under the plan's tokens/s for its card (figures as objects or check.json's dicts); None when not."""
    steps = [f if isinstance(f, dict) else f.__dict__ for f in figures]
    step = next((f for f in steps if f["part"] == "step" and f["name"] == RECIPE_AS_WRITTEN and f["value"]), None)
    row = plan_row(rows, find_gpu(step["device"]) if step and step.get("device") else None)
    if step is None or row is None or not row.tokens_per_s or step["value"] >= (1 - fraction) * row.tokens_per_s:
        return None
    return (
        f"the recipe's step ran {step['value']:,.0f} tokens/s, {1 - step['value'] / row.tokens_per_s:.0%} under the "
        f"{row.tokens_per_s:,.0f} the plan counts on for the {row.gpu} (more than --slower_than_plan {fraction:g})"
    )


def verdict(
    figures: list[Figure],
    model: ModelConfig,
    data: DataConfig,
    *,
    step: Step | None,
    global_batch_tokens: int,
    plan: tuple[list, str],
    price_per_hour: float,
    recipe_name: str,
) -> list[str]:
    """The verdict's lines (figures' MFU added); a store the run cannot use from here, first. `step` is the
    recipe's step on the card the figures were measured on (None where they ran on a CPU), `plan` plan_best's
    rows and best, `price_per_hour` the recipe's (0: the pod's price is found elsewhere, pod_price)."""
    add_mfu(model_flops_per_token(model, data)[1], figures)
    stores = [f"the run's store fails from here: {text}" for _, text in store_failures(figures)]
    rows, best_text = plan
    device = measured_device(figures)
    steps = [f for f in figures if f.part == "step" and f.value]
    as_written = next((f for f in steps if f.name == RECIPE_AS_WRITTEN), None)
    measured = step_lines(figures)
    if device is None:
        return (
            stores
            + measured
            + [
                "measured on a CPU: it prices no GPU, and the records it left are labelled cpu (plan never reads them)",
                f"plan's best for {recipe_name}: {best_text}; rent that card and run this check on it",
            ]
        )
    gpu = find_gpu(device)
    price, where = pod_price(price_per_hour, gpu)
    lines = stores + measured
    if not steps:
        lines.append("no step was measured: no $ per token (see the step part's lines)")
    elif not price:
        lines.append(f"{device} is not in the GPU table: give its price, --price_per_hour X, for $ per token")
    else:
        fastest = max(steps, key=lambda f: f.value)
        usd = dollars_per_billion_tokens(fastest.value, price)
        rank = 1 + sum(1 for row in rows if row.usd_per_billion_tokens < usd and row.gpu != (gpu.name if gpu else ""))
        lines.append(
            f"${usd:,.2f} per billion tokens on this {device} at ${price:.2f}/h ({where}), "
            f"{fastest.name} at {fastest.value:,.0f} tokens/s"
        )
        lines.append(f"ranks {rank} of {len(rows)} in plan's table; plan's best: {best_text}")
        lines += against_the_plan(rows, gpu, as_written, price)
    faulty = [f"faulty host: {line}" for line in faulty_lines(figures)]
    work, wanted = (
        run_workload(model, data, step, global_batch_tokens),
        configuration(model, data, step, global_batch_tokens=global_batch_tokens),
    )
    slow = slow_node_lines(device, figures, as_written, work=work, wanted=wanted)
    lines += faulty + slow or ["no sign of a slow or faulty node"]
    return lines
