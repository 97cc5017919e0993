"""`plan --run`: what going on to more tokens would buy a run under way, from its own loss curve (the
forecast of the lineage that went on), pace and price; or why its curve has no fit yet, and when it will."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from hf_pretrain.economics.forecast import MIN_POINTS, MIN_TOKEN_RATIO, GoingFurther, going_further
from hf_pretrain.economics.planning.scaling_laws import chinchilla_tokens
from hf_pretrain.model.llama import model_parameter_count, tokenizer_size_of
from hf_pretrain.optim.build import Cooldown, Schedule
from hf_pretrain.run_folder.run_dir import RunDir, read_jsonl


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
    stable = Schedule(recipe.optim, max_steps=recipe.train.max_steps).stable_steps(lineage_cooldown(records))
    n_params = model_parameter_count(recipe.model, tokenizer_size_of(recipe.data))
    target = target_tokens or chinchilla_tokens(n_params)
    price = recipe.reporting.price_per_hour if price_per_hour is None else price_per_hour
    further = going_further([r for r in records if r.get("kind") == "train"], stable, target, price)
    if further is None:
        raise ValueError(too_few_steps(run, records, stable, recipe.reporting.log_interval))
    steps = max(r["step"] for r in records if r.get("kind") == "train")
    return FurtherPlan(str(run_dir), n_params, chinchilla_tokens(n_params), stable, steps, price, further)
