"""The training loss three ways (hf_pretrain/model/loss.py), each equal to transformers' stock loss.

- `chunked_loss: true`: the same loss and gradients as the stock forward, eager and compiled, with and
  without `ignore_index` targets, tied or untied head; compiled, it stays in the step's one graph and the
  backward keeps no [tokens, vocabulary] tensor (its bytes per token, at the 1b's width, against stock);
- `liger: true` under compile: Liger's fused loss called outside the compiled graph (one deliberate
  break, the rest one graph) and equal to the stock loss, with and without ignored targets. Liger's
  kernels are Triton (GPU only), so a CPU stand-in with liger-kernel 0.8.5's call signature takes the
  place of `liger_kernel.transformers.functional`; it refuses to be traced.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from hf_pretrain.config import RecipeError, load_recipe
from hf_pretrain.model import loss as loss_module
from hf_pretrain.model.llama import build_model, llama_config, train_in_compute_dtype
from hf_pretrain.model.loss import IGNORE_INDEX, loss_head_for, use_loss_head
from tests.test_compiled_step import TORCH_COMPILE, compiled_step_graphs, recipe_with

VOCAB = 4096


def labelled_call(ignored: bool, batch: int = 2, seq_len: int = 48, vocab: int = VOCAB) -> dict[str, torch.Tensor]:
    """The loop's call (already-shifted targets, twice); `ignored`: a third of the targets are -100,
    a whole row's tail and scattered ones (a row of only ignored targets would be 0/0 in any loss)."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (batch, seq_len + 1), generator=generator)
    targets = tokens[:, 1:].clone()
    if ignored:
        targets[0, seq_len // 2 :] = IGNORE_INDEX
        targets[1, torch.randperm(seq_len, generator=generator)[: seq_len // 4]] = IGNORE_INDEX
    return {"input_ids": tokens[:, :-1], "labels": targets, "shift_labels": targets}


def twin_models(head: str, tied: bool = True, layers: int = 2):
    """(stock, with `head`): the same weights, each set up as training/loop.py sets a model up."""
    recipe = load_recipe("smoke")
    config = llama_config(dataclasses.replace(recipe.model, num_hidden_layers=layers, tie_word_embeddings=tied), VOCAB)
    torch.manual_seed(0)
    stock, ours = build_model(config), build_model(config)
    ours.load_state_dict(stock.state_dict())
    use_loss_head(ours, head)
    for model in (stock, ours):
        train_in_compute_dtype(model)
    return stock, ours


def loss_and_grads(model, call) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(**call).loss
    loss.backward()
    return loss.detach(), {name.removeprefix("_orig_mod."): p.grad for name, p in model.named_parameters()}


def assert_same_loss_and_grads(stock, ours, call) -> None:
    expected, expected_grads = loss_and_grads(stock, call)
    got, grads = loss_and_grads(ours, call)
    torch.testing.assert_close(got, expected)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], msg=name)


# ---------------------------------------------------------------------- the chunked loss
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("ignored", [False, True], ids=["all-counted", "ignore_index"])
def test_chunked_loss_equals_the_stock_loss_and_gradients_eagerly(ignored, tied, monkeypatch):
    """96 targets in chunks of 40: three chunks, the last one short, ignored targets across them."""
    monkeypatch.setattr(loss_module, "LOSS_CHUNK_TOKENS", 40)
    stock, chunked = twin_models("chunked", tied=tied)
    assert (chunked.lm_head.weight is chunked.model.embed_tokens.weight) == tied
    assert_same_loss_and_grads(stock, chunked, labelled_call(ignored))


def test_chunked_loss_takes_unshifted_labels_and_a_token_count_as_transformers_does():
    """`labels` alone are shifted as `ForCausalLMLoss` shifts them; `num_items_in_batch` divides the sum."""
    stock, chunked = twin_models("chunked")
    call = labelled_call(ignored=True)
    del call["shift_labels"]
    torch.testing.assert_close(chunked(**call).loss, stock(**call).loss)
    call["num_items_in_batch"] = torch.tensor(50)
    torch.testing.assert_close(chunked(**call).loss, stock(**call).loss)
    # without labels it is the stock forward: the logits, for generation and export
    torch.testing.assert_close(chunked(input_ids=call["input_ids"]).logits, stock(input_ids=call["input_ids"]).logits)


@pytest.mark.parametrize("ignored", [False, True], ids=["all-counted", "ignore_index"])
def test_chunked_loss_compiled_equals_the_stock_loss_and_gradients(ignored, monkeypatch):
    """Under torch.compile (AOTAutograd's partition, run eagerly: the graph inductor would be given) the
    chunked loss is still the stock loss, gradients included, where the compiled Liger loss was not."""
    monkeypatch.setattr(loss_module, "LOSS_CHUNK_TOKENS", 40)
    torch._dynamo.reset()
    stock, chunked = twin_models("chunked")
    compiled = TORCH_COMPILE(chunked, backend="aot_eager", fullgraph=True)  # fullgraph: no break, or it raises
    assert_same_loss_and_grads(stock, compiled, labelled_call(ignored))
    torch._dynamo.reset()


@pytest.mark.slow
def test_chunked_loss_under_inductor_equals_the_stock_loss(monkeypatch):
    """inductor's own kernels (C++ on the CPU), with ignored targets: the loss and the head's gradient."""
    monkeypatch.setattr(loss_module, "LOSS_CHUNK_TOKENS", 40)
    torch._dynamo.reset()
    stock, chunked = twin_models("chunked", layers=1)
    call = labelled_call(ignored=True)
    expected, expected_grads = loss_and_grads(stock, call)
    got, grads = loss_and_grads(TORCH_COMPILE(chunked), call)
    torch._dynamo.reset()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    name = "model.embed_tokens.weight"  # the tied head's weight: the loss's gradient and the embedding's
    torch.testing.assert_close(grads[name], expected_grads[name], rtol=1e-4, atol=1e-6)


def saved_for_backward(graphs) -> list[torch.Tensor]:
    """What the compiled forward keeps for the backward: the backward graph's inputs that are neither
    gradients flowing in (`tangents_*`) nor the step's own inputs (`primals_*`: the weights and the
    batch, which exist anyway)."""
    return [
        node.meta["val"]
        for g in graphs.backward
        for node in g.graph.nodes
        if node.op == "placeholder" and not node.name.startswith(("tangents", "primals"))
    ]


def test_compiled_chunked_loss_is_one_graph_that_keeps_no_logits_for_the_backward(monkeypatch):
    """The loop's compiled step (Accelerate's prepare, bf16 autocast) at the smoke width: stock keeps a
    [tokens, vocabulary] fp32 log-softmax for the backward; the chunked loss keeps nothing that wide and
    still compiles to one graph, its three head matmuls in the forward, in bf16, none in the backward."""
    monkeypatch.setattr(loss_module, "LOSS_CHUNK_TOKENS", 16)  # 64 tokens: 4 chunks
    stock = compiled_step_graphs(recipe_with("smoke", compile=True, mixed_precision="bf16"), monkeypatch)
    chunked = compiled_step_graphs(
        recipe_with("smoke", compile=True, mixed_precision="bf16", chunked_loss=True), monkeypatch
    )
    vocab = llama_config(stock.recipe.model, VOCAB).vocab_size
    assert len(chunked.dynamo) == 1 and len(chunked.forward) == 1 and len(chunked.backward) == 1
    tokens = 64  # compiled_step_graphs' one row
    wide = [t for t in saved_for_backward(stock) if tuple(t.shape) == (tokens, vocab)]
    assert wide and {t.dtype for t in wide} == {torch.float32}
    hidden = chunked.recipe.model.hidden_size
    # as wide as the vocabulary: only the head weight's gradient, fp32, once per step (not per token)
    wide = [t for t in saved_for_backward(chunked) if vocab in t.shape]
    assert [(tuple(t.shape), t.dtype) for t in wide] == [((vocab, hidden), torch.float32)]

    def head_matmuls(graphs, which):
        return [
            n
            for n in graphs.aten(which, "aten.mm.default")
            if vocab in n.meta["val"].shape
            or any(isinstance(a, torch.fx.Node) and vocab in a.meta["val"].shape for a in n.args)
        ]

    forward = head_matmuls(chunked, "forward")
    assert len(forward) == 3 * 4 and {n.meta["val"].dtype for n in forward} == {torch.bfloat16}
    assert not head_matmuls(chunked, "backward")


# ---------------------------------------------------------------------- Liger under compile, on a stand-in
LIGER_CALLS: list[str] = []


def liger_stand_in(
    input,
    weight,
    target,
    bias=None,
    ce_weight=None,
    ignore_index: int = -100,
    lse_square_scale: float = 0.0,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    softcap=None,
    return_z_loss: bool = False,
    accum_dtype=None,
    use_token_scaling: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
    chunk_mem_const: int = 1,
):
    """liger-kernel 0.8.5's `liger_fused_linear_cross_entropy`, its signature (checked where liger-kernel is
    installed) and its loss, in torch ops.
    Called inside a graph dynamo traces, it fails: what Liger's kernel did on the H100."""
    if torch.compiler.is_compiling():
        raise RuntimeError("Liger's fused loss was traced into the compiled graph")
    LIGER_CALLS.append(reduction)
    logits = F.linear(input, weight).float()
    return F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction)


@pytest.fixture
def liger_functional(monkeypatch):
    """`liger_kernel.transformers.functional` is the stand-in for this test (the real package, where
    installed, is left on disk and comes back afterwards)."""
    package, transformers_pkg = types.ModuleType("liger_kernel"), types.ModuleType("liger_kernel.transformers")
    functional = types.ModuleType("liger_kernel.transformers.functional")
    functional.liger_fused_linear_cross_entropy = liger_stand_in
    package.transformers, transformers_pkg.functional = transformers_pkg, functional
    for name, module in (
        ("liger_kernel", package),
        ("liger_kernel.transformers", transformers_pkg),
        ("liger_kernel.transformers.functional", functional),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    LIGER_CALLS.clear()
    return functional


@pytest.mark.parametrize("ignored", [False, True], ids=["all-counted", "ignore_index"])
def test_liger_loss_under_compile_runs_outside_the_graph_and_equals_the_stock_loss(ignored, liger_functional):
    """The pair a user tries first: the model compiled, its loss Liger's. One deliberate break at the
    loss call: the decoder is one graph, the loss runs eagerly (the stand-in would raise if traced), and
    loss and gradients equal the stock model's, with and without ignored targets (a compiled Liger loss
    is silently wrong with them: linkedin/Liger-Kernel#1338)."""
    torch._dynamo.reset()
    stock, liger = twin_models("liger")
    call = labelled_call(ignored)
    explained = torch._dynamo.explain(liger)(**call)
    assert explained.graph_count == 1, explained.graphs
    # the one break: the disabled loss call (the graph ends there, so dynamo counts no graph after it)
    assert len(explained.break_reasons) == 1, explained.break_reasons
    reason = str(explained.break_reasons[0].reason)
    assert "torch.compiler.disable" in reason and "liger_linear_cross_entropy" in reason, reason
    # the loss is not in the graph: no matmul onto the vocabulary, no cross entropy
    nodes = [n for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert not [n for n in nodes if "cross_entropy" in str(n.target) or "log_softmax" in str(n.target)]
    torch._dynamo.reset()
    LIGER_CALLS.clear()
    compiled = TORCH_COMPILE(liger, backend="aot_eager")
    assert_same_loss_and_grads(stock, compiled, call)
    assert LIGER_CALLS == ["mean"]  # called once, eagerly, as the loop calls it
    torch._dynamo.reset()


def test_liger_loss_in_the_loops_compiled_step_keeps_the_decoder_in_one_graph(liger_functional, monkeypatch):
    """training/loop.py's setup, Accelerate's prepare and bf16 autocast: one dynamo graph (the decoder up
    to the final norm, forward and backward), the loss beside it."""
    graphs = compiled_step_graphs(recipe_with("smoke", compile=True, mixed_precision="bf16"), monkeypatch, "liger")
    assert len(graphs.dynamo) == 1 and len(graphs.forward) == 1 and len(graphs.backward) == 1
    assert LIGER_CALLS == ["mean"]
    vocab = llama_config(graphs.recipe.model, VOCAB).vocab_size
    assert not [n for n in graphs.aten("forward", "aten.mm.default") if n.meta["val"].shape[-1] == vocab]
    # the graph hands the final hidden states out, for the loss to read
    outputs = [a for g in graphs.dynamo for n in g.graph.nodes if n.op == "output" for a in n.args[0]]
    hidden = graphs.recipe.model.hidden_size
    assert any(isinstance(a, torch.fx.Node) and a.meta["example_value"].shape[-1] == hidden for a in outputs)


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None, reason="liger-kernel is not installed")
def test_the_stand_in_has_liger_kernels_signature():
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    real = inspect.signature(liger_fused_linear_cross_entropy)
    ours = inspect.signature(liger_stand_in)
    assert list(ours.parameters) == list(real.parameters)  # the same names, in the same order
    assert {n: p.default for n, p in ours.parameters.items()} == {n: p.default for n, p in real.parameters.items()}


# ---------------------------------------------------------------------- the recipe keys
def test_the_loop_picks_the_loss_and_refuses_chunked_with_liger():
    smoke = load_recipe("smoke")
    assert loss_head_for(smoke.compute, liger_applied=False) == "stock"
    assert loss_head_for(load_recipe("smoke", {"chunked_loss": True}).compute, liger_applied=False) == "chunked"
    assert loss_head_for(load_recipe("smoke", {"liger": True}).compute, liger_applied=True) == "liger"
    # liger asked for on a machine without CUDA: the stock modules and the stock loss
    assert loss_head_for(load_recipe("smoke", {"liger": True}).compute, liger_applied=False) == "stock"
    with pytest.raises(RecipeError, match="chunked_loss=true with liger=true.*--chunked_loss false") as refused:
        load_recipe("smoke", {"chunked_loss": True, "liger": True})
    assert "\n" not in str(refused.value)


def test_the_doctor_says_liger_under_compile_is_unmeasured_in_one_line():
    from hf_pretrain.preflight.gpu import check_liger_under_compile
    from tests.helpers import card_sections

    def check(recipe):
        return check_liger_under_compile(**card_sections(recipe), recipe_name="1b")

    assert check(load_recipe("1b")).status == "skip"
    assert check(load_recipe("1b", {"liger": True, "compile": False})).status == "skip"
    result = check(load_recipe("1b", {"liger": True}))
    assert result.status == "warn" and "unmeasured on any GPU" in result.reason and "\n" not in result.reason
    assert "77.9k" in result.reason and "72.9k" in result.reason  # the H100's figures, not a promise
    assert result.fix == "hf-pretrain bench --recipe 1b --variants liger=true,false measures it on this GPU"


@pytest.mark.slow
def test_a_chunked_loss_run_trains_the_reference_runs_curve(reference_run, smoke_data, tmp_path):
    """`--chunked_loss true` through train.py: the same losses as the stock run of SHORT_RUN, up to
    float32 summation order, and a final model that loads with the auto classes."""
    from transformers import AutoModelForCausalLM

    from tests.helpers import launch_training
    from tests.test_gpu_paths import train_losses

    reference_dir, _ = reference_run
    run_dir = tmp_path / "chunked"
    launch_training(smoke_data, run_dir, chunked_loss=True)
    losses, stock = train_losses(run_dir), train_losses(reference_dir)
    assert losses.keys() == stock.keys()
    assert max(abs(losses[s] - stock[s]) / stock[s] for s in stock) <= 1e-5
    assert AutoModelForCausalLM.from_pretrained(run_dir / "final").num_parameters() > 1_000_000


def test_at_the_1b_micro_batch_the_chunked_loss_keeps_2_bytes_per_vocabulary_row_and_token_less():
    """benchmarks/bench_loss_memory.py's reading of the compiled graph (fake tensors, the 1b's width, 2
    layers, one 8 x 2048 micro-batch, inductor's partition): the stock loss keeps the bf16 logits (2 x 32,064
    bytes a token, 1.05 GB), the chunked one keeps nothing per token that wide (measured 2026-11-25: 0.92 GB
    freed). The freed bytes are at least those logits less the fixed fp32 weight gradient (263 MB)."""
    import importlib.util

    from tests.helpers import ROOT

    spec = importlib.util.spec_from_file_location("bench_loss_memory", ROOT / "benchmarks" / "bench_loss_memory.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tokens = bench.ONE_B_MICRO_BATCH_TOKENS
    stock, chunked = bench.saved_bytes(False, tokens), bench.saved_bytes(True, tokens)
    vocab = stock["vocab_size"]
    assert stock["logits_bytes"] == 2 * vocab * tokens and chunked["logits_bytes"] == 0
    freed = stock["saved_bytes"] - chunked["saved_bytes"]
    assert 2 * vocab * tokens - 4 * vocab * 2048 <= freed <= 2.2 * vocab * tokens, freed
