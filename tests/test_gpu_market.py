"""The cheapest GPU per token (issue 27): the GPU table, the performance model against published
runs, the memory fit per GPU, `plan --gpu all` ranked by the run's dollars, and the slow-node check."""

from __future__ import annotations

import json

import pytest

from hf_pretrain.config import load_recipe
from hf_pretrain.economics import performance, published
from hf_pretrain.economics.memory import Fit, fit_in_memory
from hf_pretrain.economics.planning import gpu_ranking, plan_command
from hf_pretrain.exit_codes import EXIT_CONFIG
from hf_pretrain.machine.gpus import gpu_named, gpu_table
from hf_pretrain.machine.precisions import precision_named
from hf_pretrain.machine.run_profile import machine_with, run_profile
from hf_pretrain.model.llama import tokenizer_size_of
from tests.helpers import CARD, card_sections, estimate_memory, h100_workload

ONE_B = load_recipe("1b")
TOKENS = ONE_B.train.max_steps * ONE_B.train.global_batch_tokens


def rows(recipe=ONE_B, prices=None, pinned=()):
    return gpu_ranking.ranked_rows(TOKENS, prices or gpu_ranking.gpu_prices(None), pinned, **card_sections(recipe))


# ---------------------------------------------------------------------- the table
def test_the_table_holds_the_gpus_people_rent_with_sources():
    wanted = {"H200", "H100 SXM", "H100 PCIe", "A100 80GB SXM", "A100 40GB", "L40S", "A40", "RTX A6000"}
    wanted |= {"RTX 6000 Ada", "L4", "A10G", "RTX 5090", "RTX 4090", "RTX 3090"}
    table = gpu_table()
    assert wanted <= set(table)
    for gpu in table.values():
        assert gpu.bf16_flops > 0 and gpu.memory_bytes > 0 and gpu.bandwidth_bytes_per_s > 0 and gpu.usd_per_hour > 0
        assert gpu.source
    # GeForce cards: bf16 with fp32 accumulate, half the fp16-accumulate figure their spec pages quote
    assert gpu_named("RTX 4090").bf16_flops == 165.2e12 and gpu_named("RTX 3090").bf16_flops == 71e12


def test_fp8_peaks_are_listed_for_ada_hopper_and_blackwell_only():
    for gpu in gpu_table().values():
        has_fp8 = gpu.architecture in ("ada", "hopper", "blackwell")
        needs = precision_named("fp8").compute_capability
        assert (gpu.fp8_flops is not None) == has_fp8 == (gpu.compute_capability >= needs), gpu.name
        if has_fp8:  # dense, fp32 accumulate: twice the bf16 rate, never more
            assert gpu.fp8_flops == pytest.approx(2 * gpu.bf16_flops, rel=0.02), gpu.name
    assert gpu_named("H100 SXM").fp8_flops == 1979e12 and gpu_named("RTX 4090").fp8_flops == 330.3e12


# ---------------------------------------------------------------------- the performance model
@pytest.mark.parametrize("run", published.published_runs(), ids=lambda r: f"{r.name} on {r.gpu}")
def test_the_model_reproduces_each_measured_and_published_run(run):
    # the H100 rows of the shared GPU table within 10%, the published runs within 15%
    assert published.modelled(run) == pytest.approx(run.tokens_per_s, rel=run.tolerance)


H100_ROWS = [({}, 77_935), ({"compile": False}, 51_150), ({"compile": False, "liger": True}, 72_900)]


@pytest.mark.parametrize(("flags", "measured"), H100_ROWS, ids=["compiled", "eager", "eager+liger"])
def test_plan_prices_each_measured_h100_configuration_by_its_flags_within_10_percent(flags, measured):
    recipe = load_recipe("1b", flags)
    assert performance.modelled_tokens_per_s(h100_workload(recipe), gpu_named("H100 SXM")) == pytest.approx(
        measured, rel=0.10
    )


def test_the_configuration_changes_the_price_the_way_the_gpu_does(capsys):
    h100 = gpu_named("H100 SXM")
    rate = {
        name: performance.modelled_tokens_per_s(h100_workload(load_recipe("1b", flags)), h100)
        for name, flags in [
            ("shipped", {}),
            ("eager", {"compile": False}),
            ("eager+liger", {"compile": False, "liger": True}),
            ("liger", {"liger": True}),
            ("muon", {"optimizer": "muon"}),
            ("fp8", {"mixed_precision": "fp8"}),
        ]
    }
    assert rate["eager"] < rate["eager+liger"] < rate["shipped"] < rate["fp8"]
    # Muon: 5 Newton-Schulz iterations over every decoder matrix per 131K-token step, ~5% of its FLOPs
    assert 0.93 < rate["muon"] / rate["shipped"] < 0.98
    # compiled + Liger is not measured yet: modelled as the compiled step with Liger's fused loss
    assert rate["liger"] == pytest.approx(rate["shipped"], rel=0.03)
    # more checkpointed layers, a smaller micro-batch: slower
    assert performance.modelled_tokens_per_s(h100_workload(ONE_B, micro_batch_size=4), h100) < rate["shipped"]
    # and `plan` says so
    shipped = _json(capsys, ["--recipe", "1b", "--gpu", "H100"])
    eager = _json(capsys, ["--recipe", "1b", "--gpu", "H100", "--compile", "false"])
    assert eager["tokens_per_s_per_gpu"] < 0.8 * shipped["tokens_per_s_per_gpu"]
    assert "eager" in eager["throughput_source"] and "compiled" in shipped["throughput_source"]
    assert plan_command.main(["--recipe", "1b", "--gpu", "H100", "--liger", "true"]) == 0
    assert "compiled + Liger: not measured on a GPU yet" in capsys.readouterr().out


def test_a_measurement_on_one_card_scales_the_model_for_the_others():
    h100, a100 = gpu_named("H100 SXM"), gpu_named("A100 80GB SXM")
    measured = 0.9 * performance.modelled_tokens_per_s(h100_workload(ONE_B), h100)  # this card ran 10% under its model
    scaled = performance.scaled_to_measurement(h100_workload(ONE_B), measured, h100, a100)
    assert scaled == pytest.approx(0.9 * performance.modelled_tokens_per_s(h100_workload(ONE_B), a100))


@pytest.mark.parametrize("recipe_name", ["smoke", "134m", "1b"])
def test_no_modelled_rate_exceeds_the_physical_limit(recipe_name):
    recipe = load_recipe(recipe_name)
    workloads = [h100_workload(recipe, checkpointed_layers=k) for k in (0, recipe.model.num_hidden_layers)]
    workloads += [h100_workload(load_recipe(recipe_name, {"mixed_precision": "fp8"}))]
    workloads += [r.workload for r in published.published_runs()]
    workloads += [w for speedup in published.fp8_speedups() for w in (speedup.bf16, speedup.fp8)]
    for gpu in gpu_table().values():
        for workload in workloads:
            if workload.config.precision == "fp8" and gpu.fp8_flops is None:
                continue
            rate = performance.step_time(workload, gpu).tokens_per_s
            assert 0 < rate < performance.physical_limit(workload, gpu), gpu.name
    h100 = gpu_named("H100 SXM")  # FP8's limit counts the decoder linears at the FP8 peak, the rest at bf16's
    fp8 = h100_workload(load_recipe(recipe_name, {"mixed_precision": "fp8"}))
    assert performance.physical_limit(fp8, h100) < 2 * h100.bf16_flops / fp8.flops_per_token


# ---------------------------------------------------------------------- FP8 (issue 34)
@pytest.mark.parametrize("speedup", published.fp8_speedups(), ids=lambda s: s.name)
def test_the_fp8_term_reproduces_the_published_fp8_speedups_within_10_percent(speedup):
    assert speedup.modelled() == pytest.approx(speedup.published, rel=0.10)


def test_plan_ranks_fp8_where_cards_have_it_and_charges_the_measured_quality_factor(capsys):
    result = _json(capsys, ["--recipe", "1b", "--gpu", "all", "--mixed_precision", "fp8"])
    # the proxy's measurement (docs/benchmarks.md): FP8 needs 1.007x bf16's tokens for its loss
    assert result["quality_per_token"] == precision_named("fp8").quality_per_token == pytest.approx(1 / 1.007)
    by_gpu = {row["gpu"]: row for row in result["gpus"]}
    assert not by_gpu["A100 80GB SXM"]["fits"] and "no FP8: compute capability 8.0" in by_gpu["A100 80GB SXM"]["reason"]
    bf16 = {row["gpu"]: row for row in _json(capsys, ["--recipe", "1b", "--gpu", "all"])["gpus"]}
    assert by_gpu["H100 SXM"]["tokens_per_s"] > 1.15 * bf16["H100 SXM"]["tokens_per_s"]
    assert plan_command.main(["--recipe", "1b", "--gpu", "all", "--mixed-precision", "fp8"]) == 0
    out = capsys.readouterr().out
    note = next(line for line in out.splitlines() if line.startswith("fp8:"))
    assert (
        "FP8 needs 1.007x bf16's tokens for its loss, measured on a 1.48M proxy (3 seeds, docs/benchmarks.md)" in note
    )
    assert "hours and dollars cover 1.007x the tokens; 1B estimate 1.01-1.11x tokens ($" in note
    # the rows are charged for 1.007x the tokens: the H100's run dollars are the 1B-estimate ends' at 1.007x
    h100 = by_gpu["H100 SXM"]
    assert h100["hours"] == pytest.approx(result["tokens"] * 1.007 / h100["tokens_per_s"] / 3600, rel=0.01)
    # one named card without FP8: one line naming its capability and the fix
    assert plan_command.main(["--recipe", "1b", "--gpu", "A100", "--mixed_precision", "fp8"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "8.0" in err and "--mixed_precision bf16" in err


def test_a_card_that_needs_checkpointing_pays_for_it_in_tokens_per_s():
    # 40 GB: the 1b at micro-batch 8 needs a few layers recomputed (48 GB, an L40S, needs none: the H100
    # measured 37.24 GiB for the recipe as shipped)
    a100 = next(row for row in rows() if row.gpu == "A100 40GB")
    assert a100.fits and a100.micro_batch_size == 8 and 0 < a100.checkpointed_layers < 8
    assert next(row for row in rows() if row.gpu == "L40S").checkpointed_layers == 0
    without = performance.modelled_tokens_per_s(
        h100_workload(ONE_B, micro_batch_size=a100.micro_batch_size, checkpointed_layers=0), gpu_named("A100 40GB")
    )
    assert a100.tokens_per_s < 0.97 * without
    # and the more layers recompute, the slower
    rates = [
        performance.modelled_tokens_per_s(
            h100_workload(ONE_B, micro_batch_size=8, checkpointed_layers=k), gpu_named("L40S")
        )
        for k in (0, 4, 8, 16)
    ]
    assert rates == sorted(rates, reverse=True)


# ---------------------------------------------------------------------- memory fit
def test_selective_checkpointing_lowers_the_peak_layer_by_layer():
    estimate = estimate_memory(ONE_B, tokenizer_size_of(ONE_B.data), CARD)
    peaks = [estimate.peak(k) for k in range(17)]
    assert peaks[:16] == sorted(peaks[:16], reverse=True) and len(set(peaks[:16])) == 16
    # all 16: the last layer is recomputed while every layer input is alive, one input more than with 15
    assert peaks[16] - peaks[15] == estimate.layer_input
    assert peaks[0] == estimate.total(False) and peaks[16] == estimate.total(True)
    # the recipe key gives the same estimate through Recipe.checkpointed_layer_count
    assert estimate_memory(ONE_B.replace(checkpointed_layers=5), 32_005, CARD).peak(5) == peaks[5]


def fit_one_b(size: int, memory: int) -> Fit:
    """The memory estimate's search for the 1b on a card of `memory` bytes, as a GPU with bf16 runs it."""
    step = run_profile(ONE_B.step_as_written, machine_with(CARD)).step
    return fit_in_memory(
        ONE_B.model, ONE_B.train, step, seq_len=ONE_B.data.seq_len, tokenizer_size=size, memory_bytes=memory
    )


def test_the_fit_takes_the_fewest_checkpointed_layers_before_a_smaller_micro_batch():
    size = tokenizer_size_of(ONE_B.data)
    estimate = estimate_memory(ONE_B, size, CARD)
    memory = int(estimate.peak(6) / 0.9) + 1  # a card where 6 layers checkpointed just fit at micro-batch 8
    fit = fit_one_b(size, memory)
    assert (fit.fits, fit.micro_batch_size, fit.checkpointed_layers) == (True, 8, 6)
    # too small for micro-batch 8 even with every layer checkpointed: a smaller micro-batch, fewest layers again
    memory = int(min(estimate.peak(15), estimate.peak(16)) / 0.9) - 2**20
    fit = fit_one_b(size, memory)
    four = estimate_memory(ONE_B.replace(micro_batch_size=4), size, CARD)
    assert fit.fits and fit.micro_batch_size == 4
    k = fit.checkpointed_layers
    assert four.peak(k) <= fit.usable_bytes and (k == 0 or four.peak(k - 1) > fit.usable_bytes)
    # nothing fits: said with the reason
    tiny = fit_one_b(size, 4 * 2**30)
    assert not tiny.fits and "does not fit" in tiny.reason and "GiB usable" in tiny.reason


def test_a_gpu_too_small_even_with_every_layer_checkpointed_is_listed_as_not_fitting():
    three_b = load_recipe("1b", {"num_hidden_layers": 48, "expected_params": 0})  # ~3B: 48 GB of weights and AdamW
    by_gpu = {row.gpu: row for row in rows(three_b)}
    for name in ("RTX 4090", "L4", "RTX 5090", "A100 40GB", "L40S"):
        assert not by_gpu[name].fits and by_gpu[name].tokens_per_s is None
        assert "does not fit" in by_gpu[name].reason and "all 48 layers checkpointed" in by_gpu[name].reason
    assert by_gpu["H100 SXM"].fits and by_gpu["A100 80GB SXM"].fits
    ranked = list(by_gpu.values())
    assert [row.fits for row in ranked] == sorted((row.fits for row in ranked), reverse=True)  # not fitting: last


# ---------------------------------------------------------------------- the ranking
def test_the_ranking_orders_by_the_runs_dollars_not_the_hourly_price():
    ranked = [row for row in rows() if row.fits]
    assert [row.usd for row in ranked] == sorted(row.usd for row in ranked)
    hourly = [row.price_per_gpu_hour for row in ranked]
    assert hourly != sorted(hourly)  # a dearer GPU that is faster per dollar ranks first somewhere
    place = {row.gpu: i for i, row in enumerate(ranked)}
    assert place["H100 SXM"] < place["A100 80GB SXM"]  # $2.99/h beats $1.79/h on the run's dollars
    for row in ranked:
        assert row.usd == pytest.approx(TOKENS / row.tokens_per_s / 3600 * row.price_per_gpu_hour)
        assert row.usd_per_billion_tokens == pytest.approx(1e9 / row.tokens_per_s / 3600 * row.price_per_gpu_hour)


def test_a_price_table_reprices_the_gpus_it_names(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("H100: 0.50\n")
    table = gpu_ranking.gpu_prices(str(prices))
    assert table["H100 SXM"] == 0.50 and table["A100 80GB SXM"] == gpu_named("A100 80GB").usd_per_hour
    assert rows(prices=table)[0].gpu == "H100 SXM"


# ---------------------------------------------------------------------- the command
def _json(capsys, argv):
    assert plan_command.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_gpu_all_json_has_a_row_per_gpu_with_its_keys(capsys):
    result = _json(capsys, ["--recipe", "1b", "--gpu", "all"])
    keys = {"gpu", "fits", "micro_batch_size", "checkpointed_layers", "tokens_per_s", "usd_per_billion_tokens"}
    assert {row["gpu"] for row in result["gpus"]} == set(gpu_table()) and result["scaling"] == []
    for row in result["gpus"]:
        assert keys | {"hours", "usd"} <= set(row)
    assert plan_command.main(["--recipe", "1b", "--gpu", "all"]) == 0
    out = capsys.readouterr().out
    assert "| GPU | fit: micro-batch, checkpointed layers | tokens/s |" in out and "| H200 | 8, 0 | ~" in out


def test_recipe_overrides_win_over_the_fit_search(capsys):
    pinned = _json(capsys, ["--recipe", "1b", "--gpu", "all", "--micro_batch_size", "8"])["gpus"]
    assert all(row["micro_batch_size"] == 8 for row in pinned if row["fits"])
    small = next(row for row in pinned if row["gpu"] == "L4")
    assert not small["fits"] and "micro_batch_size 8" in small["reason"]  # it would need micro-batch 4
    checkpointed = _json(capsys, ["--recipe", "1b", "--gpu", "all", "--gradient_checkpointing", "true"])["gpus"]
    assert all(row["checkpointed_layers"] == 16 for row in checkpointed if row["fits"])
    some = _json(capsys, ["--recipe", "1b", "--gpu", "all", "--checkpointed_layers", "4"])["gpus"]
    assert {row["checkpointed_layers"] for row in some if row["fits"]} == {4}


def test_one_named_gpu_gives_its_row_and_the_several_gpu_table(capsys):
    result = _json(capsys, ["--recipe", "1b", "--gpu", "L40S", "--max_gpus", "2"])
    (row,) = result["gpus"]
    assert row["gpu"] == "L40S" and result["tokens_per_s_per_gpu"] == row["tokens_per_s"]
    assert len(result["scaling"]) == 2 and "estimate" in result["throughput_source"]
    cheap = _json(capsys, ["--recipe", "1b", "--gpu", "L40S", "--price_per_gpu_hour", "0.5"])
    assert cheap["gpus"][0]["usd"] == pytest.approx(row["usd"] * 0.5 / row["price_per_gpu_hour"])


def test_an_unknown_gpu_is_refused_naming_the_known_ones(capsys):
    assert plan_command.main(["--recipe", "smoke", "--gpu", "V100"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "unknown GPU 'V100'" in err and "H100 SXM" in err and "RTX 3090" in err and len(err.splitlines()) == 1
    assert plan_command.main(["--params", "1e9", "--gpu", "all"]) == EXIT_CONFIG
    assert "--recipe" in capsys.readouterr().err


# ---------------------------------------------------------------------- the slow-node check
def test_a_gpu_well_below_its_model_is_named_a_likely_slow_node():
    expected = performance.modelled_tokens_per_s(h100_workload(ONE_B), gpu_named("H100 SXM"))
    warning = performance.slow_node_warning(0.6 * expected, "NVIDIA H100 80GB HBM3 (79 GiB)", h100_workload(ONE_B))
    assert warning and "H100 SXM" in warning and "40% below" in warning and "slow or faulty" in warning
    assert (
        performance.slow_node_warning(0.8 * expected, "NVIDIA H100 80GB HBM3", h100_workload(ONE_B)) is None
    )  # within 25%
    assert (
        performance.slow_node_warning(100.0, "CPU (x86_64, 16 cores)", h100_workload(ONE_B)) is None
    )  # not in the table
    # an eager run is judged against the eager step's model, not the compiled one's
    eager = load_recipe("1b", {"compile": False})
    eager_expected = performance.modelled_tokens_per_s(h100_workload(eager), gpu_named("H100 SXM"))
    assert eager_expected < 0.75 * expected
    assert performance.slow_node_warning(0.9 * eager_expected, "NVIDIA H100 80GB HBM3", h100_workload(eager)) is None
    assert "below" in performance.slow_node_warning(0.6 * eager_expected, "NVIDIA H100 80GB HBM3", h100_workload(eager))
