"""Part (g): all-reduce bandwidth across the GPUs of this machine (NCCL, one process per GPU): the bus
bandwidth of a bf16 all-reduce of a gradient-sized buffer, 2 (n - 1) / n x bytes / seconds, as
nccl-tests reports it. One GPU, or none, has nothing to measure."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import torch

from hf_pretrain.check.figures import Report
from hf_pretrain.machine.run_profile import Machine

BUFFER_BYTES = 512 * 2**20
REPEATS = 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, result: str) -> None:
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    buffer = torch.ones(BUFFER_BYTES // 2, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        dist.all_reduce(buffer)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(REPEATS):
        dist.all_reduce(buffer)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / REPEATS
    if rank == 0:
        Path(result).write_text(str(2 * (world - 1) / world * BUFFER_BYTES / seconds))
    dist.destroy_process_group()


def measure(report: Report, folder: Path, machine: Machine) -> None:
    count = torch.cuda.device_count() if machine.on_gpu else 0
    if count < 2:
        report.skip(
            "all-reduce", f"skipped: {'no GPU' if not count else 'one GPU visible'}, nothing to all-reduce across"
        )
        return
    result = folder / f"all_reduce.{os.getpid()}.txt"
    torch.multiprocessing.spawn(_rank, args=(count, free_port(), str(result)), nprocs=count)
    rate = float(result.read_text())
    report.figure(
        "all-reduce",
        rate / 1e9,
        "GB/s",
        f"all-reduce across {count} GPUs: {rate / 1e9:,.0f} GB/s bus bandwidth (bf16, {BUFFER_BYTES / 2**20:.0f} MiB)",
        gpus=count,
    )
