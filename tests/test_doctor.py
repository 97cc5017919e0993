"""`hf-pretrain doctor` and `preflight`: every check can fail (or warn, where that is its worst), and says why."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: no test may reach the Hub

import importlib.metadata
import shutil
import subprocess
import threading
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from hf_pretrain.config import Recipe, load_recipe
from hf_pretrain.data import loader as loader_module
from hf_pretrain.data.loader import PackedDataset
from hf_pretrain.economics.memory import layer_activation_bytes_per_token
from hf_pretrain.exit_codes import EXIT_CONFIG
from hf_pretrain.formatting import human_bytes
from hf_pretrain.machine.run_profile import THE_CPU, machine_with, run_profile
from hf_pretrain.model.llama import model_parameter_count, tokenizer_size_of
from hf_pretrain.preflight import disk as disk_module
from hf_pretrain.preflight.budget import check_cost, run_cost, run_hours
from hf_pretrain.preflight.checks import preflight, run_checks
from hf_pretrain.preflight.data import (
    check_batch_split,
    check_context,
    check_loader_pickling,
    check_num_workers,
)
from hf_pretrain.preflight.dependencies import check_versions
from hf_pretrain.preflight.disk import check_output_writable, disk_write_bytes_per_s
from hf_pretrain.preflight.gpu import check_bf16, check_cuda, check_tf32
from hf_pretrain.preflight.result import CheckResult, PreflightError, format_table
from tests.helpers import (
    CARD,
    cli,
    data_of,
    estimate_memory,
    memory_row,
    on_cpu,
    prepared_row,
    profile_on_cpu,
    resolved_here,
    section_on_cpu,
)

ON_GPU = torch.cuda.is_available()
cpu_only = pytest.mark.skipif(ON_GPU, reason="checks what happens without CUDA")
N_1B = 1_038_813_184  # the 1b recipe's parameters, as tests/test_recipes.py holds it


def smoke(smoke_data: Path, tmp_path: Path, **overrides) -> Recipe:
    return load_recipe("smoke", {"data_dir": str(smoke_data), "output_dir": str(tmp_path / "run"), **overrides})


def one_b(**overrides) -> Recipe:
    return load_recipe("1b", overrides)


def by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.name: r for r in results}


# ---------------------------------------------------------------------- versions
def fake_versions(
    monkeypatch: pytest.MonkeyPatch, versions: dict[str, str | None], requires: dict[str, list[str]] | None = None
) -> None:
    """Pretend these packages are installed at these versions (None: not installed)."""
    real_version, real_requires = importlib.metadata.version, importlib.metadata.requires

    def version(name: str) -> str:
        if name in versions:
            if versions[name] is None:
                raise importlib.metadata.PackageNotFoundError(name)
            return versions[name]
        return real_version(name)

    def requires_(name: str) -> list[str] | None:
        return (requires or {}).get(name) or real_requires(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(importlib.metadata, "requires", requires_)


def test_installed_stack_is_within_the_declared_ranges(tmp_path):
    results = by_name(check_versions(*section_on_cpu(one_b(), "compute")))
    assert [results[p].status for p in ("torch", "transformers", "accelerate", "datasets", "tokenizers")] == [
        "pass"
    ] * 5
    assert "liger-kernel" not in results  # only checked when the recipe turns Liger on


def test_version_outside_the_range_fails(monkeypatch):
    fake_versions(monkeypatch, {"transformers": "4.46.0", "datasets": None})
    results = by_name(check_versions(*section_on_cpu(one_b(), "compute")))
    assert results["transformers"].status == "fail"
    assert "4.46.0 is outside the supported range" in results["transformers"].reason
    assert "<6,>=5.0" in results["transformers"].reason  # read from the installed hf-pretrain metadata
    assert "constraints.txt" in results["transformers"].fix
    assert results["datasets"].status == "fail" and "not installed" in results["datasets"].reason
    assert results["torch"].status == "pass"


def test_liger_needs_its_packages_and_warns_outside_its_torch_range(monkeypatch):
    fake_versions(monkeypatch, {"liger-kernel": None, "triton": None})
    results = by_name(check_versions(*section_on_cpu(one_b(liger=True), "compute")))
    assert (
        results["liger-kernel"].status == "fail" and "not installed (needed: >=0.6)" in results["liger-kernel"].reason
    )
    assert "[liger]" in results["liger-kernel"].fix
    assert results["triton"].status == "fail"

    fake_versions(
        monkeypatch,
        {"liger-kernel": "0.6.2", "triton": "3.1.0", "torch": "2.9.0"},
        requires={"liger-kernel": ["torch<2.8,>=2.1.2", "triton>=2.3.1"]},
    )
    results = by_name(check_versions(*section_on_cpu(one_b(liger=True), "compute")))
    assert results["liger-kernel"].status == results["triton"].status == "pass"
    assert "(supported: >=2.3.1)" in results["triton"].reason  # Triton's range comes from Liger's metadata
    warning = results["liger + torch"]
    assert warning.status == "warn"
    assert "torch 2.9.0 is outside liger-kernel's tested torch range <2.8,>=2.1.2" in warning.reason


# ---------------------------------------------------------------------- CUDA, bf16, TF32
@cpu_only
def test_gpu_recipe_without_cuda_runs_on_the_cpu_except_liger():
    # compile and bf16 run on a CPU at a cost the check states (tests/test_gpu_paths.py); Liger cannot
    result = check_cuda(*section_on_cpu(one_b(compile=False), "compute"))
    assert result.status == "warn" and "no CUDA device: the run goes on the CPU" in result.reason
    liger = check_cuda(*section_on_cpu(one_b(mixed_precision="no", liger=True), "compute"))
    assert liger.status == "fail" and "liger=true" in liger.reason and "--liger false" in liger.fix


@cpu_only
def test_auto_precision_on_cpu_warns_and_gpu_only_checks_skip():
    result = check_cuda(*section_on_cpu(load_recipe("smoke"), "compute"))
    assert result.status == "warn" and "fp32 on the CPU" in result.reason
    assert check_cuda(*section_on_cpu(load_recipe("smoke", {"mixed_precision": "no"}), "compute")).status == "pass"
    # issue 38: the fix named the smoke recipe whichever recipe was checked
    other = check_cuda(*section_on_cpu(load_recipe("1b", {"mixed_precision": "auto", "compile": False}), "compute"))
    assert other.status == "warn" and "smoke" not in other.fix
    assert check_bf16(profile_on_cpu(one_b())).status == "skip"
    assert check_tf32(*section_on_cpu(one_b(tf32=False), "compute")).status == "skip"


# ---------------------------------------------------------------------- data and loader
def test_prepared_data_that_matches_passes(smoke_data, tmp_path):
    result = prepared_row(smoke(smoke_data, tmp_path))
    assert result.status == "pass" and "training tokens" in result.reason


def test_missing_prepared_data_fails_with_the_prepare_hint(tmp_path):
    result = prepared_row(load_recipe("smoke", {"data_dir": str(tmp_path / "nothing")}))
    assert result.status == "fail"
    assert "meta.json not found" in result.reason
    assert result.fix == f"run `hf-pretrain prepare --recipe smoke --data_dir {tmp_path / 'nothing'}`"
    assert "hf-pretrain prepare" not in result.reason  # the hint is shown once, as the fix


def test_metadata_that_does_not_match_the_recipe_fails_naming_the_field(smoke_data, tmp_path):
    # prepared with vocab_size 4096, checked with 4000
    result = prepared_row(smoke(smoke_data, tmp_path, vocab_size=4000))
    assert result.status == "fail"
    assert "vocab_size expected 4000, found 4096" in result.reason
    assert "hf-pretrain prepare --recipe smoke" in result.fix


def test_seq_len_beyond_max_position_embeddings_fails():
    recipe = load_recipe("smoke")
    assert check_context(recipe.data, recipe.model).status == "pass"
    recipe.data.seq_len = 1024  # the parser rejects this, so build a valid recipe and break it afterwards
    result = check_context(recipe.data, recipe.model)
    assert result.status == "fail" and "seq_len=1024 exceeds max_position_embeddings=512" in result.reason


def test_batch_that_does_not_split_over_the_processes_fails():
    recipe = load_recipe("smoke")
    assert check_batch_split(recipe.train, 2, seq_len=recipe.data.seq_len).status == "pass"
    result = check_batch_split(recipe.train, 3, seq_len=recipe.data.seq_len)
    assert result.status == "fail" and "global_batch_tokens=4096 is not a multiple" in result.reason


def test_zero_workers_warn():
    assert check_num_workers(load_recipe("smoke").data).status == "pass"
    result = check_num_workers(load_recipe("smoke", {"num_workers": 0}).data)
    assert result.status == "warn" and "training thread waits" in result.reason
    assert "--num_workers" in result.fix


def loader_row(recipe: Recipe):
    return check_loader_pickling(recipe.train, recipe.data, data_of(recipe))


def test_loader_survives_pickling_and_yields_a_batch(smoke_data, tmp_path):
    result = loader_row(smoke(smoke_data, tmp_path))
    assert result.status == "pass" and "[16, 129]" in result.reason


def test_unpicklable_collate_fails(smoke_data, tmp_path, monkeypatch):
    monkeypatch.setattr(loader_module, "stack_samples", lambda samples: torch.stack(samples))
    result = loader_row(smoke(smoke_data, tmp_path))
    assert result.status == "fail"
    assert "does not survive pickling for worker processes" in result.reason and "lambda" in result.reason


def test_unpicklable_dataset_fails(smoke_data, tmp_path, monkeypatch):
    def state_with_a_lock(self):
        return {**self.__dict__, "_shards": None, "lock": threading.Lock()}

    monkeypatch.setattr(PackedDataset, "__getstate__", state_with_a_lock)
    result = loader_row(smoke(smoke_data, tmp_path))
    assert result.status == "fail" and "lock" in result.reason


def test_loader_that_breaks_after_unpickling_fails(smoke_data, tmp_path, monkeypatch):
    # the copy a worker gets has lost its shard list: pickling works, reading does not
    monkeypatch.setattr(
        PackedDataset, "__getstate__", lambda self: {**self.__dict__, "_shards": None, "shard_paths": []}
    )
    result = loader_row(smoke(smoke_data, tmp_path))
    assert result.status == "fail" and "cannot produce a batch" in result.reason


def test_loader_check_skips_without_data(tmp_path):
    result = loader_row(load_recipe("smoke", {"data_dir": str(tmp_path / "nothing")}))
    assert result.status == "skip"


# ---------------------------------------------------------------------- output folder and disk
def test_output_dir_under_a_file_fails(tmp_path):
    (tmp_path / "file.txt").write_text("not a folder")
    recipe = load_recipe("smoke", {"output_dir": str(tmp_path / "file.txt" / "run")})
    result = check_output_writable(recipe.train.output_dir)
    assert result.status == "fail" and "file.txt is a file, not a folder" in result.reason
    assert (
        check_output_writable(load_recipe("smoke", {"output_dir": str(tmp_path / "a" / "b")}).train.output_dir).status
        == "pass"
    )


def test_unwritable_output_dir_fails(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("tempfile.NamedTemporaryFile", refuse)  # root ignores chmod, so refuse the write itself
    result = check_output_writable(load_recipe("smoke", {"output_dir": str(tmp_path / "run")}).train.output_dir)
    assert result.status == "fail" and "Permission denied" in result.reason


DiskUsage = namedtuple("DiskUsage", "total used free")


def check_disk_space(recipe: Recipe):
    """The doctor's disk row, handed the sections and the model's size as run_checks hands them."""
    n = model_parameter_count(recipe.model, tokenizer_size_of(recipe.data))
    return disk_module.check_disk_space(recipe.train, recipe.checkpoints, recipe.data, parameters=n)


def check_save_speed(recipe: Recipe):
    n, speed = (
        model_parameter_count(recipe.model, tokenizer_size_of(recipe.data)),
        recipe.reporting.expected_tokens_per_s,
    )
    return disk_module.check_save_speed(
        recipe.train, recipe.checkpoints, recipe.data, parameters=n, expected_tokens_per_s=speed
    )


def test_too_little_disk_fails_with_needed_and_free(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: DiskUsage(10**12, 10**12 - 10**11, 10**11))
    recipe = one_b(output_dir=str(tmp_path / "run"), milestone_interval=0)
    small = 2**20 + 100 * recipe.data.vocab_size  # RNG states, JSONs; the tokenizer (not prepared: estimated)
    checkpoint = 12 * N_1B + small  # fp32 weights + AdamW moments + the small files
    needed = 4 * checkpoint + 4 * N_1B  # 3 kept + 1 being written, and final/ exported in fp32
    result = check_disk_space(recipe)
    assert result.status == "pass"
    assert f"needs {human_bytes(needed)} = 4 checkpoints of {human_bytes(checkpoint)}" in result.reason
    assert human_bytes(needed) == "54.0 GB" and "100.0 GB free" in result.reason

    monkeypatch.setattr(shutil, "disk_usage", lambda path: DiskUsage(10**12, 10**12 - 40 * 10**9, 40 * 10**9))
    result = check_disk_space(recipe)
    assert result.status == "fail"
    assert "needs 54.0 GB" in result.reason and "40.0 GB free" in result.reason
    assert "--keep_checkpoints" in result.fix

    with_milestones = check_disk_space(one_b(output_dir=str(tmp_path / "run")))  # every 10,000 of 90,000 steps
    milestone = 2 * N_1B + small  # a milestone keeps its bf16 weights
    assert f"4 checkpoints of {human_bytes(checkpoint)}" in with_milestones.reason
    assert f"8 milestones of {human_bytes(milestone)} (bf16 weights only)" in with_milestones.reason
    assert f"needs {human_bytes(needed + 8 * milestone)}" in with_milestones.reason
    whole = check_disk_space(one_b(output_dir=str(tmp_path / "run"), milestone_full_state=True))
    assert f"needs {human_bytes(needed + 8 * checkpoint)}" in whole.reason and "(whole)" in whole.reason
    # milestones exist only where a save happens: every 3,000 steps for saves every 1,000 and milestones every 1,500
    odd_milestones = check_disk_space(one_b(output_dir=str(tmp_path / "run"), milestone_interval=1500))
    assert "29 milestones" in odd_milestones.reason


def test_existing_checkpoints_count_against_the_need(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: DiskUsage(10**12, 0, 10**12))
    recipe = load_recipe("smoke", {"output_dir": str(tmp_path / "run"), "mixed_precision": "no"})
    n = estimate_memory(recipe, tokenizer_size_of(recipe.data), CARD).parameters
    step = tmp_path / "run" / "checkpoints" / "step_00000100"
    step.mkdir(parents=True)
    with (step / "model.safetensors").open("wb") as f:
        f.truncate(10_000_000)  # sparse: counts its size without writing it
    small = 2**20 + 100 * recipe.data.vocab_size  # RNG states, JSONs, the tokenizer (estimated: not prepared)
    needed = 3 * (12 * n + small) + 4 * n - 10_000_000  # 2 kept + 1 being written + fp32 export
    result = check_disk_space(recipe)
    assert f"needs {human_bytes(needed)} = 3 checkpoints" in result.reason
    assert needed > 0 and "10.0 MB in existing checkpoints" in result.reason


def test_a_slow_disk_warns_with_the_save_interval_that_keeps_saves_under_one_percent(tmp_path, monkeypatch):
    """1b: 12.5 GB a checkpoint; at 60,000 tokens/s a save_interval of 1,000 is 36 minutes."""

    def recipe(**overrides):
        return one_b(output_dir=str(tmp_path / "run"), expected_tokens_per_s=60_000, **overrides)

    monkeypatch.setattr(disk_module, "disk_write_bytes_per_s", lambda folder: 300e6)  # a network volume
    slow = check_save_speed(recipe())
    assert slow.status == "warn" and "300.0 MB/s" in slow.reason and "(1.9% of the run)" in slow.reason
    interval = int(slow.fix.split()[1].replace(",", ""))
    assert check_save_speed(recipe(save_interval=interval)).status == "pass"
    assert check_save_speed(recipe(save_interval=interval - 50)).status == "warn"
    monkeypatch.setattr(disk_module, "disk_write_bytes_per_s", lambda folder: 2e9)  # a local NVMe
    assert check_save_speed(recipe()).status == "pass"
    assert check_save_speed(one_b(output_dir=str(tmp_path / "run"))).status == "skip"  # no step time known
    assert check_save_speed(recipe(save_interval=10**6)).reason == "one save, at the end of the run"


def test_the_disk_probe_writes_and_leaves_nothing(tmp_path):
    assert disk_write_bytes_per_s(tmp_path) > 1e6
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------- GPU memory
def test_memory_estimate_of_the_1b_recipe():
    """The shipped 1b (compiled, bf16) by economics/memory.py's formulas; the H100 measured 37.24 GiB
    (40.0 GB) for it (tests/test_memory_estimate.py holds the estimate to each measured peak)."""
    recipe = one_b()
    estimate = estimate_memory(recipe, tokenizer_size_of(recipe.data), CARD)
    n, tokens = N_1B, 8 * 2048
    assert estimate.parameters == n
    assert (estimate.weights, estimate.gradients, estimate.optimizer, estimate.weight_copies) == (
        4 * n,
        4 * n,
        8 * n,
        2 * n,
    )
    # compiled, bf16: 2 x (6h + 2 h_kv + 3I) + 4a + 8 bytes per token and layer, h=2048, h_kv=8*64, I=8192, a=32
    kind = run_profile(recipe.step_as_written, machine_with(CARD)).step
    assert (kind.compiled, kind.compiled_head, kind.liger, kind.compute_bytes) == (True, True, False, 2)
    assert layer_activation_bytes_per_token(recipe.model, kind) == 75_912
    assert estimate.activations == 16 * tokens * 75_912
    assert estimate.checkpointed_activations == 16 * tokens * 2 * 2048 + tokens * 75_912  # bf16 layer inputs
    # final norm (2 x 2h + 4) + the saved bf16 logits and two fp32 row statistics + the logits' bf16 gradient
    assert estimate.head == tokens * (4 * 2048 + 4 + 2 * 32_064 + 8 + 2 * 32_064)
    assert estimate.accumulating  # 8 micro-batches a step on one GPU: the gradients live through the forward
    assert estimate.embedding_gradient == 2 * 4 * 32_064 * 2048  # the tied embedding's gradient being summed
    # 8 micro-batches: the start of the backward, with the gradients, is the peak
    assert estimate.total(False) == estimate.static + estimate.activations + estimate.head
    assert round(estimate.total(False) / 1e9, 1) == 40.8 and round(estimate.total(True) / 1e9, 1) == 23.3
    # eager: autocast's casts and the unfused norms and SwiGLU keep more; the loss keeps 12 bytes per logit
    eager = one_b(compile=False)
    assert (
        layer_activation_bytes_per_token(eager.model, run_profile(eager.step_as_written, machine_with(CARD)).step)
        == 26 * 2048 + 4 * 512 + 8 * 8192 + 4 * 32 + 8
    )
    assert estimate_memory(eager, 32_005, CARD).head == tokens * (8 * 2048 + 4 + 12 * 32_064)
    # fused loss: no logits, but the projection's and the input's gradients, computed in the forward
    liger = estimate_memory(one_b(liger=True), 32_005, CARD)
    assert liger.head == tokens * (4 * 2048 + 4) + 4 * 32_064 * 2048 + 2 * tokens * 2048
    # without CUDA, Liger falls back to the standard kernels, and the estimate with it
    assert estimate_memory(one_b(liger=True), 32_005, THE_CPU).head == estimate.head


def test_checkpointing_that_is_not_needed_warns():
    result = memory_row(*on_cpu(one_b(gradient_checkpointing=True)), device_memory_bytes=141 * 10**9)
    assert result.status == "warn" and "fits without gradient checkpointing" in result.reason
    assert (
        "need 40.8 GB at the peak, compiled, bf16 (18.7 GB weights, gradients and AdamW, 19.9 GB activations, "
        "2.2 GB head and loss), 23.3 GB with gradient checkpointing" in result.reason
    )
    assert "--gradient_checkpointing false" in result.fix
    assert memory_row(*on_cpu(one_b()), device_memory_bytes=141 * 10**9).status == "pass"
    assert memory_row(*on_cpu(one_b()), device_memory_bytes=48 * 10**9).status == "pass"  # an L40S: no recompute needed
    # a few layers too many: the fewest that fit
    result = memory_row(*on_cpu(one_b(checkpointed_layers=13)), device_memory_bytes=32 * 10**9)
    assert result.status == "warn" and "fits with fewer checkpointed layers than 13" in result.reason
    assert "--checkpointed_layers 11 " in result.fix


def test_run_that_fits_only_with_checkpointing_fails_without_it():
    # 28.8 GB usable: 23.3 fits, 40.8 is over even less the estimate's 15% error (28.8 / 0.85 = 33.9)
    result = memory_row(*on_cpu(one_b()), device_memory_bytes=32 * 10**9)
    assert result.status == "fail" and "does not fit without gradient checkpointing" in result.reason
    # the fewest checkpointed layers that fit, before a smaller micro-batch (each costs a recompute)
    assert result.fix.startswith("--checkpointed_layers 11 (11 of 16 layers checkpointed)"), result.fix
    assert memory_row(*on_cpu(one_b(checkpointed_layers=11)), device_memory_bytes=32 * 10**9).status == "pass"
    assert memory_row(*on_cpu(one_b(checkpointed_layers=5)), device_memory_bytes=32 * 10**9).status == "fail"
    assert memory_row(*on_cpu(one_b(gradient_checkpointing=True)), device_memory_bytes=32 * 10**9).status == "warn"
    # a card too small at this micro-batch even with every layer: a smaller one, and its layers
    result = memory_row(*on_cpu(one_b()), device_memory_bytes=24 * 10**9)
    assert result.status == "fail" and "--micro_batch_size 4 --checkpointed_layers" in result.fix, result.fix


def test_an_estimate_over_the_card_by_less_than_its_error_warns_and_names_the_bench():
    """29.1 GB estimated with 10 layers checkpointed against 28.8 GB usable: within the estimate's 15%,
    so the doctor cannot tell; it warns and gives the command that measures it on the device."""
    result = memory_row(*on_cpu(one_b(checkpointed_layers=10)), device_memory_bytes=32 * 10**9)
    assert result.status == "warn" and "may not fit with 10 of 16 layers checkpointed" in result.reason
    assert "within the estimate's 15% of 28.8 GB usable" in result.reason
    assert (
        "hf-pretrain bench --recipe 1b --micro_batch_size 8 --checkpointed_layers 10 --compile true "
        "--no_search --steps 10 --warmup 4" in result.fix
    )
    assert "--checkpointed_layers 11" in result.fix  # and what the estimate says fits
    # the micro-batch the old estimate refused on an 80 GB card (99.7 GB; the H100 measured 40.0 GB at 8)
    assert memory_row(*on_cpu(one_b(micro_batch_size=16)), device_memory_bytes=80 * 10**9).status == "pass"


def test_run_that_cannot_fit_either_way_fails():
    result = memory_row(*on_cpu(one_b(gradient_checkpointing=True)), device_memory_bytes=16 * 10**9)
    assert result.status == "fail" and "does not fit even with gradient checkpointing" in result.reason
    assert "the device has 16.0 GB, 14.4 GB usable" in result.reason


@cpu_only
def test_memory_without_a_gpu_skips_but_shows_the_estimate():
    result = memory_row(*on_cpu(one_b()))
    assert result.status == "skip" and "no GPU to compare against" in result.reason
    assert "1.04B parameters need 40.8 GB" in result.reason


# ---------------------------------------------------------------------- time and cost
def test_time_and_cost_come_from_the_recipe():
    recipe = one_b(expected_tokens_per_s=30_000, price_per_hour=1.29)
    # 90,000 steps x 131,072 tokens = 11,796,480,000 tokens; / 30,000 tokens/s = 393,216 s
    assert run_hours(recipe.train, recipe.reporting) == pytest.approx(109.2267, abs=1e-4)
    assert run_cost(recipe.train, recipe.reporting) == pytest.approx(140.90, abs=0.01)
    result = check_cost(recipe)
    assert result.status == "pass" and "109.2 h at 30,000 tokens/s, $140.90 at $1.29/h" in result.reason
    assert "($11.94 per billion tokens)" in result.reason


def test_without_an_expected_rate_a_known_gpu_is_priced_by_the_performance_model_for_the_configuration(
    tmp_path, monkeypatch
):
    from hf_pretrain.economics import measurements

    # nothing measured on this H100 (the package ships the 1b's own: tests/test_shipped_measurements.py)
    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path))
    monkeypatch.setattr(measurements, "SHIPPED_STORE", tmp_path / "no-shipped.jsonl")
    h100 = "NVIDIA H100 80GB HBM3"
    compiled = check_cost(one_b(price_per_hour=2.99), h100)
    eager = check_cost(one_b(price_per_hour=2.99, compile=False), h100)
    assert compiled.status == eager.status == "pass"
    assert "~77,134 tokens/s (an estimate of the performance model for NVIDIA H100" in compiled.reason
    assert "~53,907 tokens/s" in eager.reason and "at $2.99/h" in eager.reason
    two = check_cost(one_b(), h100, world_size=2)  # data parallel: the optimizer step per GPU halves its tokens
    assert "~153,149 tokens/s" in two.reason and "2 x NVIDIA H100" in two.reason  # a little under 2 x 77,134
    # the recipe's own figure wins; a CPU (for a configuration no card measured), an unknown card or fp8 on
    # an A100 leave it unknown
    assert "30,000 tokens/s" in check_cost(one_b(expected_tokens_per_s=30_000), h100).reason
    for name, recipe in [
        (None, one_b(checkpointed_layers=8)),
        ("Some GPU 9000", one_b()),
        ("NVIDIA A100-SXM4-80GB", one_b(mixed_precision="fp8")),
    ]:
        assert "time and cost unknown" in check_cost(recipe, name).reason


def test_unknown_throughput_or_price_warns():
    unknown_rate = check_cost(one_b(checkpointed_layers=8))  # a configuration no card of the table measured
    assert unknown_rate.status == "warn" and "time and cost unknown" in unknown_rate.reason
    assert "hf-pretrain bench" in unknown_rate.fix
    unknown_price = check_cost(one_b(expected_tokens_per_s=30_000, price_per_hour=0))
    assert (
        unknown_price.status == "warn" and "cost unknown" in unknown_price.reason and "109.2 h" in unknown_price.reason
    )
    assert "--price_per_hour" in unknown_price.fix


# ---------------------------------------------------------------------- preflight and the command
def test_preflight_passes_a_good_run_and_logs_the_table(smoke_data, tmp_path):
    lines: list[str] = []
    recipe = smoke(smoke_data, tmp_path)
    results = preflight(recipe, resolved_here(recipe), log=lines.append)
    assert not [r for r in results if r.status == "fail"]
    assert "ready to train" in lines[0]


def test_preflight_raises_with_the_failed_checks_and_their_fixes(tmp_path):
    recipe = load_recipe("smoke", {"data_dir": str(tmp_path / "nothing"), "num_workers": 0})
    with pytest.raises(PreflightError) as error:
        preflight(recipe, resolved_here(recipe, 3), log=lambda _: None)
    message = str(error.value)
    assert (
        "data: " in message
        and f"fix: run `hf-pretrain prepare --recipe smoke --data_dir {tmp_path / 'nothing'}" in message
    )
    assert "batch: " in message and "num_workers" not in message  # warnings do not stop a run
    assert {r.name for r in error.value.results if r.status == "fail"} >= {"data", "batch"}


def test_a_check_that_crashes_is_reported_not_raised(monkeypatch):
    def broken(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr("hf_pretrain.preflight.checks.check_cost", broken)
    recipe = load_recipe("smoke")
    result = by_name(run_checks(recipe, resolved_here(recipe)))["time and cost"]
    assert result.status == "warn" and "RuntimeError: boom" in result.reason


def test_table_shows_fixes_under_problems_only():
    table = format_table([CheckResult("a", "pass", "fine", "unused"), CheckResult("b", "fail", "broken", "mend it")])
    assert "unused" not in table and "FAIL" in table and "fix: mend it" in table
    assert "1 passed, 0 warning(s), 1 failed" in table


def doctor(*args: str) -> subprocess.CompletedProcess:
    return cli("doctor", "--recipe", "smoke", *args, timeout=120)


def test_doctor_command_passes_a_prepared_smoke_run(smoke_data, tmp_path):
    result = doctor("--data_dir", str(smoke_data), "--output_dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "check" in result.stdout and "status" in result.stdout and "ready to train" in result.stdout
    for name in ("torch", "data", "loader", "output_dir", "disk space", "gpu memory", "time and cost"):
        assert f"\n{name} " in result.stdout


@pytest.mark.parametrize(
    ("key", "url"), [("--output_dir", "s3://"), ("--output-dir", "ftp://x/y"), ("--data_dir", "s3://Bad_Bucket!/x")]
)
def test_doctor_refuses_a_malformed_store_url_in_one_line(key, url):
    """Was a traceback (output_dir) or a table after the store's retries (data_dir): one line, 78, at once."""
    result = doctor(key, url)
    assert result.returncode == EXIT_CONFIG, result.stdout + result.stderr
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr and ("s3://BUCKET/PREFIX" in result.stderr or "ftp://" in result.stderr)


def test_doctor_command_exits_nonzero_on_a_failure(tmp_path):
    result = doctor("--data_dir", str(tmp_path / "nothing"), "--output_dir", str(tmp_path / "run"))
    assert result.returncode == EXIT_CONFIG
    assert "FAIL" in result.stdout and "hf-pretrain prepare --recipe smoke" in result.stdout


def test_lm_eval_tasks_lm_eval_does_not_know_fail_the_doctor_before_training():
    """A bogus lm_eval_tasks passed the doctor ("ready to train") and failed only as a warning at every
    checkpoint (issue 45)."""
    from hf_pretrain.preflight.lm_eval_tasks import check_lm_eval_tasks

    pytest.importorskip("lm_eval")
    bogus = check_lm_eval_tasks(load_recipe("smoke", {"lm_eval_tasks": ["arc_easy", "arc_eazy"]}).evaluation)
    assert bogus.status == "fail" and "arc_eazy" in bogus.reason and "arc_easy," not in bogus.reason
    assert "--lm_eval_tasks" in bogus.fix
    assert (
        check_lm_eval_tasks(load_recipe("smoke", {"lm_eval_tasks": ["arc_easy", "arc_easy_local"]}).evaluation).status
        == "pass"
    )
    assert check_lm_eval_tasks(load_recipe("smoke").evaluation).status == "skip"


def test_the_resume_row_of_a_finished_run_says_nothing_goes_on(tmp_path):
    """The doctor on a finished run said "resume: goes on from step 250", then "nothing to train" (issue 45)."""
    from hf_pretrain.checkpoints.resume_plan import Continuation
    from hf_pretrain.preflight.resume import check_resume

    recipe = load_recipe("smoke", {"output_dir": str(tmp_path), "max_steps": 250})
    saved = {"step": 250, "max_steps": 250, "end": 250}
    plan = Continuation(folder=tmp_path / "checkpoints" / "step_00000250", saved=saved)
    assert (
        check_resume(recipe.train, recipe.checkpoints, lambda: plan).reason == "goes on from step 250"
    )  # no final/: it was killed at the end
    (tmp_path / "final").mkdir()
    assert (
        check_resume(recipe.train, recipe.checkpoints, lambda: plan).reason
        == "nothing to resume: the run finished at step 250"
    )


def test_without_a_gpu_the_doctor_describes_the_configuration_asked_and_quotes_the_shipped_measurement(
    tmp_path, monkeypatch
):
    """`doctor --recipe 1b --checkpointed_layers 8` printed the same 40.8 GB as without them, and called the
    1b's time and cost unknown although the package ships the H100's measurement (issue 45)."""
    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path))  # the shipped store only
    asked = memory_row(*on_cpu(one_b(checkpointed_layers=8)))
    assert asked.status == "skip" and "with 8 of 16 layers checkpointed, as asked: 31.4 GB at the peak" in asked.reason
    plain = memory_row(*on_cpu(one_b()))
    assert "the H100 SXM measured a peak of" in plain.reason and "project's H100 run" in plain.reason
    cost = check_cost(one_b(), None)
    assert cost.status == "pass" and "at 77,935 tokens/s on one H100 SXM" in cost.reason
    assert "$2.99/h (its typical price)" in cost.reason and "no GPU here" in cost.reason
