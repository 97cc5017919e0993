"""The project's own GPU measurements ship with the package (economics/measured.jsonl: the `1b` on an H100
SXM, ../shared/gpu/README.md, docs/gpu.md) and are read after the user's own records:

- `plan` and the doctor use them for the `1b` on an H100 SXM, labelled measured with their source;
- a user's record of the same configuration wins over them;
- another configuration (`--micro_batch_size 16`) or another GPU is not matched: modelled.
"""

from __future__ import annotations

import json

import pytest

from hf_pretrain.config import load_recipe
from hf_pretrain.economics import measurements
from hf_pretrain.economics.measurements import record_measurement, recorded_measurement
from hf_pretrain.economics.planning import gpu_ranking, plan_command
from hf_pretrain.machine.gpus import gpu_named
from hf_pretrain.machine.run_profile import Machine, run_profile
from hf_pretrain.preflight.budget import check_cost
from tests.helpers import card_sections, h100_configuration, memory_row

H100 = "NVIDIA H100 80GB HBM3"
SOURCE = "project's H100 run, 2026-11-25, docs/gpu.md"
SHIPPED = [  # ../shared/gpu/README.md: flags on the 1b recipe, tokens/s, peak GiB
    ({}, 77_935.0, 37.24),
    ({"compile": False}, 51_150.0, 53.13),
    ({"compile": False, "liger": True}, 72_900.0, 36.63),
]


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An empty user store of this test's own; the shipped measurements as the package has them."""
    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(measurements.RECORD_ENV, raising=False)
    return tmp_path / "home" / "measurements.jsonl"


def test_the_package_ships_the_h100_runs_keyed_as_the_1b_recipe_is_today():
    lines = [json.loads(line) for line in measurements.SHIPPED_STORE.read_text().splitlines()]
    for line, (flags, rate, peak) in zip(lines, SHIPPED, strict=True):
        # the recipe's configuration must still be the one measured, or the record would silently stop matching
        assert line["configuration"] == h100_configuration(load_recipe("1b", flags)).key, flags
        assert (line["gpu"], line["tokens_per_s"], line["peak_memory_gib"]) == ("H100 SXM", rate, peak)
        assert line["source"] == SOURCE and line["date"] == "2026-11-25"


@pytest.mark.parametrize(("flags", "rate", "peak"), SHIPPED, ids=["compiled", "eager", "eager+liger"])
def test_the_shipped_record_is_used_for_the_1b_on_an_h100_sxm_labelled_with_its_source(store, flags, rate, peak):
    recipe = load_recipe("1b", flags)
    found = recorded_measurement(h100_configuration(recipe), "H100")
    assert found.shipped and (found.tokens_per_s, found.peak_memory_gib) == (rate, peak)
    assert found.label().startswith(f"measured: {SOURCE} ({H100}, torch 2.11.0")
    row = gpu_ranking.gpu_row(gpu_named("H100 SXM"), 1e9, 2.99, **card_sections(recipe))
    assert row.tokens_per_s == rate and row.measured == found.label()
    assert (
        gpu_ranking.gpu_row(gpu_named("H100 PCIe"), 1e9, 2.0, **card_sections(recipe)).measured is None
    )  # another card: modelled


def test_a_users_record_of_the_same_configuration_wins(store):
    recipe = load_recipe("1b")
    mine = record_measurement(h100_configuration(recipe), H100, 80_000.0, 37.0, "train")
    assert recorded_measurement(h100_configuration(recipe), "H100 SXM") == mine and not mine.shipped
    assert gpu_ranking.gpu_row(gpu_named("H100 SXM"), 1e9, 2.99, **card_sections(recipe)).tokens_per_s == 80_000.0


def test_another_micro_batch_is_not_matched_and_stays_modelled(store, capsys):
    assert recorded_measurement(h100_configuration(load_recipe("1b", {"micro_batch_size": 16})), "H100 SXM") is None
    assert plan_command.main(["--recipe", "1b", "--gpu", "H100", "--micro_batch_size", "16", "--max_gpus", "1"]) == 0
    out = capsys.readouterr().out
    assert "| H100 SXM | 16, 0 | ~" in out and "an estimate of the performance model" in out and SOURCE not in out


def test_plan_gpu_all_marks_the_h100_sxm_row_measured_and_the_others_modelled(store, capsys):
    assert plan_command.main(["--recipe", "1b", "--gpu", "all"]) == 0
    out = capsys.readouterr().out
    table = {line.split(" | ")[0]: line for line in out.splitlines() if line.startswith("| ")}
    assert "| 77,935 measured |" in table["| H100 SXM"] and f"- H100 SXM: measured: {SOURCE}" in out
    assert "| ~" in table["| H100 PCIe"] and "| ~" in table["| H200"]
    assert plan_command.main(["--recipe", "1b", "--gpu", "all", "--compile", "false"]) == 0
    assert "| 51,150 measured |" in capsys.readouterr().out


def test_the_doctor_on_an_h100_uses_the_shipped_record_for_time_cost_and_memory(store, monkeypatch):
    here = Machine("cuda", H100, gpu_named("H100 SXM"), bf16=True, capability=9.0, memory_bytes=int(79.2 * 2**30))
    recipe, unmeasured = load_recipe("1b"), load_recipe("1b", {"micro_batch_size": 16})
    cost = check_cost(recipe, here.gpu_name)
    assert cost.status == "pass" and f"77,935 tokens/s (measured: {SOURCE}" in cost.reason
    memory = memory_row(recipe, run_profile(recipe.step_as_written, here))
    assert memory.status == "pass" and "this configuration ran on an H100 SXM: peak 37.24 GiB" in memory.reason
    assert SOURCE in memory.reason
    other = memory_row(unmeasured, run_profile(unmeasured.step_as_written, here))  # not measured: the estimate speaks
    assert "ran on" not in other.reason and SOURCE not in other.reason
