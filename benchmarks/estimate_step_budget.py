"""Estimate: where the `1b` recipe's optimizer step would spend its time on one H100 SXM, before and
after issue 26 (causal flash attention, bf16 residual stream, no fp32 logits copy, the forecast off
the training thread). No GPU was lent to this project: every figure here is computed from the
model's shapes and the assumptions below, none is measured. docs/gpu.md prints the table.

    python benchmarks/estimate_step_budget.py            # the markdown table, then tokens/s and MFU
"""

from __future__ import annotations

from dataclasses import dataclass

# ---------------------------------------------------------------------- assumptions, each named
H100_BF16_FLOPS = 989e12  # dense bf16 tensor-core peak, H100 SXM data sheet (economics/gpus.yaml)
H100_HBM_BYTES_PER_S = 3.35e12  # HBM3 bandwidth, data sheet
MATMUL_EFFICIENCY = 0.65  # cuBLAS bf16 GEMMs at these shapes (16K-token rows, 512-32K columns)
HBM_EFFICIENCY = 0.80  # fused pointwise kernels (inductor's Triton) reach 80% of HBM bandwidth
FLASH_EFFICIENCY = 0.35  # SDPA's flash kernel, head dim 64, causal: on the half of the square it computes
MASKED_EFFICIENCY = 0.25  # SDPA with a boolean mask (memory-efficient kernel): on the whole square
BACKWARD_POINTWISE = 2.0  # the backward's pointwise traffic, relative to the forward's
SYNC_SECONDS = 50e-6  # GPU idle per host read: the queue drains, the host launches the next kernels
FORECAST_SECONDS = (
    0.010  # the forecast fit per log record: 8.5-9.8 ms measured here at 3,000-7,000 records (issue 26 said 55-67 ms)
)


@dataclass
class Shape:
    hidden: int = 2048
    kv: int = 512  # 8 KV heads x 64
    intermediate: int = 8192
    layers: int = 16
    vocab: int = 32064
    seq_len: int = 2048
    params: float = 1.038813184e9
    step_tokens: int = 131072
    micro_batches: int = 8  # 8 x 2048 tokens each
    log_interval: int = 10


def attention_flops_per_token(s: Shape) -> float:
    """PaLM's count, no causal halving (model.flops_per_token's attention term)."""
    return 12.0 * s.layers * s.hidden * s.seq_len


def pointwise_bytes_per_token(s: Shape, residual_bytes: int, repeated_kv: bool) -> float:
    """HBM bytes per token of the fused pointwise kernels of all layers, forward and backward:
    what each fused kernel reads and writes (matmul outputs are bf16, 2 bytes)."""
    h, kv, i, r = s.hidden, s.kv, s.intermediate, residual_bytes
    forward = (
        (r * h + 2 * h)  # input RMSNorm: residual in, bf16 normed out
        + 2 * (2 * h + 2 * kv)  # RoPE: q and k in and out
        + (r * h + 2 * h + r * h + 2 * h)  # attention residual add + post-attention RMSNorm
        + (3 * 2 * i)  # SwiGLU: gate and up in, product out
        + (r * h + 2 * h + r * h)  # MLP residual add
    )
    if repeated_kv:  # K and V copied to every query head, and their gradients summed back
        forward += 2 * (2 * kv + 2 * h)
    return s.layers * forward * (1 + BACKWARD_POINTWISE)


def loss_bytes_per_token(s: Shape, fp32_logits_copy: bool) -> float:
    """The head's pointwise work: the cross-entropy reads the bf16 logits forward and backward and
    writes their gradient; Accelerate's output conversion wrote (and the loop never read) an fp32
    copy of them before."""
    return s.vocab * (2 + 2 + 2 + (6 if fp32_logits_copy else 0))


def budget(after: bool, s: Shape) -> dict[str, float]:
    """Seconds per optimizer step, by kernel class."""
    hbm = H100_HBM_BYTES_PER_S * HBM_EFFICIENCY
    tokens = s.step_tokens
    attention = attention_flops_per_token(s) * tokens
    rows = {
        "matmuls (6N)": 6 * s.params * tokens / (H100_BF16_FLOPS * MATMUL_EFFICIENCY),
        "attention": (
            attention / 2 / (H100_BF16_FLOPS * FLASH_EFFICIENCY)
            if after
            else attention / (H100_BF16_FLOPS * MASKED_EFFICIENCY)
        ),
        "pointwise (norms, RoPE, SwiGLU, residual)": pointwise_bytes_per_token(s, 2 if after else 4, not after)
        * tokens
        / hbm,
        "loss and logits": loss_bytes_per_token(s, fp32_logits_copy=not after) * tokens / hbm,
        "weight casts (fp32 -> bf16, each micro-batch)": 6 * s.params * s.micro_batches / hbm,
        "optimizer (clip + fused AdamW)": (4 + 8 + 28) * s.params / hbm,
        "host reads": (1 if after else 2) * SYNC_SECONDS,
        "forecast fit (per step)": 0.0 if after else FORECAST_SECONDS / s.log_interval,
    }
    return rows


def table() -> str:
    s = Shape()
    before, after = budget(False, s), budget(True, s)
    flops = 6 * s.params + attention_flops_per_token(s)
    lines = ["| kernel class | before (ms) | after (ms) |", "|---|---|---|"]
    for name in before:
        lines.append(f"| {name} | {before[name] * 1e3:,.0f} | {after[name] * 1e3:,.0f} |")
    tb, ta = sum(before.values()), sum(after.values())
    lines.append(f"| **total** | **{tb * 1e3:,.0f}** | **{ta * 1e3:,.0f}** |")
    rate_b, rate_a = s.step_tokens / tb, s.step_tokens / ta
    lines.append(f"| tokens/s on one H100 (estimate) | {rate_b:,.0f} | {rate_a:,.0f} |")
    lines.append(
        f"| MFU, attention counted (estimate) | {rate_b * flops / H100_BF16_FLOPS:.0%} | "
        f"{rate_a * flops / H100_BF16_FLOPS:.0%} |"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
