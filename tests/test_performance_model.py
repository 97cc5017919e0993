"""The performance model's byte counts against the ops the step really runs (issue 32).

workload.py counts, kernel by kernel, the bytes an eager decoder layer moves per token (transformers'
RMSNorm, RoPE, SwiGLU and residual adds under bf16 autocast on fp32 weights). Here every aten op of a
real eager forward and backward on the CPU is read through a TorchDispatchMode, and the bytes of its
tensors (inputs and outputs) summed, matmuls and attention left out (the model times those as FLOPs).
One layer more, less one layer fewer, is one layer's traffic: it must agree with the count.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from hf_pretrain.config import load_recipe
from hf_pretrain.economics import published
from hf_pretrain.economics.workload import BACKWARD_POINTWISE, layer_forward_bytes, model_shape
from hf_pretrain.machine.run_profile import Step
from hf_pretrain.model.llama import build_model, llama_config, train_in_compute_dtype
from tests.helpers import ROOT

# timed by the model as FLOPs, not bytes
COMPUTE_OPS = {"mm", "addmm", "bmm"}
# no data moves: a view of the same storage, or a new tensor not yet written
NO_TRAFFIC = {"view", "_unsafe_view", "transpose", "t", "slice", "unsqueeze", "expand", "detach", "alias"}
NO_TRAFFIC |= {"select", "permute", "as_strided", "squeeze", "split", "empty", "empty_like", "reshape"}


class ByteCounter(TorchDispatchMode):
    """Bytes read and written by every memory-bound op that runs under it."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if name not in COMPUTE_OPS and name not in NO_TRAFFIC and "attention" not in name:
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return out


def eager_step_bytes(layers: int, overrides: dict, batch: int, seq_len: int) -> int:
    recipe = load_recipe("smoke", {**overrides, "num_hidden_layers": layers})
    torch.manual_seed(0)
    model = build_model(llama_config(recipe.model, 512))
    train_in_compute_dtype(model)
    ids = torch.randint(0, 512, (batch, seq_len))
    counter = ByteCounter()
    with torch.autocast("cpu", dtype=torch.bfloat16), counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return counter.bytes


def test_the_eager_layer_moves_the_bytes_the_model_counts():
    seq_len, batch = 256, 8  # 2,048 tokens: the weights' casts are ~2% of a layer's traffic
    shape = {"hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4, "num_key_value_heads": 2}
    overrides = {**shape, "seq_len": seq_len, "max_position_embeddings": seq_len}
    per_token = (eager_step_bytes(2, overrides, batch, seq_len) - eager_step_bytes(1, overrides, batch, seq_len)) / (
        batch * seq_len
    )
    eager, smoke = Step(compiled=False), load_recipe("smoke", overrides)
    counted = layer_forward_bytes(model_shape(smoke.model, smoke.data, 512), eager) * (1 + BACKWARD_POINTWISE)
    assert counted == pytest.approx(per_token, rel=0.15)
    # and the compiled layer (one kernel per run of pointwise ops) moves far less: why eager is slower
    compiled = layer_forward_bytes(model_shape(smoke.model, smoke.data, 512), Step())
    assert compiled * (1 + BACKWARD_POINTWISE) < 0.4 * per_token


def test_docs_gpu_md_prints_the_step_budget_the_model_gives_today():
    """docs/gpu.md's table is `python benchmarks/estimate_step_budget.py`'s output, not a copy that rots."""
    spec = importlib.util.spec_from_file_location(
        "estimate_step_budget", ROOT / "benchmarks" / "estimate_step_budget.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    table = script.table()
    assert "| tokens/s measured (H100 SXM, 2026-11-25) | 77,750-78,120 | 51,150 | 72,900 |" in table
    assert table in (ROOT / "docs" / "gpu.md").read_text()


def test_docs_benchmarks_md_prints_the_checks_the_model_passes_today():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert published.runs_table() in page and published.fp8_table() in page
