"""What a GPU would run, read off the graph torch.compile builds on the CPU (issue 26).

No GPU is lent to this project: the step a user's H100 runs is seen here through the FX graphs
dynamo traces. A backend of our own keeps them (dynamo's graph, then AOTAutograd's forward and
backward graphs, with every node's dtype and shape) and runs them eagerly, so the test costs one
small step. The model is built, prepared and called exactly as training/loop.py does: `build_model`,
activation checkpointing from `checkpointed_layers`, `train_in_compute_dtype`, `accelerator.prepare`
with the recipe's dynamo plugin (whole model or `compile_regions`) and mixed precision, then
training/step.py's `forward_backward`. Shapes: the smoke recipe, and the `1b` recipe's width (2048,
32 query heads over 8 KV heads) with 2 of its 16 layers.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
import torch.utils._pytree as pytree
from accelerate import Accelerator
from accelerate.state import AcceleratorState

from hf_pretrain.config import Recipe, load_recipe
from hf_pretrain.machine.run_profile import THE_CPU, run_profile
from hf_pretrain.model.fp8 import finish_fp8, fp8_handlers
from hf_pretrain.model.llama import build_model, enable_activation_checkpointing, llama_config, train_in_compute_dtype
from hf_pretrain.model.loss import LossHead, loss_head_for, use_loss_head
from hf_pretrain.training.compiling import dynamo_plugin
from hf_pretrain.training.step import forward_backward

SEQ_LEN = 64  # tokens per row: the graph's structure does not depend on it
TOKENIZER_SIZE = 4096
TORCH_COMPILE = torch.compile  # the real one: each step below swaps in one that keeps the graphs


@dataclasses.dataclass
class StepGraphs:
    """The graphs one compiled training micro-batch produced."""

    dynamo: list[torch.fx.GraphModule]  # torch-level: the calls as the model makes them
    forward: list[torch.fx.GraphModule]  # aten-level, autocast applied: the dtypes a GPU would see
    backward: list[torch.fx.GraphModule]
    recipe: Recipe

    def calls(self, name: str) -> list[torch.fx.Node]:
        return [n for g in self.dynamo for n in g.graph.nodes if n.op == "call_function" and name in str(n.target)]

    def aten(self, graphs: str, name: str) -> list[torch.fx.Node]:
        found = getattr(self, graphs)
        return [n for g in found for n in g.graph.nodes if n.op == "call_function" and str(n.target) == name]


def recipe_with(name: str, layers: int = 2, **train) -> Recipe:
    recipe = load_recipe(name, train)
    return dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, num_hidden_layers=layers))


def compiled_step_graphs(
    recipe: Recipe,
    monkeypatch,
    loss_head: LossHead | None = None,
    tokenizer_size: int = TOKENIZER_SIZE,
    seq_len: int = SEQ_LEN,
) -> StepGraphs:
    """One micro-batch of `recipe`'s compiled training step, the loop's way, its graphs kept. `loss_head`:
    the loop's choice for the recipe unless given (`liger` needs a stand-in for liger-kernel: tests/test_loss.py)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    graphs = StepGraphs([], [], [], recipe)

    def keep(into: list):
        def compiler(gm, example_inputs):
            into.append(gm)
            return make_boxed_func(gm.forward)

        return compiler

    def recorder(gm, example_inputs):
        graphs.dynamo.append(gm)
        return aot_autograd(fw_compiler=keep(graphs.forward), bw_compiler=keep(graphs.backward))(gm, example_inputs)

    # Accelerate compiles in `prepare` with the plugin's backend (inductor): ours instead, all else as it asks
    monkeypatch.setattr(torch, "compile", lambda model=None, **kw: TORCH_COMPILE(model, **{**kw, "backend": recorder}))
    torch._dynamo.reset()
    AcceleratorState._reset_state(reset_partial_state=True)
    profile = run_profile(recipe.step_as_written, THE_CPU)
    torch.manual_seed(0)
    # the kernel the loop's model prefers (training/loop.py: no check record on a CPU, so the recipe's own)
    model = build_model(llama_config(recipe.model, tokenizer_size), attention_backend=recipe.compute.attention_backend)
    if recipe.checkpointed_layer_count:
        enable_activation_checkpointing(model, recipe.checkpointed_layer_count)
    use_loss_head(model, loss_head or loss_head_for(recipe.compute, liger_applied=False))
    train_in_compute_dtype(model)
    accelerator = Accelerator(
        cpu=True,
        mixed_precision=profile.accelerate_precision,
        dynamo_plugin=dynamo_plugin(recipe.compute),
        kwargs_handlers=fp8_handlers(profile.step) or None,  # fp8: the decoder's linear layers converted in `prepare`
    )
    model = accelerator.prepare(model)
    if profile.precision == "fp8":
        finish_fp8(model, profile.step)
    tokens = torch.randint(0, tokenizer_size, (1, seq_len + 1), generator=torch.Generator().manual_seed(0))
    loss, _ = forward_backward(accelerator, model, iter([tokens]), grad_accum=1)
    assert 0 < loss.item() < float("inf")  # the step ran and produced a finite loss
    assert graphs.dynamo and graphs.forward and graphs.backward
    AcceleratorState._reset_state(reset_partial_state=True)
    return graphs


SHAPES = {
    "smoke-bf16": dict(name="smoke", compile=True, mixed_precision="bf16"),
    "1b-bf16": dict(name="1b", compile=True, mixed_precision="bf16"),
    "1b-fp32": dict(name="1b", compile=True, mixed_precision="no"),
    "1b-regions-bf16": dict(name="1b", compile=True, compile_regions=True, mixed_precision="bf16"),
}


def shape_recipe(shape: str) -> Recipe:
    spec = dict(SHAPES[shape])
    return recipe_with(spec.pop("name"), **spec)


# ---------------------------------------------------------------------- attention
@pytest.mark.parametrize("shape", list(SHAPES))
def test_compiled_attention_is_causal_sdpa_with_no_mask_and_kv_not_repeated(shape, monkeypatch):
    """The stock `sdpa` path, traced by dynamo, gave SDPA a [B, 1, T, T] boolean mask, is_causal=False
    and K/V repeated to every query head: no flash kernel takes that call. attention.py's implementation
    gives it no mask, is_causal=True and enable_gqa=True, in whole-model and regional compilation."""
    graphs = compiled_step_graphs(shape_recipe(shape), monkeypatch)
    model = graphs.recipe.model
    sdpa = graphs.calls("scaled_dot_product_attention")
    # regional compilation compiles one layer and reuses its graph for the others
    assert len(sdpa) == (1 if graphs.recipe.compute.compile_regions else model.num_hidden_layers)
    for node in sdpa:
        assert node.kwargs.get("attn_mask") is None, node.kwargs
        assert node.kwargs.get("is_causal") is True, node.kwargs
        query, key, value = (a.meta["example_value"] for a in node.args[:3])
        assert query.shape[1] == model.num_attention_heads
        assert key.shape[1] == value.shape[1] == model.num_key_value_heads  # K/V not repeated
        if model.num_key_value_heads < model.num_attention_heads:
            assert node.kwargs.get("enable_gqa") is True, node.kwargs


# ---------------------------------------------------------------------- precision
def test_bf16_graph_keeps_the_residual_stream_in_bf16_and_returns_the_loss_alone(monkeypatch):
    """Under bf16 autocast the embedding's fp32 output used to make the residual stream, the norms'
    inputs and the RoPE products fp32, and Accelerate's output conversion made the graph return an
    fp32 copy of the logits (2.1 GB per 8 x 2048 micro-batch at the 1b recipe's vocabulary)."""
    graphs = compiled_step_graphs(shape_recipe("1b-bf16"), monkeypatch)
    hidden = graphs.recipe.model.hidden_size
    # the graph's outputs, as the loop receives them: one fp32 scalar, the loss
    outputs = [a for g in graphs.dynamo for n in g.graph.nodes if n.op == "output" for a in pytree.tree_leaves(n.args)]
    values = [a.meta["example_value"] for a in outputs if isinstance(a, torch.fx.Node)]
    assert [(tuple(v.shape), v.dtype) for v in values] == [((), torch.float32)]
    # every add over the hidden width (the residual stream: two per layer) runs in bf16
    residual = [n for n in graphs.aten("forward", "aten.add.Tensor") if n.meta["val"].shape[-1] == hidden]
    assert len(residual) == 2 * graphs.recipe.model.num_hidden_layers
    assert {n.meta["val"].dtype for n in residual} == {torch.bfloat16}
    # the RoPE products and every matmul too; the norms' variance and the log-softmax stay fp32
    head_dim = graphs.recipe.model.hidden_size // graphs.recipe.model.num_attention_heads
    rope = [n for n in graphs.aten("forward", "aten.mul.Tensor") if n.meta["val"].dim() == 4]
    assert rope and {n.meta["val"].dtype for n in rope} == {torch.bfloat16}
    assert all(n.meta["val"].shape[-1] == head_dim for n in rope)
    assert {n.meta["val"].dtype for n in graphs.aten("forward", "aten.mm.default")} == {torch.bfloat16}
    assert {n.meta["val"].dtype for n in graphs.aten("forward", "aten.rsqrt.default")} == {torch.float32}
    assert {n.meta["val"].dtype for n in graphs.aten("forward", "aten._log_softmax.default")} == {torch.float32}


def test_fp32_graph_has_no_bf16_anywhere(monkeypatch):
    """The fp32 path is untouched by the autocast cast (the golden losses, tests/test_train.py, hold it)."""
    graphs = compiled_step_graphs(shape_recipe("1b-fp32"), monkeypatch)
    dtypes = Counter(
        n.meta["val"].dtype
        for g in graphs.forward + graphs.backward
        for n in g.graph.nodes
        if isinstance(n.meta.get("val"), torch.Tensor)
    )
    assert torch.bfloat16 not in dtypes and dtypes[torch.float32] > 0, dtypes


def float8_ancestor(node: torch.fx.Node, depth: int = 6) -> bool:
    """Whether `node` is computed, within `depth` ops, from a float8 tensor (the emulation's upcast and unscale)."""
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor) and value.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return True
    inputs = [a for a in node.args if isinstance(a, torch.fx.Node)]
    return depth > 0 and any(float8_ancestor(a, depth - 1) for a in inputs)


@pytest.mark.parametrize(
    "fp8_recipe, emulate, name, in_fp8",
    # on a GPU only the projections where FP8 pays (fp8.py's size rule, the 1b's shapes): tensorwise all
    # but K and V, rowwise the MLP's gate and up; emulated, all 7 (the smoke's, far too small to pay)
    [("tensorwise", False, "1b", 5), ("rowwise", False, "1b", 2), ("tensorwise", True, "smoke", 7)],
)
def test_fp8_graph_scales_every_decoder_matmul_and_keeps_embedding_head_and_loss_out_of_fp8(
    fp8_recipe, emulate, name, in_fp8, monkeypatch
):
    """What an H100 runs under `mixed_precision: fp8` (issue 34): the decoder's projections where FP8 pays
    (issue 41: 5 of 7 per layer tensorwise, 2 rowwise) as `_scaled_mm` on float8 operands (e4m3 forward; the output gradient e5m2 in tensorwise, e4m3 in rowwise),
    three per projection and step: output, input gradient, weight gradient. The tied head's matmuls stay
    bf16, the embedding reads its fp32 master, the log-softmax runs in fp32. The CPU runs `_scaled_mm` too
    (oneDNN), so the graph is the GPU's; with `fp8_emulate` the same casts feed an fp32 `mm` instead."""
    layers = 1 if name == "1b" else 2
    recipe = recipe_with(
        name, layers=layers, compile=True, mixed_precision="fp8", fp8_recipe=fp8_recipe, fp8_emulate=emulate
    )
    graphs = compiled_step_graphs(recipe, monkeypatch)
    projections = in_fp8 * layers
    scaled = {part: graphs.aten(part, "aten._scaled_mm.default") for part in ("forward", "backward")}
    plain = {part: graphs.aten(part, "aten.mm.default") for part in ("forward", "backward")}

    def operand_dtypes(nodes):
        return {tuple(a.meta["val"].dtype for a in n.args[:2]) for n in nodes}

    if emulate:
        assert not scaled["forward"] and not scaled["backward"]
        emulated = {part: [n for n in plain[part] if n.meta["val"].dtype == torch.float32] for part in plain}
        assert len(emulated["forward"]) == projections and len(emulated["backward"]) == 2 * projections
        assert all(float8_ancestor(a) for nodes in emulated.values() for n in nodes for a in n.args[:2])
    else:
        assert len(scaled["forward"]) == projections and len(scaled["backward"]) == 2 * projections
        assert {n.meta["val"].dtype for nodes in scaled.values() for n in nodes} == {torch.bfloat16}
        assert operand_dtypes(scaled["forward"]) == {(torch.float8_e4m3fn, torch.float8_e4m3fn)}
        grad = torch.float8_e5m2 if fp8_recipe == "tensorwise" else torch.float8_e4m3fn
        assert operand_dtypes(scaled["backward"]) == {(grad, torch.float8_e4m3fn)}
    # the tied head: one bf16 matmul forward, two backward (input and weight gradients), none in float8
    vocab_rows = graphs.aten("forward", "aten.embedding.default")[0].args[0].meta["val"].shape[0]
    head = [n for n in plain["forward"] if vocab_rows in n.meta["val"].shape]
    assert len(head) == 1 and head[0].meta["val"].dtype == torch.bfloat16
    assert all(n.meta["val"].dtype == torch.bfloat16 for n in plain["backward"] if not float8_ancestor(n))
    # the head's two, and two for each projection left in bf16
    bf16_backward = [n for n in plain["backward"] if n.meta["val"].dtype == torch.bfloat16]
    assert len(bf16_backward) == 2 + 2 * (7 - in_fp8) * layers
    assert {n.meta["val"].dtype for n in graphs.aten("forward", "aten.embedding.default")} == {torch.float32}
    assert {n.meta["val"].dtype for n in graphs.aten("forward", "aten._log_softmax.default")} == {torch.float32}
    # no float8 tensor is as wide as the vocabulary: the head and the loss never see FP8
    float8 = [
        n.meta["val"]
        for g in graphs.forward + graphs.backward
        for n in g.graph.nodes
        if isinstance(n.meta.get("val"), torch.Tensor)
        and n.meta["val"].dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    ]
    assert float8 and not [v for v in float8 if vocab_rows in v.shape]


# ---------------------------------------------------------------------- activation checkpointing
@pytest.mark.parametrize("name", ["smoke", "1b"])
def test_checkpointed_layers_recompute_exactly_that_many_layers_in_the_compiled_backward(name, monkeypatch):
    """`checkpointed_layers` k of L: the compiled backward graph holds the forward matmuls of k layers
    again, no more, no fewer: 6 per layer (q, k, v, o, gate, up; the down projection's output only joins
    the residual stream, which the backward never reads, so recomputing stops before it)."""
    matmuls = {}
    for k in (0, 1, 2):
        graphs = compiled_step_graphs(
            recipe_with(name, compile=True, mixed_precision="bf16", checkpointed_layers=k), monkeypatch
        )
        matmuls[k] = len(graphs.aten("backward", "aten.mm.default"))
    assert matmuls[1] - matmuls[0] == 6 and matmuls[2] - matmuls[0] == 12, matmuls


def test_bench_varies_checkpointed_layers():
    """`hf-pretrain bench --variants checkpointed_layers=0,8,16` builds three recipes of the 1b model."""
    from hf_pretrain.bench.variants import variant_grid
    from hf_pretrain.config import build_recipe

    recipe = load_recipe("1b")
    grid = variant_grid(["checkpointed_layers=0,8,16"])
    assert [build_recipe(recipe.to_dict(), o).checkpointed_layer_count for o in grid] == [0, 8, 16]


def test_gradient_checkpointing_alone_still_checkpoints_every_layer():
    model = build_model(llama_config(recipe_with("smoke", layers=3).model, TOKENIZER_SIZE))
    enable_activation_checkpointing(model)
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [True, True, True]
    enable_activation_checkpointing(model, 1)
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [True, False, False]
    assert recipe_with("smoke", layers=3, gradient_checkpointing=True).checkpointed_layer_count == 3
    assert (
        recipe_with("smoke", layers=3, gradient_checkpointing=True, checkpointed_layers=1).checkpointed_layer_count == 1
    )


# ---------------------------------------------------------------------- host syncs
HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")


def count_host_reads(monkeypatch) -> Counter:
    """Calls that copy a tensor's value to Python (on a GPU each makes the host wait for the device)."""
    counts: Counter = Counter()
    for name in HOST_READS:
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_an_optimizer_step_reads_the_device_once_whatever_its_micro_batches(compiled, monkeypatch):
    """Four micro-batches, one host read: the loss and the gradient norm in one transfer, which the
    guards and the non-finite skip need every step (docs/gpu.md says why that costs nothing measurable).
    The micro-batches read nothing: before, the mean loss and then the norm were two reads, and in eager
    mode transformers' packed-sequence check read the device once per micro-batch (attention.py)."""
    from hf_pretrain.optim.build import build_optimizer
    from hf_pretrain.training.step import TrainStep

    recipe = recipe_with("smoke", compile=compiled, mixed_precision="bf16")
    AcceleratorState._reset_state(reset_partial_state=True)
    torch._dynamo.reset()
    model = build_model(llama_config(recipe.model, TOKENIZER_SIZE))
    train_in_compute_dtype(model)
    # fused, as on a GPU: the unfused AdamW reads each parameter's step count (a CPU tensor on a GPU too)
    optimizer = build_optimizer(model, recipe.optim, fused=True)
    plugin = dynamo_plugin(recipe.compute)
    if compiled:  # the recording backend of the tests above: no C++ compile, the same graphs
        monkeypatch.setattr(
            torch, "compile", lambda model=None, **kw: TORCH_COMPILE(model, **{**kw, "backend": "eager"})
        )
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", dynamo_plugin=plugin, gradient_accumulation_steps=4)
    model, optimizer = accelerator.prepare(model, optimizer)
    batches = [
        torch.randint(0, TOKENIZER_SIZE, (2, SEQ_LEN + 1), generator=torch.Generator().manual_seed(i)) for i in range(8)
    ]
    step = TrainStep(accelerator, model, optimizer, batches, recipe.optim, grad_accum=4, lr_of=lambda _: 1e-3)
    step(1)  # compiles, creates AdamW's moments
    counts = count_host_reads(monkeypatch)
    result = step(2)
    AcceleratorState._reset_state(reset_partial_state=True)
    assert result.finite and result.grad_norm > 0
    assert sum(counts.values()) == 1, counts


# ---------------------------------------------------------------------- bf16 against the golden curve
# How far the golden run's losses under bf16 autocast may be from the fp32 golden curve, relative, at any
# step (docs/testing.md). Measured 2026-11-24: 2.0e-4 with the residual stream in bf16, 5.7e-5 before it
# (fp32 residual); a learning rate 1% off moves the curve 2.5e-3.
BF16_GOLDEN_RTOL = 1e-3


@pytest.mark.slow
def test_bf16_golden_run_stays_near_the_fp32_golden_curve(tmp_path):
    import json

    from tests.helpers import ROOT, launch_training
    from tests.regenerate_golden import golden_overrides, prepare_golden_data
    from tests.test_gpu_paths import train_losses

    golden = json.loads((ROOT / "tests" / "assets" / "golden_smoke_losses.json").read_text())["losses"]
    data_dir, run_dir = tmp_path / "data", tmp_path / "run"
    prepare_golden_data(data_dir)
    launch_training(data_dir, run_dir, sources=golden_overrides(data_dir)["sources"], mixed_precision="bf16")
    losses = [loss for _, loss in sorted(train_losses(run_dir).items())]
    assert losses == pytest.approx(golden, rel=BF16_GOLDEN_RTOL)
    assert losses != pytest.approx(golden, rel=1e-6)  # it did run in bf16


# ---------------------------------------------------------------------- the forecast, off the training thread
def test_the_forecast_fit_runs_off_the_training_thread_and_each_record_takes_the_newest_finished_fit():
    import threading
    import time

    from hf_pretrain.training.metrics import BackgroundForecast

    release, threads = threading.Event(), []

    def slow_fit(records, *args):
        threads.append(threading.current_thread().name)
        release.wait(5)
        return {"forecast_loss": float(len(records))}

    forecast = BackgroundForecast(fit=slow_fit)
    started = time.perf_counter()
    assert forecast.submit([{}]) == {}  # nothing finished yet: the record goes out without a forecast
    assert forecast.submit([{}, {}]) == {}  # the first fit still runs: no second one queued behind it
    assert time.perf_counter() - started < 1.0  # the training thread never waited for the fit
    release.set()
    forecast.running.result(timeout=5)
    assert forecast.submit([{}, {}, {}]) == {"forecast_loss": 1.0}  # the first fit's fields, a new fit started
    forecast.running.result(timeout=5)
    assert forecast.submit([{}]) == {"forecast_loss": 3.0}
    forecast.close()
    assert threads and all(name.startswith("forecast") for name in threads)


# ---------------------------------------------------------------------- what leaves the run
def test_a_saved_model_names_no_attention_of_ours_and_loads_as_sdpa_computing_the_same(tmp_path):
    """The training attention's name lives only in the process: config.json (a checkpoint's and an
    export's, both written by save_pretrained) names none, so every client loads `sdpa`, and gets the
    same logits; generation with a KV cache under our attention gives the same tokens as under sdpa."""
    import json

    from transformers import AutoModelForCausalLM

    from hf_pretrain.model.attention import CAUSAL_SDPA

    recipe = recipe_with("1b", layers=2)
    config = llama_config(dataclasses.replace(recipe.model, hidden_size=256, intermediate_size=512), TOKENIZER_SIZE)
    torch.manual_seed(0)
    ours = build_model(config).eval()
    assert ours.config._attn_implementation == CAUSAL_SDPA
    ours.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert not any("attn_implementation" in key for key in saved), saved
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config._attn_implementation == "sdpa"
    tokens = torch.randint(0, TOKENIZER_SIZE, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=tokens).logits, loaded(input_ids=tokens).logits, rtol=1e-5, atol=1e-5)
        prompt = tokens[:1, :8]
        kwargs = dict(max_new_tokens=12, do_sample=False, use_cache=True, pad_token_id=0)
        assert ours.generate(prompt, **kwargs).tolist() == loaded.generate(prompt, **kwargs).tolist()


# ---------------------------------------------------------------------- memory of k checkpointed layers
def peak_allocated(step) -> int:
    """Highest sum of live tensor bytes the CPU allocator reported while `step()` ran (as
    benchmarks/bench_memory.py measures: the profiler's memory events, not the process's RSS)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


@pytest.mark.slow
def test_each_checkpointed_layer_saves_what_the_memory_estimate_says():
    """k of L layers checkpointed (k = 0, L/2, L): the measured peak of a forward and backward falls by
    k times the estimate's saving per layer (economics/memory.py: a layer's activations less the
    residual it keeps), within 5%. Measured 2026-11-24 (smoke width, 4 layers, 8 x 256, fp32):
    183.3 / 143.2 / 103.1 MiB, 20.04 MiB per layer against an estimated 20.05. The recomputed
    layer's buffers do not add to the peak: the peak is at the start of the backward, and the
    checkpointed layers are the first ones, recomputed last."""
    from hf_pretrain.model.llama import tokenizer_size_of
    from tests.helpers import estimate_memory

    layers, micro, seq = 4, 8, 256
    recipe = load_recipe(
        "smoke",
        {"micro_batch_size": micro, "global_batch_tokens": micro * seq, "seq_len": seq, "mixed_precision": "no"},
    )
    recipe = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, num_hidden_layers=layers))
    size = tokenizer_size_of(recipe.data)
    estimate = estimate_memory(recipe, size, THE_CPU)
    per_layer = estimate.activations / layers
    kept = (estimate.checkpointed_activations - per_layer) / layers  # what a checkpointed layer keeps
    peaks = {}
    for k in (0, layers // 2, layers):
        torch.manual_seed(0)
        model = build_model(llama_config(recipe.model, size))
        if k:
            enable_activation_checkpointing(model, k)
        train_in_compute_dtype(model)
        tokens = torch.randint(0, size, (micro, seq + 1), generator=torch.Generator().manual_seed(0))
        targets = tokens[:, 1:].contiguous()

        def step(model=model, tokens=tokens, targets=targets):
            model(input_ids=tokens[:, :-1], labels=targets, shift_labels=targets).loss.backward()

        step()  # the gradients exist from here on, as in a run's later steps
        peaks[k] = peak_allocated(step)
    for k in (layers // 2, layers):
        saved_per_layer = (peaks[0] - peaks[k]) / k
        assert saved_per_layer == pytest.approx(per_layer - kept, rel=0.05), (k, peaks)
