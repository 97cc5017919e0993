"""Time and money the whole run will take, from the recipe's expected throughput and price."""

from __future__ import annotations

from hf_pretrain.config import Recipe
from hf_pretrain.config.recipe_command import recipe_command
from hf_pretrain.config.schema import KEY_SECTION
from hf_pretrain.economics.cost import dollars, dollars_per_billion_tokens
from hf_pretrain.formatting import usd
from hf_pretrain.preflight.result import CheckResult


def run_tokens(recipe: Recipe) -> int:
    return recipe.train.max_steps * recipe.train.global_batch_tokens


def run_hours(recipe: Recipe) -> float | None:
    """Wall-clock hours at expected_tokens_per_s, or None when the throughput is unknown (0)."""
    rate = recipe.train.expected_tokens_per_s
    return run_tokens(recipe) / rate / 3600 if rate else None


def run_cost(recipe: Recipe) -> float | None:
    """Dollars at price_per_hour for the whole job, or None when throughput or price is unknown."""
    hours, price = run_hours(recipe), recipe.train.price_per_hour
    return dollars(hours, price) if hours is not None and price else None


def bench_command(recipe: Recipe) -> str:
    """The `hf-pretrain bench` of this very recipe: its file (a path stays a path, not its `name`) and
    every key the command line changed, so that it works when pasted."""
    return recipe_command(recipe, "bench", KEY_SECTION)


def check_cost(recipe: Recipe) -> CheckResult:
    t = recipe.train
    tokens = f"{run_tokens(recipe):,} tokens ({t.max_steps:,} steps x {t.global_batch_tokens:,})"
    hours, cost = run_hours(recipe), run_cost(recipe)
    if hours is None:
        return CheckResult(
            "time and cost",
            "warn",
            f"{tokens}: time and cost unknown (expected_tokens_per_s=0)",
            f"measure with `{bench_command(recipe)}`, then set --expected_tokens_per_s"
            + ("" if t.price_per_hour else " and --price_per_hour"),
        )
    duration = f"{hours:,.1f} h at {t.expected_tokens_per_s:,.0f} tokens/s"
    if cost is None:
        return CheckResult(
            "time and cost",
            "warn",
            f"{tokens}: {duration}; cost unknown (price_per_hour=0)",
            "set --price_per_hour (the job's $/hour, all GPUs)",
        )
    per_billion = dollars_per_billion_tokens(t.expected_tokens_per_s, t.price_per_hour)
    return CheckResult(
        "time and cost",
        "pass",
        f"{tokens}: {duration}, {usd(cost)} at {usd(t.price_per_hour)}/h ({usd(per_billion)} per billion tokens)",
    )
