"""`hf-pretrain plan`: tokens, FLOPs, time and money of a run before it starts, on 1..N GPUs.

    hf-pretrain plan --recipe 1b --gpu H100
    hf-pretrain plan --params 1.04e9 --tokens 20e9 --tokens_per_s 40000 --price_per_gpu_hour 2.99 --max_gpus 8 --json

Every number comes from a pure function below, so the tests check them against hand-computed
values. The multi-GPU model is deliberately simple and pessimistic: data parallelism with one ring
all-reduce of the gradients per optimizer step, *not* overlapped with compute (DDP overlaps part
of it with the backward pass, so real runs land between the compute-only and the total figure).
It shows the trade: more GPUs buy time, never money.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from hf_pretrain.config import CommandParser, RecipeError, load_recipe
from hf_pretrain.economics.cost import dollars_per_billion_tokens
from hf_pretrain.economics.prices import PriceError, load_prices
from hf_pretrain.formatting import human_count, usd
from hf_pretrain.hardware import best_match, peak_flops_for_name
from hf_pretrain.model import recipe_flops_per_token

# Chinchilla (Hoffmann et al. 2022): about 20 training tokens per parameter is compute-optimal.
TOKENS_PER_PARAMETER = 20
# The compute-optimal fit N_opt = a * C^alpha, D_opt = b * C^beta, with C in FLOPs (C = 6ND).
FIT_N_COEFFICIENT, FIT_N_EXPONENT = 0.2536, 0.4995
FIT_D_COEFFICIENT, FIT_D_EXPONENT = 1.7424, 0.5005
# Per-GPU, one-direction link rates in Gbit/s: NVLink 4 on H100 SXM (450 GB/s), PCIe 4.0 x16
# (32 GB/s), and a common 100 GbE cloud NIC between nodes.
INTERCONNECT_GBPS = {"nvlink": 3600.0, "pcie": 256.0, "ethernet": 100.0}
# Accelerate's bf16 autocast keeps fp32 weights, so the gradients DDP all-reduces are fp32.
GRADIENT_BYTES_PER_PARAMETER = 4
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
    return 6.0 * n_params * tokens


def compute_optimal(compute_flops: float) -> tuple[float, float]:
    """(N_opt parameters, D_opt tokens) of the compute-optimal fit for a budget of C FLOPs."""
    return (FIT_N_COEFFICIENT * compute_flops ** FIT_N_EXPONENT,
            FIT_D_COEFFICIENT * compute_flops ** FIT_D_EXPONENT)


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


def scaling_row(gpus: int, tokens: float, tokens_per_s_per_gpu: float, price_per_gpu_hour: float | None,
                optimizer_steps: int, gradient_bytes: float, gbps: float) -> ScalingRow:
    """Wall time and cost on `gpus` GPUs: compute split evenly, one unoverlapped all-reduce per step."""
    compute = tokens / (gpus * tokens_per_s_per_gpu) / 3600
    communication = optimizer_steps * ring_allreduce_seconds(gpus, gradient_bytes, gbps) / 3600
    hours = compute + communication
    cost = hours * gpus * price_per_gpu_hour if price_per_gpu_hour else None
    one_gpu_cost = tokens / tokens_per_s_per_gpu / 3600 * price_per_gpu_hour if price_per_gpu_hour else None
    return ScalingRow(gpus, tokens / (hours * 3600), compute, communication, hours, cost,
                      cost / one_gpu_cost if cost is not None and one_gpu_cost else None)


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
    optimal_parameters: float  # the compute-optimal fit at C = 6ND
    optimal_tokens: float
    gpu: str | None
    tokens_per_s_per_gpu: float
    throughput_source: str
    price_per_gpu_hour: float | None
    usd_per_billion_tokens: float | None
    global_batch_tokens: int
    optimizer_steps: int
    interconnect: str
    interconnect_gbps: float
    gradient_bytes: float
    scaling: list[ScalingRow]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_plan(args: argparse.Namespace) -> Plan:
    """The plan for parsed command-line arguments; raises ValueError with what to give instead."""
    if args.recipe:
        recipe = load_recipe(args.recipe)
        n_params, per_token = recipe_flops_per_token(recipe)
        source = f"recipe {recipe.name}"
        default_tokens = recipe.train.max_steps * recipe.train.global_batch_tokens
        batch_tokens = recipe.train.global_batch_tokens
        recipe_rate, recipe_price = recipe.train.expected_tokens_per_s, recipe.train.price_per_hour
    else:
        n_params = int(args.params)
        per_token = 6.0 * n_params
        source, default_tokens, batch_tokens = "--params", chinchilla_tokens(n_params), DEFAULT_GLOBAL_BATCH_TOKENS
        recipe_rate = recipe_price = 0.0
    tokens = float(args.tokens) if args.tokens else float(default_tokens)
    batch_tokens = args.global_batch_tokens or batch_tokens

    prices = load_prices(args.prices)
    gpu = None
    if args.gpu:
        gpu = best_match(args.gpu, prices) or args.gpu
    price = args.price_per_gpu_hour or (prices.get(gpu) if gpu else None) or recipe_price or None

    if args.tokens_per_s:
        rate, rate_source = args.tokens_per_s, "--tokens_per_s"
    elif recipe_rate:
        rate, rate_source = recipe_rate, "the recipe's expected_tokens_per_s"
    elif gpu and peak_flops_for_name(gpu):
        peak = peak_flops_for_name(gpu)
        rate = tokens_per_s_at_mfu(peak, args.mfu, per_token)
        rate_source = (f"assumed {args.mfu:.0%} MFU of the {peak / 1e12:,.0f} TFLOP/s datasheet peak; "
                       f"measure it with `hf-pretrain bench`")
    else:
        known = f" (known: {', '.join(prices)})" if gpu else ""
        raise ValueError(f"no throughput: give --tokens_per_s, or --gpu with a GPU whose peak is known{known}")

    gbps = args.interconnect_gbps or INTERCONNECT_GBPS[args.interconnect]
    gradient_bytes = args.gradient_bytes * n_params
    steps = math.ceil(tokens / batch_tokens)
    c_6nd = training_flops(n_params, tokens)
    n_opt, d_opt = compute_optimal(c_6nd)
    return Plan(
        source=source, parameters=n_params, flops_per_token=per_token, tokens=tokens,
        tokens_per_parameter=tokens / n_params, chinchilla_tokens=chinchilla_tokens(n_params),
        total_flops=per_token * tokens, compute_6nd=c_6nd, optimal_parameters=n_opt, optimal_tokens=d_opt,
        gpu=gpu, tokens_per_s_per_gpu=rate, throughput_source=rate_source, price_per_gpu_hour=price,
        usd_per_billion_tokens=dollars_per_billion_tokens(rate, price) if price else None,
        global_batch_tokens=batch_tokens, optimizer_steps=steps,
        interconnect=args.interconnect if not args.interconnect_gbps else "custom", interconnect_gbps=gbps,
        gradient_bytes=gradient_bytes,
        scaling=[scaling_row(n, tokens, rate, price, steps, gradient_bytes, gbps) for n in range(1, args.max_gpus + 1)],
    )


# ---------------------------------------------------------------------- printing
def format_plan(plan: Plan) -> str:
    price = f"{usd(plan.price_per_gpu_hour)}/h per GPU" if plan.price_per_gpu_hour else "price unknown (--price_per_gpu_hour)"
    per_billion = (f", {usd(plan.usd_per_billion_tokens)} per billion tokens"
                   if plan.usd_per_billion_tokens is not None else "")
    lines = [
        f"model: {human_count(plan.parameters)} parameters ({plan.source}), {plan.flops_per_token / 1e9:,.2f} GFLOP "
        f"per training token",
        f"tokens: {human_count(plan.tokens)} = {plan.tokens_per_parameter:.1f} per parameter "
        f"(Chinchilla's 20 per parameter: {human_count(plan.chinchilla_tokens)})",
        f"compute: {plan.total_flops:.3g} FLOPs; for C = 6ND = {plan.compute_6nd:.3g} the compute-optimal fit "
        f"gives N_opt {human_count(plan.optimal_parameters)} parameters, "
        f"D_opt {human_count(plan.optimal_tokens)} tokens",
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
        lines.append(f"| {row.gpus} | {row.tokens_per_s:,.0f} | {row.compute_hours:,.2f} | "
                     f"{row.communication_hours:,.2f} | {row.hours:,.2f} | {cost} | {ratio} |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    # `--price` was this command's $/GPU-hour while `bench --price` took NAME=USD: one name, one meaning.
    parser = CommandParser(prog="hf-pretrain plan", description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1],
                           renamed={"--price": "--price_per_gpu_hour"})
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--recipe", help="recipe name or YAML path: parameters from a meta-device build")
    model.add_argument("--params", type=float, help="parameter count, e.g. 1.04e9 (FLOPs per token then 6N)")
    parser.add_argument("--tokens", type=float,
                        help="token budget (unset: the recipe's max_steps x global_batch_tokens, else 20 x params)")
    parser.add_argument("--global_batch_tokens", type=int,
                        help=f"tokens per optimizer step (unset: the recipe's, else {DEFAULT_GLOBAL_BATCH_TOKENS:,})")
    parser.add_argument("--gpu", help="a GPU from the price table (its price and datasheet peak), e.g. H100")
    parser.add_argument("--prices", help="price table YAML (unset: the shipped hf_pretrain/economics/prices.yaml)")
    parser.add_argument("--price_per_gpu_hour", type=float,
                        help="$ per GPU-hour (unset: the --gpu entry, else the recipe's price_per_hour)")
    parser.add_argument("--tokens_per_s", type=float,
                        help="measured tokens/s of one GPU (unset: the recipe's expected_tokens_per_s, else "
                             "--gpu's peak x --mfu)")
    parser.add_argument("--mfu", type=float, default=DEFAULT_MFU,
                        help="assumed model FLOPs utilisation with --gpu and no measured rate")
    parser.add_argument("--max_gpus", type=int, default=8, help="table rows for 1..N GPUs")
    parser.add_argument("--interconnect", choices=sorted(INTERCONNECT_GBPS), default="nvlink",
                        help="link between the GPUs: " + ", ".join(f"{k} {v:,.0f} Gbit/s"
                                                                   for k, v in INTERCONNECT_GBPS.items()))
    parser.add_argument("--interconnect_gbps", type=float,
                        help="link rate in Gbit/s per GPU, one direction (overrides --interconnect)")
    parser.add_argument("--gradient_bytes", type=float, default=GRADIENT_BYTES_PER_PARAMETER,
                        help="bytes per parameter all-reduced each step (4: fp32 gradients; 2 with a bf16 "
                             "compression hook)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("params", "tokens", "tokens_per_s", "price_per_gpu_hour", "mfu", "interconnect_gbps", "gradient_bytes"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name} must be positive")
    if args.max_gpus < 1:
        parser.error("--max_gpus must be at least 1")
    try:
        plan = make_plan(args)
    except (RecipeError, PriceError, ValueError) as exc:
        parser.exit(2, f"hf-pretrain plan: error: {exc}\n")
    print(json.dumps(plan.to_dict(), indent=1) if args.json else format_plan(plan))
    return 0
