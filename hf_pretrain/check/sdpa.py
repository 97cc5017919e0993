"""Part (b): SDPA's kernels on the recipe's attention shape (micro-batch, query and KV heads, head
dimension, sequence, causal, the training dtype), forward and backward: which one torch picks by
itself (`torch._fused_sdp_choice`, what `attention_backend: auto` runs without a record) and what each
costs. A CPU has math and its own flash kernel; it runs a smaller batch and sequence (said on screen)."""

from __future__ import annotations

import contextlib
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from hf_pretrain.check.figures import Report
from hf_pretrain.config import Recipe
from hf_pretrain.economics.check_records import recipe_attention_shape
from hf_pretrain.machine.run_profile import device_kind, run_profile
from hf_pretrain.model.attention import BACKENDS

CPU_LIMITS = (2, 256)  # micro-batch and tokens on a CPU: a shape the CPU times in a second


def attention_inputs(recipe: Recipe, device: torch.device):
    m = recipe.model
    batch, tokens = recipe.train.micro_batch_size, recipe.data.seq_len
    if device.type != "cuda":
        batch, tokens = min(batch, CPU_LIMITS[0]), min(tokens, CPU_LIMITS[1])
    dtype = getattr(torch, run_profile(recipe).step.precision_facts.autocast or "float32")  # fp8's: bf16
    head_dim = m.hidden_size // m.num_attention_heads

    def tensor(heads: int) -> torch.Tensor:
        return torch.randn(batch, heads, tokens, head_dim, device=device, dtype=dtype, requires_grad=True)

    return tensor(m.num_attention_heads), tensor(m.num_key_value_heads), tensor(m.num_key_value_heads)


def seconds_per_call(q, k, v, backend: str, min_seconds: float) -> float:
    """Seconds of one forward + backward under `backend` (`default`: torch's own choice)."""
    context = sdpa_kernel([BACKENDS[backend]]) if backend in BACKENDS else contextlib.nullcontext()

    def sync() -> None:
        if q.device.type == "cuda":
            torch.cuda.synchronize()

    with context:
        for _ in range(2):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()
        sync()
        calls, started = 0, time.perf_counter()
        while calls < 3 or (time.perf_counter() - started < min_seconds and calls < 50):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()
            calls += 1
        sync()
    return (time.perf_counter() - started) / calls


def measure(recipe: Recipe, report: Report, limit_s: float) -> None:
    cuda = device_kind() == "cuda"
    device = torch.device("cuda" if cuda else "cpu")
    q, k, v = attention_inputs(recipe, device)
    shape = recipe_attention_shape(recipe)
    batch, tokens = q.shape[0], q.shape[2]
    flops = 4 * batch * q.shape[1] * tokens * tokens * q.shape[3] / 2 * 3.5  # causal: fwd 2 matmuls, bwd 2.5x
    picked = SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=True, enable_gqa=True)).name
    report.figure(
        "picked", 0, "", f"torch picks {picked} for micro-batch {batch} x {tokens} tokens, {shape}", picked=picked
    )
    names = ["default", "flash", "cudnn", "efficient", "math"] if cuda else ["default", "flash", "math"]
    timed = {}
    for name in names:
        try:
            seconds = seconds_per_call(q, k, v, name, min_seconds=min(1.0, limit_s / (8 * len(names))))
        except RuntimeError as exc:
            report.skip(name, f"not available here ({str(exc).strip().splitlines()[0][:90]})")
            continue
        timed[name] = seconds
        rate = flops / seconds / (1e12 if cuda else 1e9)
        report.figure(
            name,
            seconds * 1e3,
            "ms",
            f"{name}: {seconds * 1e3:,.2f} ms forward + backward ({rate:,.1f} {'TFLOP/s' if cuda else 'GFLOP/s'})",
            shape=shape,
            batch=batch,
            tokens=tokens,
        )
    kernels = {n: s for n, s in timed.items() if n != "default"}
    if kernels:
        fastest = min(kernels, key=kernels.__getitem__)
        report.figure(
            "fastest",
            kernels[fastest] * 1e3,
            "ms",
            f"fastest: {fastest}"
            + (
                "; `attention_backend: auto` takes it on this card from now on"
                if cuda
                else " (a CPU's: no GPU takes it)"
            ),
            backend=fastest,
            shape=shape,
        )
