"""Cost accounting and early stopping on synthetic metrics, where every number is known."""

import math

import pytest

from hf_pretrain.config import build_recipe
from hf_pretrain.economics.cost import (
    Phase,
    dollars_per_billion_tokens,
    markdown_table,
    phase_row,
    phases_from_recipe,
    window_cost_per_loss_point,
    write_phase_table,
)
from hf_pretrain.training.guards import EarlyStop


def synthetic_records(losses, seconds_per_step=36.0):
    """One record per step; at 36 s/step, 100 steps are one hour."""
    return [
        {"kind": "train", "step": i + 1, "loss": loss, "elapsed": (i + 1) * seconds_per_step, "tokens_per_s": 1000.0}
        for i, loss in enumerate(losses)
    ]


def test_phase_rows_and_cost_per_loss_point(tmp_path):
    # loss falls 10 -> 5 over the first 100 steps, then 5 -> 4.5 over the next 200
    losses = [10 - 5 * (i + 1) / 100 for i in range(100)] + [5 - 0.5 * (i + 1) / 200 for i in range(200)]
    records = synthetic_records(losses)
    phases = phases_from_recipe({"grind": 300, "proof-of-life": 100})
    assert phases == [Phase("proof-of-life", 0, 100), Phase("grind", 100, 300)]
    first, second = (phase_row(records, p, price_per_hour=2.0) for p in phases)
    assert first.loss_start == pytest.approx(10 - 0.05) and first.loss_end == pytest.approx(5.0)
    assert first.hours == pytest.approx(1.0) and first.cost == pytest.approx(2.0)
    assert first.cost_per_loss_point == pytest.approx(2.0 / 4.95)
    assert second.loss_drop == pytest.approx(0.5) and second.cost == pytest.approx(4.0)
    assert second.cost_per_loss_point == pytest.approx(8.0)
    assert second.cost_per_loss_point / first.cost_per_loss_point == pytest.approx(19.8)
    table = write_phase_table(tmp_path, records, phases, 2.0)
    assert "| grind | 100-300 | 5.000 | 4.500 | 0.500 | 2.000 | 4.00 | 8.00 |" in table
    assert (tmp_path / "phases.md").read_text() == table


def test_dollars_per_billion_tokens():
    # 10,000 tokens/s at $2/h: 1e9 tokens take 27.78 h -> $55.56
    assert dollars_per_billion_tokens(10_000, 2.0) == pytest.approx(1e9 / 10_000 / 3600 * 2.0)
    assert math.isinf(dollars_per_billion_tokens(0, 2.0))


def test_window_cost_per_loss_point_and_plateau():
    falling = synthetic_records([10 - 0.01 * i for i in range(200)])
    cost = window_cost_per_loss_point(falling, 100, price_per_hour=1.0)
    assert cost == pytest.approx(1.0 / 1.0)  # 100 steps = 1 h = $1 for 1.0 loss point
    flat = synthetic_records([5.0] * 200)
    assert math.isinf(window_cost_per_loss_point(flat, 100, 1.0))
    assert window_cost_per_loss_point(falling[:50], 100, 1.0) is None  # not enough history yet


def test_early_stop_on_cost_fires_on_a_plateau_only():
    recipe = build_recipe(
        {}, {"max_steps": 400, "price_per_hour": 1.0, "early_stop_cost_per_loss_point": 5.0, "early_stop_window": 100}
    )
    stop = EarlyStop(recipe.stopping, recipe.reporting)
    losses = [10 - 0.01 * i for i in range(200)] + [8.0 - 0.0001 * i for i in range(200)]
    records = synthetic_records(losses)
    stop.observe_cost(records[:200])
    assert stop.reason is None  # $1 per loss point: well worth it
    stop.observe_cost(records)
    assert stop.reason is not None and "above early_stop_cost_per_loss_point=$5.00" in stop.reason


def test_early_stop_on_validation_patience():
    recipe = build_recipe({}, {"early_stop_patience": 2, "early_stop_min_delta": 0.05})
    stop = EarlyStop(recipe.stopping, recipe.reporting)
    for val in (5.0, 4.5, 4.48, 4.47):  # the last two improve by less than the minimum delta
        stop.observe_val_loss(val)
    assert stop.reason is not None and "for 2 evaluations" in stop.reason
    default = build_recipe({}, {})
    off = EarlyStop(default.stopping, default.reporting)
    for val in (5.0, 5.0, 5.0, 5.0):
        off.observe_val_loss(val)
    assert off.reason is None


def test_cost_stopping_needs_a_price():
    from hf_pretrain.config import RecipeError

    with pytest.raises(RecipeError, match="early_stop_cost_per_loss_point needs price_per_hour"):
        build_recipe({}, {"early_stop_cost_per_loss_point": 3.0})


def test_markdown_table_marks_phases_without_a_drop():
    rows = [phase_row(synthetic_records([5.0, 5.0, 5.1]), Phase("flat", 0, 3), 1.0)]
    assert "n/a (no drop)" in markdown_table(rows)
