"""Throughput (tokens/s, MFU) over a logging window, and the trackers a run reports to."""

from __future__ import annotations

import importlib.util
import time


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


def trackers_for(report_to: str) -> list[str]:
    """Accelerate tracker names for the recipe's `report_to`; a requested one must be installed."""
    wanted = {"none": [], "tensorboard": ["tensorboard"], "wandb": ["wandb"], "all": ["tensorboard", "wandb"]}[report_to]
    for name in wanted:
        module = "tensorboard" if name == "tensorboard" else "wandb"
        if importlib.util.find_spec(module) is None:
            raise RuntimeError(f"report_to={report_to} needs `{module}`: pip install {module}")
    return wanted
