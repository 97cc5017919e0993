"""What a bench measures: the matmul peak, peak memory, MFU and money (throughput from metrics records:\neconomics/measurements.py)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hf_pretrain.economics.cost import dollars_per_billion_tokens
from hf_pretrain.economics.performance import modelled_tokens_per_s
from hf_pretrain.economics.workload import Workload
from hf_pretrain.machine.gpus import GPU, find_gpu

if TYPE_CHECKING:
    from hf_pretrain.bench.variants import VariantResult


# The matmul peak, measured as a benchmark: several sizes (the largest rate wins: small ones are
# launch-bound, and which size a card's kernels like best differs), a warm-up for each (kernel
# selection, clocks), then enough repetitions to fill `min_seconds`, timed as one stretch (CUDA
# events on a GPU: no synchronisation between the matmuls, which would add the launch gaps back).
GPU_MATMUL_SIZES = (4096, 8192, 16384)
CPU_MATMUL_SIZES = (256, 512, 1024)  # the CPU runs small: a CPU figure, for MFU on the CPU only
WARMUP_MATMULS = 3
MIN_REPETITIONS = 10


def seconds_per_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, repetitions: int) -> float:
    """Seconds of one `a @ b`, averaged over `repetitions` launched back to back."""
    if a.device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repetitions):
            torch.matmul(a, b, out=out)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / repetitions
    begin = time.perf_counter()
    for _ in range(repetitions):
        torch.matmul(a, b, out=out)
    return (time.perf_counter() - begin) / repetitions


def matmul_rate(size: int, dtype: torch.dtype, device: torch.device, min_seconds: float) -> float:
    """FLOP/s of a `size`^3 matmul in `dtype` on `device`, after a warm-up."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    out = torch.empty_like(a)
    seconds_per_matmul(a, b, out, WARMUP_MATMULS)
    first_guess = seconds_per_matmul(a, b, out, WARMUP_MATMULS)
    repetitions = max(MIN_REPETITIONS, math.ceil(min_seconds / max(first_guess, 1e-9)))
    rate = 2 * size**3 / seconds_per_matmul(a, b, out, repetitions)
    del a, b, out
    return rate


def fits_on_device(size: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether three `size`^2 matrices fit in the device's free memory, with room to spare."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return 4 * size * size * dtype.itemsize < free


@dataclass(frozen=True)
class MatmulPeak:
    flops: float  # the largest rate of the sizes tried
    dtype: str
    rates: dict[int, float]  # size -> FLOP/s
    on_cpu: bool

    def describe(self) -> str:
        """`bf16 matmul at 4096^3, 8192^3, 16384^3: 640, 778, 760 TFLOP/s; the largest wins (8192^3)`."""
        unit, scale = ("GFLOP/s", 1e9) if self.on_cpu else ("TFLOP/s", 1e12)
        best = max(self.rates, key=self.rates.__getitem__)
        text = (
            f"{self.dtype} matmul at {', '.join(f'{n}^3' for n in self.rates)}: "
            f"{', '.join(f'{r / scale:,.0f}' for r in self.rates.values())} {unit}; the largest wins ({best}^3)"
        )
        return f"a CPU figure, nothing to do with a GPU's: {text}" if self.on_cpu else text


def measured_matmul_peak(
    device: torch.device,
    sizes: tuple[int, ...] | None = None,
    min_seconds: float | None = None,
    rate_of: Callable[[int, torch.dtype, torch.device, float], float] = matmul_rate,
) -> MatmulPeak:
    """The matmul peak of `device`: bf16 on a GPU (the training precision), fp32 on the CPU; each of
    `sizes` that fits is measured, the largest rate wins (module comment above)."""
    on_cpu = device.type != "cuda"
    dtype = torch.float32 if on_cpu else torch.bfloat16
    sizes = sizes or (CPU_MATMUL_SIZES if on_cpu else GPU_MATMUL_SIZES)
    seconds = min_seconds if min_seconds is not None else (0.1 if on_cpu else 0.5)
    rates = {n: rate_of(n, dtype, device, seconds) for n in sizes if fits_on_device(n, dtype, device)}
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return MatmulPeak(max(rates.values()), str(dtype).removeprefix("torch."), rates, on_cpu)


def add_mfu(result: VariantResult, datasheet_peak: float | None, measured_peak: float) -> None:
    if result.tokens_per_s is None or result.flops_per_token is None:
        return
    achieved = result.tokens_per_s * result.flops_per_token
    result.mfu = achieved / datasheet_peak if datasheet_peak else None
    result.mfu_measured_peak = achieved / measured_peak


def estimated_rates(
    work: Workload, measured_tokens_per_s: float, this_gpu: GPU, names: list[str]
) -> tuple[float, dict[str, float]]:
    """(measured / modelled on this GPU, {price entry: tokens/s}) for the GPUs of the table among `names`
    other than this one: the performance model's figure of `work` for each, scaled by this card's ratio.
    Estimates: only this card was measured."""
    ratio = measured_tokens_per_s / modelled_tokens_per_s(work, this_gpu)
    rates = {}
    for name in names:
        gpu = find_gpu(name)
        if gpu is not None and gpu.name != this_gpu.name:
            rates[name] = modelled_tokens_per_s(work, gpu) * ratio
    return ratio, rates


def add_money(
    result: VariantResult, work: Workload, this_gpu: GPU | None, price_entry: str | None, prices: dict[str, float]
) -> None:
    """$ per billion tokens: measured for this GPU's price entry only; for the table's other GPUs, the
    model's estimate for the variant's workload (`work`) scaled by what this card measured against its own
    model. A CPU, or a GPU the table does not know, prices nothing it did not run on."""
    if result.tokens_per_s is None:
        return
    if price_entry is not None:
        result.usd_per_billion_tokens = {
            price_entry: dollars_per_billion_tokens(result.tokens_per_s, prices[price_entry])
        }
    if this_gpu is not None:
        others = [name for name in prices if name != price_entry]
        result.measured_to_modelled, rates = estimated_rates(work, result.tokens_per_s, this_gpu, others)
        result.usd_per_billion_tokens_estimated = {
            name: dollars_per_billion_tokens(rate, prices[name]) for name, rate in rates.items()
        }
