"""The pod check holds the card to the plan: its verdict sets the recipe's step against the tokens/s and $ per token
the plan counts on for that card, at the pod's price (--price_per_hour, the plan's price of the offer SkyPilot
rented, the table's typical price), and a task that sets --slower_than_plan makes a card well under it a faulty
host (71)."""

from __future__ import annotations

import json

import pytest

from hf_pretrain.check.command import EXIT_FAULTY_HOST
from hf_pretrain.check.figures import Figure
from hf_pretrain.check.pod_price import engine_price
from hf_pretrain.check.verdict import RECIPE_AS_WRITTEN, plan_best, plan_shortfall, pod_price, verdict
from hf_pretrain.config import parse_recipe_args
from hf_pretrain.engines.skypilot_task import planned_entry, planned_prices
from hf_pretrain.engines.tasks import SKYPILOT, read_task
from hf_pretrain.machine.gpus import gpu_table
from hf_pretrain.machine.what_if import measured_card, profile_on
from tests.helpers import card_sections

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def recipe_1b():
    # no price of its own (the recipe's is the A100 it was written for): the pod's price comes from elsewhere
    recipe, _ = parse_recipe_args(["--recipe", "1b", "--price_per_hour", "0"], prog="check", description="")
    return recipe


def step(tokens_per_s: float, device: str | None = H100) -> Figure:
    return Figure("step", RECIPE_AS_WRITTEN, tokens_per_s, "tokens/s", device=device)


def test_planned_prices_read_back_what_the_task_writes():
    text = " ".join([planned_entry("verda", "H100", True, 0.8015), planned_entry("lambda", "A100-80GB", False, 1.79)])
    assert [(p.cloud, p.accelerator, p.spot, p.usd_per_hour) for p in planned_prices(text + " junk x:y=z")] == [
        ("verda", "H100", True, 0.8015),
        ("lambda", "A100-80GB", False, 1.79),
    ]


def test_the_pods_price_is_the_plans_price_of_the_offer_skypilot_rented():
    h100 = gpu_table()["H100 SXM"]
    env = {
        "SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "Verda", "region": "FIN-02", "zone": None}),
        "PLANNED_PRICES": "verda:H100:spot=0.8015 verda:H100:on-demand=2.29 nebius:H100:spot=1.25",
    }
    price, source = engine_price(h100.skypilot, env)
    assert price == 0.8015 and "spot" in source and "the lower" in source
    assert engine_price(h100.skypilot, env | {"SKYPILOT_CLUSTER_INFO": "{}"}) is None  # no engine: not said
    assert engine_price(h100.skypilot, env | {"SKYPILOT_CLUSTER_INFO": "not json"}) is None
    assert engine_price(gpu_table()["L40S"].skypilot, env) is None  # a card the plan did not list here
    assert pod_price(3.0, h100) == (3.0, "--price_per_hour")  # the user's price wins


def test_the_verdict_sets_the_step_against_the_plan_for_its_card(recipe_1b, monkeypatch):
    monkeypatch.delenv("SKYPILOT_CLUSTER_INFO", raising=False)
    lines = verdict(
        [step(70_000.0)],
        recipe_1b.model,
        recipe_1b.data,
        step=profile_on(
            recipe_1b.step_as_written, measured_card(H100)
        ).step,  # the recipe's step on the card that measured it
        global_batch_tokens=recipe_1b.train.global_batch_tokens,
        plan=plan_best(**card_sections(recipe_1b)),
        price_per_hour=recipe_1b.reporting.price_per_hour,
        recipe_name=recipe_1b.name,
    )
    against = [line for line in lines if line.startswith("against the plan:")]
    assert (
        len(against) == 1
        and "70,000 tokens/s here, -10% of the plan's 77,935 for the H100 SXM (measured)" in against[0]
    )
    assert "at $2.99/h" in against[0]  # the table's typical price: no engine, no --price_per_hour


def test_a_card_well_under_the_plan_is_a_faulty_host_only_past_the_tasks_threshold(recipe_1b):
    rows = plan_best(**card_sections(recipe_1b))[0]
    slow = [step(50_000.0).__dict__]  # check.json's dicts
    line = plan_shortfall(rows, slow, 0.25)
    assert line and "36% under the 77,935 the plan counts on for the H100 SXM" in line
    assert plan_shortfall(rows, slow, 0.4) is None
    assert plan_shortfall(rows, [step(70_000.0)], 0.25) is None
    assert plan_shortfall(rows, [step(50_000.0, device=None)], 0.25) is None  # a CPU has no plan row
    assert EXIT_FAULTY_HOST == 71


def test_the_shipped_task_holds_its_cards_to_the_plan():
    task = read_task(next(p for p in SKYPILOT if p.name == "1b.yaml"))
    assert "--slower_than_plan 0.25" in task["envs"]["CHECK_ARGS"]
    listed = {(c["cloud"], c["accelerators"].split(":")[0]) for c in task["resources"]["ordered"]}
    priced = {(p.cloud, p.accelerator) for p in planned_prices(task["envs"]["PLANNED_PRICES"])}
    assert listed == priced  # every candidate has the price the check holds it to
