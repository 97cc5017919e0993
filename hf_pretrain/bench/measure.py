"""What a bench measures: throughput from metrics records, the matmul peak, peak memory, MFU and money."""

from __future__ import annotations

import resource
import sys
import time
from typing import TYPE_CHECKING, Any

import torch

from hf_pretrain.economics.cost import dollars_per_billion_tokens
from hf_pretrain.hardware import peak_memory_gib

if TYPE_CHECKING:
    from hf_pretrain.bench.variants import VariantResult


def timed_throughput(records: list[dict[str, Any]], warmup: int) -> tuple[float, float, float | None] | None:
    """(tokens/s, seconds per step, data-wait share) over the logged steps after `warmup`.

    Each train record's window runs from the previous record, so its seconds are the tokens it
    added over its rate; the data-wait share is weighted by those seconds.
    """
    train = [r for r in records if r.get("kind") == "train"]
    tokens = seconds = waited = 0.0
    steps, has_wait = 0, True
    previous = None
    for record in train:
        if previous is not None and record["step"] > warmup:
            window_tokens = record["tokens"] - previous["tokens"]
            window_seconds = window_tokens / record["tokens_per_s"]
            tokens += window_tokens
            seconds += window_seconds
            steps += record["step"] - previous["step"]
            if "data_wait_share" in record:
                waited += record["data_wait_share"] * window_seconds
            else:
                has_wait = False
        previous = record
    if not steps:
        return None
    return tokens / seconds, seconds / steps, (waited / seconds if has_wait else None)


def measured_matmul_flops(device: torch.device, min_seconds: float = 0.5) -> tuple[float, str]:
    """FLOP/s of a large square matmul: bf16 on a GPU (the training precision), fp32 on the CPU."""
    size, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (2048, torch.float32)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    torch.matmul(a, b)  # warm-up: kernel selection, thread pools
    sync()
    count, start = 0, time.perf_counter()
    while count < 3 or time.perf_counter() - start < min_seconds:
        torch.matmul(a, b)
        count += 1
        sync()
    flops = 2 * size**3 * count / (time.perf_counter() - start)
    del a, b
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return flops, f"{str(dtype).removeprefix('torch.')} {size}x{size} matmul"


def process_peak_memory_gib(device: torch.device) -> float:
    """This process's peak: CUDA memory allocated by torch, or resident set size on the CPU (where
    nothing runs out of memory, so the RSS is what a budget is held against)."""
    cuda_peak = peak_memory_gib(device)
    if cuda_peak is not None:
        return cuda_peak
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / 2**30 if sys.platform == "darwin" else rss / 2**20


def add_money_and_mfu(
    result: VariantResult, datasheet_peak: float | None, measured_peak: float, prices: dict[str, float]
) -> None:
    if result.tokens_per_s is None or result.flops_per_token is None:
        return
    achieved = result.tokens_per_s * result.flops_per_token
    result.mfu = achieved / datasheet_peak if datasheet_peak else None
    result.mfu_measured_peak = achieved / measured_peak
    result.usd_per_billion_tokens = {
        name: dollars_per_billion_tokens(result.tokens_per_s, price) for name, price in prices.items()
    }
