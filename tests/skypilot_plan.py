"""The shipped SkyPilot task as the plan writes it from the catalog snapshot in ../shared (tests and the
regeneration script share it)."""

from __future__ import annotations

from pathlib import Path

from hf_pretrain.config import parse_recipe_args
from hf_pretrain.economics.planning.plan import make_plan
from hf_pretrain.economics.planning.plan_command import skypilot_candidates
from hf_pretrain.economics.planning.request import ALL_GPUS, PlanRequest
from hf_pretrain.engines.skypilot_task import SHIPPED_TASK, task_text

SNAPSHOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "skypilot-catalog"


def shipped_task_from_snapshot() -> str:
    """The shipped 1b task with the offers `plan --recipe 1b --gpu all --catalog SNAPSHOT` ranks cheapest."""
    recipe, _ = parse_recipe_args(["--recipe", "1b"], prog="plan", description="")
    plan = make_plan(PlanRequest(recipe=recipe, gpu=ALL_GPUS, catalog=str(SNAPSHOT)))
    assert plan.offers is not None, plan.prices_source
    return task_text(SHIPPED_TASK.read_text(), skypilot_candidates(plan.offers.rows))
