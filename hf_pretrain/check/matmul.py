"""Part (a): the matmul peak. bf16 is bench's measurement (bench/measure.py: several sizes, the largest
rate wins; fp32 at small sizes on a CPU); FP8 is `torch._scaled_mm` on float8 e4m3 operands with unit
scales, the call torchao's Float8Linear makes, on a card with FP8 tensor cores (compute capability 8.9+)."""

from __future__ import annotations

import math
import time

import torch

from hf_pretrain.bench.measure import GPU_MATMUL_SIZES, WARMUP_MATMULS, measured_matmul_peak
from hf_pretrain.check.figures import Report
from hf_pretrain.machine.precisions import precision_named
from hf_pretrain.machine.run_profile import Machine

FP8 = precision_named("fp8")  # the card's FP8 peak is what this part measures, beside bf16's


def fp8_matmul_rate(size: int, device: torch.device, min_seconds: float) -> float:
    """FLOP/s of a `size`^3 float8 matmul with a bf16 output (the second operand column-major, as
    `_scaled_mm` wants it)."""
    a = torch.randn(size, size, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(size, size, device=device).to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=device)

    def run(repetitions: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repetitions):
            torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / repetitions

    run(WARMUP_MATMULS)
    repetitions = max(10, math.ceil(min_seconds / max(run(WARMUP_MATMULS), 1e-9)))
    return 2 * size**3 / run(repetitions)


def measure(report: Report, limit_s: float, machine: Machine) -> None:
    cuda = machine.on_gpu
    device = torch.device("cuda" if cuda else "cpu")
    started = time.monotonic()
    # each size gets a slice of the limit: half for bf16, half for FP8 (where there is FP8)
    peak = measured_matmul_peak(device, min_seconds=min(0.5, limit_s / 20) if cuda else 0.1)
    unit, scale = ("TFLOP/s", 1e12) if cuda else ("GFLOP/s", 1e9)
    report.figure(peak.dtype, peak.flops / scale, unit, f"matmul peak: {peak.describe()}")
    if not cuda:
        report.skip("fp8", "skipped: no FP8 tensor cores on a CPU")
        return
    if missing := machine.lacks(FP8):
        report.skip("fp8", f"skipped: {missing}")
        return
    left = limit_s - (time.monotonic() - started)
    rates = {}
    for size in GPU_MATMUL_SIZES:
        rates[size] = fp8_matmul_rate(size, device, min(0.5, left / 10))
    best = max(rates, key=rates.__getitem__)
    text = ", ".join(f"{n}^3 {r / 1e12:,.0f}" for n, r in rates.items())
    report.figure("fp8", rates[best] / 1e12, "TFLOP/s", f"fp8 matmul peak: {rates[best] / 1e12:,.0f} TFLOP/s ({text})")
