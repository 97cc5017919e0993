"""Part (b): SDPA's kernels on the recipe's attention shape (micro-batch, query and KV heads, head
dimension, sequence, causal, the training dtype), forward and backward: which one torch picks by
itself (`torch._fused_sdp_choice`, what `attention_backend: auto` runs without a record) and what each
costs. A CPU has math and its own flash kernel; it runs a smaller batch and sequence (said on screen)."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from hf_pretrain.check.figures import Report
from hf_pretrain.config import ModelConfig
from hf_pretrain.economics.check_records import model_attention_shape
from hf_pretrain.machine.run_profile import Machine, Step
from hf_pretrain.model.attention import BACKENDS

CPU_LIMITS = (2, 256)  # micro-batch and tokens on a CPU: a shape the CPU times in a second


def attention_inputs(m: ModelConfig, step: Step, seq_len: int, device: torch.device):
    """Query, key and value of the model's attention for one of the step's micro-batches, in its dtype."""
    batch, tokens = step.micro_batch_size, seq_len
    if device.type != "cuda":
        batch, tokens = min(batch, CPU_LIMITS[0]), min(tokens, CPU_LIMITS[1])
    dtype = getattr(torch, step.precision_facts.autocast or "float32")  # fp8's: bf16
    head_dim = m.hidden_size // m.num_attention_heads

    def tensor(heads: int) -> torch.Tensor:
        return torch.randn(batch, heads, tokens, head_dim, device=device, dtype=dtype, requires_grad=True)

    return tensor(m.num_attention_heads), tensor(m.num_key_value_heads), tensor(m.num_key_value_heads)


def seconds_per_call(q, k, v, backend: str, min_seconds: float) -> float:
    """Seconds of one forward + backward with SDPA limited to `backend` (a key of attention.BACKENDS)."""

    def sync() -> None:
        if q.device.type == "cuda":
            torch.cuda.synchronize()

    with sdpa_kernel([BACKENDS[backend]]):
        for _ in range(2):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()
        sync()
        calls, started = 0, time.perf_counter()
        while calls < 3 or (time.perf_counter() - started < min_seconds and calls < 50):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()
            calls += 1
        sync()
    return (time.perf_counter() - started) / calls


ROUNDS = 2  # each kernel timed in turn, twice, its best kept: the first timed is not the one a warm card favours


def time_kernels(q, k, v, names: list[str], limit_s: float, report: Report) -> dict[str, float]:
    """Each kernel's best seconds of forward + backward over ROUNDS interleaved rounds; a kernel that cannot
    run this shape is said once and left out."""
    timed: dict[str, float] = {}
    unavailable: set[str] = set()
    for _ in range(ROUNDS):
        for name in names:
            if name in unavailable:
                continue
            try:
                seconds = seconds_per_call(q, k, v, name, min_seconds=min(1.0, limit_s / (8 * ROUNDS * len(names))))
            except RuntimeError as exc:
                report.skip(name, f"not available here ({str(exc).strip().splitlines()[0][:90]})")
                unavailable.add(name)
                continue
            timed[name] = min(seconds, timed.get(name, seconds))
    return timed


def measure(m: ModelConfig, step: Step, report: Report, limit_s: float, machine: Machine, *, seq_len: int) -> None:
    """Which kernel torch picks, then each kernel timed once under its own name (torch's pick is one of
    them, marked: never timed again as "default", which once read 80 ms beside its own 132 ms), the fastest.
    `step`: the run's on `machine` (its micro-batch and precision); `seq_len`, the data section's."""
    cuda = machine.on_gpu
    device = torch.device("cuda" if cuda else "cpu")
    q, k, v = attention_inputs(m, step, seq_len, device)
    shape = model_attention_shape(m, seq_len)
    batch, tokens = q.shape[0], q.shape[2]
    flops = 4 * batch * q.shape[1] * tokens * tokens * q.shape[3] / 2 * 3.5  # causal: fwd 2 matmuls, bwd 2.5x
    picked = SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=True, enable_gqa=True)).name
    report.figure(
        "picked", 0, "", f"torch picks {picked} for micro-batch {batch} x {tokens} tokens, {shape}", picked=picked
    )
    picked_name = next((name for name, backend in BACKENDS.items() if backend.name == picked), None)
    names = ["flash", "cudnn", "efficient", "math"] if cuda else ["flash", "math"]
    timed = time_kernels(q, k, v, names, limit_s, report)
    for name, seconds in timed.items():
        rate = flops / seconds / (1e12 if cuda else 1e9)
        report.figure(
            name,
            seconds * 1e3,
            "ms",
            f"{name}{' (torch picks it)' if name == picked_name else ''}: {seconds * 1e3:,.2f} ms forward + backward "
            f"({rate:,.1f} {'TFLOP/s' if cuda else 'GFLOP/s'})",
            shape=shape,
            batch=batch,
            tokens=tokens,
        )
    if timed:
        fastest = min(timed, key=timed.__getitem__)
        report.figure(
            "fastest",
            timed[fastest] * 1e3,
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
