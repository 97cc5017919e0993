"""What a run reports: tokens/s, MFU, memory, and the metrics.jsonl / samples.jsonl files."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import torch

# Dense bf16 tensor-core peaks (FLOP/s, no sparsity) from the vendors' data sheets.
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 70e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
}


def device_peak_flops(device: torch.device) -> float | None:
    """The bf16 peak of a known CUDA device, or None (CPU, unknown GPU): then no MFU is shown."""
    if device.type != "cuda":
        return None
    # imported here: prices.py builds on this module's table, and matches whole words, so
    # "NVIDIA L40S" is never taken for an L4 nor "NVIDIA H100 80GB HBM3" missed
    from hf_pretrain.prices import peak_flops_for_name

    return peak_flops_for_name(torch.cuda.get_device_name(device))


def peak_memory_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


class ThroughputMeter:
    """Tokens/s and MFU over the window since the last `read`, for the whole job (all processes)."""

    def __init__(self, flops_per_token: float, peak_flops_per_process: float | None, num_processes: int):
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops_per_process * num_processes if peak_flops_per_process else None
        self.window_start = time.perf_counter()
        self.window_tokens = 0

    def add(self, tokens: int) -> None:
        self.window_tokens += tokens

    def pause(self) -> float:
        """Time since the last read; used to leave evaluation and checkpoints out of the rate."""
        return time.perf_counter() - self.window_start

    def skip(self, seconds: float) -> None:
        self.window_start += seconds

    def read(self) -> tuple[float, float | None]:
        now = time.perf_counter()
        seconds = max(now - self.window_start, 1e-9)
        tokens_per_s = self.window_tokens / seconds
        mfu = tokens_per_s * self.flops_per_token / self.peak_flops if self.peak_flops else None
        self.window_start, self.window_tokens = now, 0
        return tokens_per_s, mfu


class JsonlWriter:
    """Appends one JSON record per line; only the main process writes."""

    def __init__(self, path: Path, enabled: bool):
        self.path = path
        self.enabled = enabled

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_jsonl(path: Path, after_step: int) -> None:
    """Drop records past `after_step`: a resumed run rewrites them, so the file stays one clean curve."""
    records = read_jsonl(path)
    kept = [r for r in records if r.get("step", 0) <= after_step]
    if len(kept) != len(records):
        path.write_text("".join(json.dumps(r) + "\n" for r in kept))


def trackers_for(report_to: str) -> list[str]:
    """Accelerate tracker names for the recipe's `report_to`; a requested one must be installed."""
    wanted = {"none": [], "tensorboard": ["tensorboard"], "wandb": ["wandb"], "all": ["tensorboard", "wandb"]}[report_to]
    for name in wanted:
        module = "tensorboard" if name == "tensorboard" else "wandb"
        if importlib.util.find_spec(module) is None:
            raise RuntimeError(f"report_to={report_to} needs `{module}`: pip install {module}")
    return wanted
