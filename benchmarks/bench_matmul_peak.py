"""Benchmark: the matmul peak `hf-pretrain bench` measures against a plain timed matmul, in the same run.

On an H100 the old bench read 678 TFLOP/s where a plain 8192^3 bf16 matmul (the shared GPU kit's
`matmul.py`: three warm-up matmuls, twenty timed back to back between two synchronisations) read 778:
it synchronised after every matmul, so each launch gap counted. `bench/measure.py` now warms up,
times a stretch of back-to-back matmuls with CUDA events, over several sizes, the largest rate
winning. This prints both, interleaved over rounds, and their ratio: it should be >= 1.

    python benchmarks/bench_matmul_peak.py              # a GPU: bf16 4096/8192/16384; a CPU: small fp32
    python benchmarks/bench_matmul_peak.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from hf_pretrain.bench.measure import measured_matmul_peak
from hf_pretrain.machine.hardware import device_name


def plain_matmul(device: torch.device, size: int, dtype: torch.dtype, repetitions: int = 20) -> float:
    """FLOP/s the way a person checks a card: warm up, time `repetitions` matmuls between two syncs."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repetitions):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 2 * size**3 * repetitions / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    size, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (1024, torch.float32)
    plain, bench = [], []
    for _ in range(args.rounds):  # interleaved, so a busy machine slows both alike
        plain.append(plain_matmul(device, size, dtype))
        peak = measured_matmul_peak(device)
        bench.append(peak.flops)
    result = {
        "device": device_name(device),
        "torch": torch.__version__,
        "plain_tflops": round(statistics.median(plain) / 1e12, 3),
        "plain_with": f"{str(dtype).removeprefix('torch.')} {size}^3, 20 matmuls between two syncs",
        "bench_tflops": round(statistics.median(bench) / 1e12, 3),
        "bench_with": peak.describe(),
        "bench_over_plain": round(statistics.median(bench) / statistics.median(plain), 3),
    }
    print("RESULT", json.dumps(result))


if __name__ == "__main__":
    main()
