"""A run on 1..N GPUs: data parallelism with one ring all-reduce of the gradients per optimizer step, *not*
overlapped with compute (DDP overlaps part of it with the backward pass, so real runs land between the
compute-only and the total figure). Deliberately simple and pessimistic: it shows the trade, more GPUs buy
time, never money."""

from __future__ import annotations

from dataclasses import dataclass

# Per-GPU, one-direction link rates in Gbit/s: NVLink 4 on H100 SXM (450 GB/s), PCIe 4.0 x16
# (32 GB/s), and a common 100 GbE cloud NIC between nodes.
INTERCONNECT_GBPS = {"nvlink": 3600.0, "pcie": 256.0, "ethernet": 100.0}


def ring_allreduce_seconds(n_gpus: int, payload_bytes: float, gbps: float) -> float:
    """One ring all-reduce: each GPU sends and receives 2(n-1)/n of the payload over its link."""
    if n_gpus <= 1:
        return 0.0
    return 2 * (n_gpus - 1) / n_gpus * payload_bytes / (gbps * 1e9 / 8)


@dataclass(frozen=True)
class ScalingRow:
    """One line of the GPU-count table: data parallelism over `gpus` GPUs."""

    gpus: int
    tokens_per_s: float  # the job's effective rate, communication included
    compute_hours: float
    communication_hours: float
    hours: float
    cost: float | None  # None when no price is known
    cost_vs_one_gpu: float | None  # cost / cost on one GPU


def scaling_row(
    gpus: int,
    tokens: float,
    tokens_per_s_per_gpu: float,
    price_per_gpu_hour: float | None,
    optimizer_steps: int,
    gradient_bytes: float,
    gbps: float,
) -> ScalingRow:
    """Wall time and cost on `gpus` GPUs: compute split evenly, one unoverlapped all-reduce per step."""
    compute = tokens / (gpus * tokens_per_s_per_gpu) / 3600
    communication = optimizer_steps * ring_allreduce_seconds(gpus, gradient_bytes, gbps) / 3600
    hours = compute + communication
    cost = hours * gpus * price_per_gpu_hour if price_per_gpu_hour else None
    one_gpu_cost = tokens / tokens_per_s_per_gpu / 3600 * price_per_gpu_hour if price_per_gpu_hour else None
    return ScalingRow(
        gpus,
        tokens / (hours * 3600),
        compute,
        communication,
        hours,
        cost,
        cost / one_gpu_cost if cost is not None and one_gpu_cost else None,
    )
