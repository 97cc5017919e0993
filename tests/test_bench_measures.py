"""A bench that measures, and a product that learns from its measurements (issue 32), on the CPU:

- the micro-batch search tries every candidate on the device: an out-of-memory error (from a stand-in
  for the device's allocator) is the answer, the memory estimate decides nothing, and the memory is
  handed back after the error;
- the matmul peak is the largest rate of several sizes, and a CPU's is labelled a CPU figure;
- dollars: measured for the measured GPU only, the others estimates scaled by its measured/modelled;
  a CPU prices no GPU;
- measurements recorded on a GPU win over the model in `plan` and the doctor, labelled measured; another
  configuration does not match; a CPU records nothing.
"""

from __future__ import annotations

import json
import threading

import pytest
import torch

from hf_pretrain.bench import search as search_module
from hf_pretrain.bench.measure import add_money, estimated_rates, measured_matmul_peak
from hf_pretrain.bench.results import dollar_table
from hf_pretrain.bench.variants import DeviceMemory, RunResult, VariantResult, try_on_device
from hf_pretrain.config import load_recipe
from hf_pretrain.economics import measurements
from hf_pretrain.economics.measurements import (
    record_measurement,
    record_training_run,
    recorded_measurement,
)
from hf_pretrain.economics.performance import modelled_tokens_per_s
from hf_pretrain.economics.planning import gpu_ranking, plan_command
from hf_pretrain.economics.resolved_run import ResolvedRun
from hf_pretrain.machine.gpus import gpu_named
from hf_pretrain.machine.run_profile import THE_CPU, Machine, run_profile
from hf_pretrain.preflight.budget import check_cost
from hf_pretrain.preflight.checks import MEMORY_PROBE_ENV, preflight
from hf_pretrain.preflight.result import CheckResult, PreflightError
from hf_pretrain.store.location import Where
from tests.helpers import card_sections, h100_configuration, h100_workload, memory_row, on_cpu

H100 = "NVIDIA H100 80GB HBM3"  # what CUDA calls the card of the shared README's table
GIB = 2**30


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An empty measurement store of this test's own, without the project's shipped measurements
    (tests/test_shipped_measurements.py reads those)."""
    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(measurements, "SHIPPED_STORE", tmp_path / "no-shipped.jsonl")
    monkeypatch.delenv(measurements.RECORD_ENV, raising=False)
    return tmp_path / "home" / "measurements.jsonl"


def one_b(**overrides):
    return load_recipe("1b", overrides)


# ---------------------------------------------------------------------- the search: the device answers
class FakeAllocator:
    """A stand-in for a GPU's caching allocator: `allocate` raises torch's OutOfMemoryError past the
    capacity; the peak is what was held when it did; `release` hands everything back (as the probe's
    cleanup must, for the next probe to be measured on an empty device)."""

    def __init__(self, capacity_gib: float, gib_per_sequence: float):
        self.capacity, self.per_sequence = capacity_gib, gib_per_sequence
        self.held = self.peak = 0.0
        self.releases = 0

    def allocate(self, gib: float) -> None:
        if self.held + gib > self.capacity:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {gib:.2f} GiB. GPU 0 has a total capacity of "
                f"{self.capacity:.2f} GiB"
            )
        self.held += gib
        self.peak = max(self.peak, self.held)

    def train(self, recipe):
        """A short run: weights and optimizer, then each sequence's activations."""
        self.allocate(12.0)
        for _ in range(recipe.train.micro_batch_size):
            self.allocate(self.per_sequence)
        self.held = 0.0  # a run that ends frees what it held

        class Outcome:
            exit_code, message = 0, "done"

        return Outcome()


class FakeMemory(DeviceMemory):
    def __init__(self, allocator: FakeAllocator):
        self.allocator = allocator

    def peak_gib(self):
        return self.allocator.peak

    def release(self):
        self.allocator.held = self.allocator.peak = 0.0
        self.allocator.releases += 1


def test_a_probe_that_runs_out_of_memory_does_not_fit_by_the_error_and_hands_the_memory_back(tmp_path):
    allocator = FakeAllocator(capacity_gib=79.0, gib_per_sequence=3.0)  # 12 + 3n: 16 fits (60), 32 does not
    memory = FakeMemory(allocator)
    peaks_at_start = []

    def probe(recipe, folder):
        peaks_at_start.append(allocator.peak)  # each probe starts on an emptied device
        result = try_on_device(lambda: allocator.train(recipe), memory)
        if result.status == "ok":
            allocator.peak = 0.0  # a probe that ends is a process that exits
        return result

    said = []
    result = search_module.search_micro_batch(one_b(), {}, tmp_path, None, said.append, probe=probe)
    probes = {p.micro_batch_size: p for p in result.probes}
    # 1b: 64 sequences a step, candidates 1, 2, 4, ... 64; doubling from the recipe's 8: 8, 16 fit, 32 runs out
    assert result.largest_fitting == 16
    assert probes[16].fits and probes[16].verdict == "fits (peak 60.00 GiB)"
    assert not probes[32].fits and probes[32].status == "oom"
    assert probes[32].verdict == "does not fit (out of memory at 78.00 GiB)"  # 12 + 22 x 3 held when it failed
    assert allocator.releases == 1 and set(peaks_at_start) == {0.0}
    assert any("does not fit (out of memory at 78.00 GiB)" in line for line in said)


def test_a_micro_batch_the_estimate_calls_too_big_is_still_tried(tmp_path):
    """The shared README's case: the estimate refused micro-batch 16 of the 1b on an 80 GB card, the
    card ran it. The search probes it, and a probe's preflight only warns about memory."""
    estimate = memory_row(*on_cpu(one_b(micro_batch_size=16)), device_memory_bytes=int(79.6 * GIB))
    tried = []

    def probe(recipe, folder):
        tried.append(recipe.train.micro_batch_size)
        return RunResult("ok", peak_memory_gib=40.0)

    result = search_module.search_micro_batch(one_b(), {}, tmp_path, None, lambda _: None, probe=probe)
    assert 16 in tried and result.largest_fitting == 64  # every candidate fitted on the "device"
    if estimate.status == "fail":  # the estimate said no; the device was asked anyway
        assert next(p for p in result.probes if p.micro_batch_size == 16).fits


def test_a_probes_preflight_warns_about_memory_instead_of_refusing(monkeypatch):
    refusal = CheckResult("gpu memory", "fail", "does not fit without gradient checkpointing: 99.7 GB", "--x")
    monkeypatch.setattr("hf_pretrain.preflight.checks.run_checks", lambda *a, **k: [refusal])
    monkeypatch.delenv(MEMORY_PROBE_ENV, raising=False)
    resolved = ResolvedRun.at_door(one_b(), THE_CPU, Where.of(one_b()))
    with pytest.raises(PreflightError):
        preflight(one_b(), resolved, log=lambda _: None)
    monkeypatch.setenv(MEMORY_PROBE_ENV, "1")
    (warned,) = preflight(one_b(), resolved, log=lambda _: None)
    assert warned.status == "warn" and "the bench tries it on the device" in warned.reason


def test_an_error_that_is_not_out_of_memory_is_raised(tmp_path):
    def broken():
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        try_on_device(broken, FakeMemory(FakeAllocator(1, 1)))

    def wrapped():  # compiled graphs wrap the allocator's error
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except torch.OutOfMemoryError as exc:
            raise RuntimeError("backend compiler failed") from exc

    assert try_on_device(wrapped, FakeMemory(FakeAllocator(1, 1))).status == "oom"


# ---------------------------------------------------------------------- the matmul peak
def test_the_matmul_peak_is_the_largest_rate_of_several_sizes():
    rates = {256: 1e9, 512: 3e9, 1024: 2e9}
    peak = measured_matmul_peak(torch.device("cpu"), rate_of=lambda n, dtype, device, seconds: rates[n])
    assert peak.flops == 3e9 and peak.rates == rates
    assert peak.describe().startswith("a CPU figure") and "(512^3)" in peak.describe()


def test_the_cpu_matmul_peak_runs_small_and_says_so():
    peak = measured_matmul_peak(torch.device("cpu"), sizes=(64, 128), min_seconds=0.01)
    assert peak.on_cpu and peak.flops > 0 and set(peak.rates) == {64, 128} and peak.dtype == "float32"


# ---------------------------------------------------------------------- dollars
def test_dollars_are_measured_for_the_measured_gpu_only_and_estimated_for_the_others():
    recipe = one_b()
    prices = {"H100 SXM": 2.99, "A40": 0.44, "my-cluster": 1.0}
    variant = VariantResult("recipe as written", {}, "ok", tokens_per_s=77_900.0)
    add_money(variant, h100_workload(recipe), gpu_named("H100 SXM"), "H100 SXM", prices)
    assert variant.usd_per_billion_tokens == {"H100 SXM": pytest.approx(2.99 * 1e9 / 77_900 / 3600)}
    ratio = 77_900 / modelled_tokens_per_s(h100_workload(recipe), gpu_named("H100 SXM"))
    assert variant.measured_to_modelled == pytest.approx(ratio)
    a40 = modelled_tokens_per_s(h100_workload(recipe), gpu_named("A40")) * ratio
    # the A40 at the A40's modelled speed (scaled), not the H100's: the old bench said "$1.61/B"
    assert variant.usd_per_billion_tokens_estimated == {"A40": pytest.approx(0.44 * 1e9 / a40 / 3600)}
    assert variant.usd_per_billion_tokens_estimated["A40"] > 0.44 * 1e9 / 77_900 / 3600 * 2
    assert estimated_rates(h100_workload(recipe), 77_900, gpu_named("H100 SXM"), ["H100 SXM"])[1] == {}  # never itself


def test_the_cpu_prices_no_gpu():
    variant = VariantResult("recipe as written", {}, "ok", tokens_per_s=5_000.0)
    add_money(variant, h100_workload(load_recipe("smoke")), None, None, {"H100 SXM": 2.99, "A40": 0.44})
    assert variant.usd_per_billion_tokens == {} and variant.usd_per_billion_tokens_estimated == {}
    result = {
        "variants": [variant.__dict__],
        "peak_flops": {"on_cpu": True},
        "prices": {},
        "price_entry_of_device": None,
    }
    assert "a CPU, whose speed says nothing of a GPU's" in "\n".join(dollar_table(result))


def test_the_dollar_table_labels_the_measured_row_and_the_estimates():
    recipe = one_b()
    prices = {"H100 SXM": 2.99, "A40": 0.44}
    variant = VariantResult("recipe as written", {}, "ok", tokens_per_s=77_900.0)
    add_money(variant, h100_workload(recipe), gpu_named("H100 SXM"), "H100 SXM", prices)
    result = {
        "variants": [variant.__dict__],
        "peak_flops": {"on_cpu": False},
        "prices": prices,
        "price_entry_of_device": "H100 SXM",
    }
    rows = {line.split(" | ")[0]: line for line in dollar_table(result) if line.startswith("| ")}
    assert "measured (this GPU)" in rows["| H100 SXM"] and "estimate (model x" in rows["| A40"]


# ---------------------------------------------------------------------- measurements: the store
def test_a_recorded_measurement_is_found_for_the_same_gpu_and_configuration_only(store):
    recipe = one_b()
    recorded = record_measurement(h100_configuration(recipe), H100, 77_900.0, 37.24, "bench")
    assert recorded is not None and recorded.gpu == "H100 SXM" and store.exists()
    found = recorded_measurement(
        h100_configuration(recipe), "H100 SXM"
    )  # a --gpu name finds what the CUDA name recorded
    assert found == recorded and found.label().startswith(f"measured by bench on {H100}, ")
    assert recorded_measurement(h100_configuration(recipe), "H100 PCIe") is None  # another GPU
    for other in (
        one_b(micro_batch_size=16),
        one_b(compile=False),
        one_b(optimizer="muon"),
        one_b(checkpointed_layers=4),
    ):
        assert recorded_measurement(h100_configuration(other), "H100 SXM") is None, h100_configuration(other)
    assert recorded_measurement(h100_configuration(recipe, 8), "H100 SXM") is None
    newer = record_measurement(h100_configuration(recipe), H100, 78_100.0, 37.3, "train")
    assert recorded_measurement(h100_configuration(recipe), H100) == newer  # the newest wins


def test_a_cpu_records_nothing(store, monkeypatch):
    assert THE_CPU.gpu_name is None  # what a run on the CPU records under
    assert record_measurement(h100_configuration(one_b()), None, 5_000.0, None, "bench") is None
    records = [{"kind": "train", "step": s, "tokens": 1000 * s, "tokens_per_s": 500.0} for s in (1, 2, 3)]
    assert record_training_run(h100_configuration(one_b()), THE_CPU.gpu_name, records, None) is None
    assert not store.exists()
    monkeypatch.setenv(measurements.RECORD_ENV, "0")  # recording off: a GPU records nothing either
    assert (
        record_measurement(h100_configuration(one_b()), H100, 77_900.0, 37.24, "bench") is None and not store.exists()
    )


def test_a_training_run_records_its_rate_after_the_first_window_per_gpu(store):
    records = [  # the first window holds compilation: left out
        {"kind": "train", "step": 10, "tokens": 10 * 131_072, "tokens_per_s": 20_000.0},
        {"kind": "eval", "step": 10},
        {"kind": "train", "step": 20, "tokens": 20 * 131_072, "tokens_per_s": 160_000.0},
        {"kind": "train", "step": 30, "tokens": 30 * 131_072, "tokens_per_s": 150_000.0},
    ]
    recorded = record_training_run(h100_configuration(one_b(), 2), H100, records, 37.2)
    expected = 2 * 10 * 131_072 / (10 * 131_072 / 160_000 + 10 * 131_072 / 150_000) / 2
    assert recorded.tokens_per_s == pytest.approx(expected) and recorded.source == "train"
    assert recorded.configuration["world_size"] == 2 and recorded.peak_memory_gib == 37.2
    assert (
        record_training_run(h100_configuration(one_b()), H100, records[:1], 37.2) is None
    )  # one window: nothing after the warm-up


def test_the_store_skips_a_torn_line_and_keeps_every_writers_line(store):
    recipe = one_b()
    threads = [
        threading.Thread(
            target=lambda: [
                record_measurement(h100_configuration(recipe), H100, 1.0 + i, None, "bench") for i in range(20)
            ]
        )
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with store.open("a") as file:
        file.write('{"gpu": "H100 SXM", "torn')
    lines = store.read_text().splitlines()
    assert len(lines) == 81 and all(json.loads(line)["gpu"] == "H100 SXM" for line in lines[:80])
    assert recorded_measurement(h100_configuration(recipe), H100) is not None


# ---------------------------------------------------------------------- plan and the doctor read them
def _fitted_on(recipe, gpu_name):
    row = gpu_ranking.gpu_row(gpu_named(gpu_name), 1e9, 2.99, **card_sections(recipe))
    return row, recipe.replace(micro_batch_size=row.micro_batch_size).replace(
        checkpointed_layers=row.checkpointed_layers
    )


def test_plan_uses_a_recorded_measurement_before_the_model_and_says_so(store, capsys):
    modelled_row, fitted = _fitted_on(one_b(), "H100 SXM")
    assert modelled_row.measured is None
    record_measurement(h100_configuration(fitted), H100, 77_900.0, 37.24, "train")
    row, _ = _fitted_on(one_b(), "H100 SXM")
    assert row.tokens_per_s == 77_900.0 and row.measured.startswith("measured by train on NVIDIA H100")
    assert (
        gpu_ranking.gpu_row(gpu_named("H100 PCIe"), 1e9, 2.0, **card_sections(one_b())).measured is None
    )  # the model elsewhere

    assert plan_command.main(["--recipe", "1b", "--gpu", "all"]) == 0
    out = capsys.readouterr().out
    table = {line.split(" | ")[0]: line for line in out.splitlines() if line.startswith("| ")}
    assert "| 77,900 measured |" in table["| H100 SXM"] and "- H100 SXM: measured by train on NVIDIA H100" in out
    assert "| ~" in table["| A100 80GB SXM"]  # modelled, marked as an estimate
    assert plan_command.main(["--recipe", "1b", "--gpu", "H100", "--max_gpus", "1"]) == 0
    assert "77,900 tokens/s each (measured by train on NVIDIA H100" in capsys.readouterr().out


def test_plan_takes_no_impossible_figure_as_measured(store, capsys):
    """Issue 38: records of 1e12 tokens/s, NaN, a negative peak memory were shown as measured ("$0.00 per
    billion tokens"), and a string value crashed `plan`. Each is skipped, said once with its line."""
    _, fitted = _fitted_on(one_b(), "H100 SXM")
    good = record_measurement(h100_configuration(fitted), H100, 77_900.0, 37.24, "train")
    assert good is not None
    line = json.loads(store.read_text())
    bad = [
        {**line, "tokens_per_s": 1e12},  # line 2: MFU in the thousands
        {**line, "tokens_per_s": float("nan")},  # line 3
        {**line, "peak_memory_gib": -5},  # line 4
        {**line, "tokens_per_s": "fast"},  # line 5
        {**line, "peak_memory_gib": 500.0},  # line 6: more than the card holds
        {**line, "tokens_per_s": 1e-300},  # line 7: "0 measured | inf | inf" (issue 45)
    ]
    with store.open("a") as file:
        file.writelines(json.dumps(record) + "\n" for record in bad)
        file.write("not json, edited by hand\n")  # line 8: skipped without the note the docs promise
    capsys.readouterr()
    assert recorded_measurement(h100_configuration(fitted), "H100 SXM") == good  # the good one, beneath them all
    assert plan_command.main(["--recipe", "1b", "--gpu", "all"]) == 0
    assert plan_command.main(["--recipe", "1b", "--gpu", "all"]) == 0
    captured = capsys.readouterr()
    table = {row.split(" | ")[0]: row for row in captured.out.splitlines() if row.startswith("| ")}
    assert "| 77,900 measured |" in table["| H100 SXM"], captured.out
    assert "1,000,000,000,000" not in captured.out and "$0.00" not in captured.out
    notes = [n for n in captured.err.splitlines() if n.startswith("note: ")]
    said = sorted(int(note.split(f"{store} line ")[1].split()[0]) for note in notes)
    assert said == [2, 3, 4, 5, 6, 7, 8], notes  # once each, not per lookup
    assert "| inf |" not in captured.out and "1e-300" in captured.err and "line 8 is not used" in captured.err
    assert "it is not JSON" in captured.err
    assert "MFU above 1" in captured.err and "'fast'" in captured.err and "nan" in captured.err
    assert "-5" in captured.err and "500.0 GiB is more than the H100 SXM" in captured.err

    store.write_text("".join(json.dumps(record) + "\n" for record in bad))  # no good record: the model's figure
    assert plan_command.main(["--recipe", "1b", "--gpu", "H100"]) == 0
    out = capsys.readouterr().out
    assert " measured |" not in out and "measured rows" not in out and "Traceback" not in out


def test_the_doctor_uses_this_gpus_measurement_for_time_cost_and_memory(store):
    recipe = one_b(micro_batch_size=16)  # the estimate refused it; the card ran it at 65.9 GiB
    here = Machine("cuda", H100, gpu_named("H100 SXM"), bf16=True, capability=9.0, memory_bytes=int(79.2 * GIB))
    modelled = check_cost(recipe, here.gpu_name)  # nothing measured yet: the performance model's figure
    assert "an estimate of the performance model for NVIDIA H100" in modelled.reason
    record_measurement(h100_configuration(recipe), H100, 65_153.0, 65.92, "bench")
    cost = check_cost(recipe, here.gpu_name)
    assert cost.status == "pass" and "65,153 tokens/s (measured by bench on NVIDIA H100" in cost.reason
    memory = memory_row(recipe, run_profile(recipe.step_as_written, here))
    assert memory.status == "pass" and "this configuration ran here: peak 65.9" in memory.reason
    assert "measured by bench" in memory.reason and "the estimate, modelled" in memory.reason
    assert (
        memory_row(*on_cpu(recipe), device_memory_bytes=int(79.2 * GIB)).reason != memory.reason
    )  # another GPU's question


def test_a_variant_that_never_trained_says_why_on_screen_and_shows_no_figures(tmp_path, monkeypatch):
    """Issue 38: `bench --variants liger=true` on a CPU printed "preflight: n/a tokens/s, peak memory 0.54 GiB",
    the reason only in bench.json, and a peak memory for a variant that never trained."""
    from hf_pretrain.bench import variants as variants_module

    refusal = "preflight: 1 check(s) failed, the run would not survive:\n  cuda: liger=true but no CUDA device"
    monkeypatch.setattr(
        variants_module, "run_in_child", lambda recipe, folder: RunResult("preflight", refusal, peak_memory_gib=0.54)
    )
    said: list[str] = []
    runner = variants_module.VariantRunner(load_recipe("smoke"), tmp_path, 3, 1, said.append)
    result = runner.run({"liger": "true"})
    assert result.status == "preflight" and result.peak_memory_gib is None and result.tokens_per_s is None
    screen = "\n".join(said)
    assert "did not train (preflight)" in screen and "liger=true but no CUDA device" in screen
    assert "GiB" not in screen
