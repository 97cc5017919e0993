"""`attention_backend` (issue 41): the SDPA kernel is a recipe choice, applied inside the compiled step,
refused by the doctor where the card lacks it, chosen by `auto` from what `hf-pretrain check` measured."""

from __future__ import annotations

import pytest
import torch

from hf_pretrain.config import RecipeError, load_recipe
from hf_pretrain.economics.check_records import (
    attention_shape,
    model_attention_shape,
    new_record,
    record_checks,
    resolved_attention_backend,
)
from hf_pretrain.preflight.sdpa_kernel import check_attention_backend
from tests.helpers import h100_workload, section_on_cpu
from tests.test_compiled_step import compiled_step_graphs, recipe_with

CPU_FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"


@pytest.mark.parametrize("backend, flash_calls", [("auto", 2), ("flash", 2), ("math", 0)])
def test_the_compiled_step_calls_the_chosen_kernel(backend, flash_calls, monkeypatch):
    """Read off the aten graphs the compiled forward and backward run: torch's CPU flash kernel by default
    and with `flash`; with `math` none, the attention decomposed into matmuls and a softmax."""
    graphs = compiled_step_graphs(
        recipe_with("smoke", compile=True, mixed_precision="bf16", attention_backend=backend), monkeypatch
    )
    assert len(graphs.aten("forward", CPU_FLASH)) == flash_calls  # one per layer (2 layers)
    backward = graphs.aten("backward", CPU_FLASH.replace(".default", "_backward.default"))
    assert len(backward) == flash_calls
    if backend == "math":
        softmax = [n for g in graphs.forward for n in g.graph.nodes if "safe_softmax" in str(n.target)]
        assert len(softmax) == 2


def test_a_wrong_backend_is_refused_by_the_recipe_and_a_missing_one_by_the_doctor_in_one_line():
    with pytest.raises(RecipeError, match="attention_backend"):
        load_recipe("smoke", {"attention_backend": "flash3"})
    assert (
        check_attention_backend(*section_on_cpu(load_recipe("smoke", {"attention_backend": "flash"}), "model")).status
        == "pass"
    )
    refused = check_attention_backend(*section_on_cpu(load_recipe("smoke", {"attention_backend": "cudnn"}), "model"))
    assert refused.status == "fail" and "no cudnn SDPA kernel" in refused.reason
    assert "\n" not in refused.reason and "--attention_backend auto" in refused.fix
    assert check_attention_backend(*section_on_cpu(load_recipe("smoke"), "model")).status == "skip"


def attention_of(recipe) -> tuple:
    """What the door hands `resolved_attention_backend` of a recipe: the compute section's kernel, the model,
    the context length."""
    return recipe.compute.attention_backend, recipe.model, recipe.data.seq_len


def test_auto_takes_the_fastest_kernel_a_check_measured_on_this_card(tmp_path):
    store = tmp_path / "measurements.jsonl"
    recipe = load_recipe("1b")
    shape = model_attention_shape(recipe.model, recipe.data.seq_len)
    assert shape == attention_shape(32, 8, 64, 2048)
    assert resolved_attention_backend(*attention_of(recipe), "NVIDIA H100 80GB HBM3", store) == (
        "auto",
        None,
    )  # none measured
    timed = {"flash": 9.0, "cudnn": 5.0, "efficient": 12.0, "default": 4.0}
    records = [
        new_record("attention", name, ms, "ms", "NVIDIA H100 80GB HBM3", shape=shape) for name, ms in timed.items()
    ]
    records.append(new_record("attention", "math", 1.0, "ms", None, shape=shape))  # a CPU's: never a GPU's choice
    record_checks(records, store)
    backend, why = resolved_attention_backend(*attention_of(recipe), "NVIDIA H100 80GB HBM3", store)
    assert backend == "cudnn" and "fastest" in why  # torch's default is timed but is not a kernel to name
    assert resolved_attention_backend(*attention_of(recipe), "NVIDIA A100-SXM4-80GB", store) == (
        "auto",
        None,
    )  # another card
    assert resolved_attention_backend(*attention_of(recipe), None, store) == ("auto", None)  # the CPU
    named = load_recipe("1b", {"attention_backend": "flash"})
    assert resolved_attention_backend(*attention_of(named), "NVIDIA H100 80GB HBM3", store) == (
        "flash",
        None,
    )  # a choice wins
    assert torch.nn.attention.SDPBackend.CUDNN_ATTENTION  # the kernel names are torch's


def test_the_performance_model_prices_the_attention_share_by_kernel():
    """Published ratios (estimates, performance.py): cuDNN faster than FlashAttention-2 on Hopper only,
    math far slower everywhere; `auto` and `flash` are the kernel the model was fitted with."""
    from hf_pretrain.economics.performance import modelled_tokens_per_s, step_time
    from hf_pretrain.machine.gpus import find_gpu

    def rate(gpu: str, backend: str) -> float:
        return modelled_tokens_per_s(h100_workload(load_recipe("1b", {"attention_backend": backend})), find_gpu(gpu))

    h100, a100 = "H100 SXM", "A100 80GB SXM"
    assert rate(h100, "auto") == rate(h100, "flash")
    assert rate(h100, "cudnn") > rate(h100, "auto") > rate(h100, "efficient") > rate(h100, "math")
    assert rate(a100, "cudnn") == rate(a100, "auto")  # no published advantage off Hopper
    times = {
        b: step_time(h100_workload(load_recipe("1b", {"attention_backend": b})), find_gpu(h100))
        for b in ("auto", "cudnn")
    }
    assert times["cudnn"].attention == pytest.approx(times["auto"].attention / 1.7)
    assert times["cudnn"].matmul == times["auto"].matmul  # only the attention share moves


def test_the_profile_built_at_the_door_names_the_kernel_auto_became(tmp_path, monkeypatch):
    """Issue 46: `auto` is resolved once, into the run profile the loop and the preflight are handed: the
    model's kernel, the doctor's row and the measurements' key all name what a check measured fastest."""
    from hf_pretrain.economics.resolved_run import complete_profile
    from hf_pretrain.machine.gpus import find_gpu
    from hf_pretrain.machine.run_profile import THE_CPU, Machine, run_profile

    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path))
    recipe = load_recipe("smoke")
    assert (
        complete_profile(
            recipe.step_as_written, THE_CPU, model=recipe.model, seq_len=recipe.data.seq_len
        ).step.attention_backend
        == "auto"
    )  # the CPU: torch's own choice
    gpu, shape = "NVIDIA H100 80GB HBM3", model_attention_shape(recipe.model, recipe.data.seq_len)
    record_checks([new_record("attention", n, ms, "ms", gpu, shape=shape) for n, ms in (("flash", 2.0), ("math", 9.0))])
    h100 = Machine("cuda", name=gpu, gpu=find_gpu(gpu), bf16=True, capability=9.0)  # a GPU that a check timed
    profile = complete_profile(
        recipe.step_as_written, h100, world_size=2, model=recipe.model, seq_len=recipe.data.seq_len
    )
    assert profile.step.attention_backend == "flash" and profile.step.world_size == 2
    assert "fastest SDPA kernel" in profile.attention_why
    # the doctor's row: the profile's kernel, tried on this CPU
    on_the_cpu = run_profile(
        recipe.step_as_written, THE_CPU, attention=(profile.step.attention_backend, profile.attention_why)
    )
    row = check_attention_backend(recipe.model, on_the_cpu)
    assert row.status == "pass" and row.reason == profile.attention_why
    math = load_recipe("smoke", {"attention_backend": "math"})
    named = complete_profile(math.step_as_written, h100, model=math.model, seq_len=math.data.seq_len)
    assert named.step.attention_backend == "math" and named.attention_why is None  # a recipe's choice wins
