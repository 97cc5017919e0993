"""What a torch device measures and how it is named: its peak memory, `NVIDIA H100 80GB HBM3 (79 GiB)`,
whether this CPU has bf16 kernels, bytes per exported dtype.

Which device a run uses and in what precision is decided once, in run_profile.py; this room only
describes a device it is handed.
"""

from __future__ import annotations

import os
import platform
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a function asks the machine: `plan` and `stop` never do
    import torch


def cpu_has_bf16_kernels() -> bool:
    """Whether oneDNN has bf16 kernels for this CPU (AVX-512 and later; AMX and AVX512-BF16 do the
    math in hardware). Without them, bf16 autocast on the CPU mostly converts, and runs slower than fp32."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return False


# Bytes per parameter of a weight copy in each export dtype.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def peak_memory_gib(device: torch.device) -> float | None:
    """Peak CUDA memory torch allocated on `device`, or None on the CPU."""
    if device.type != "cuda":
        return None
    import torch

    return torch.cuda.max_memory_allocated(device) / 2**30


def device_name(device: torch.device) -> str:
    """`NVIDIA H100 80GB HBM3 (79 GiB)` or `CPU (x86_64, 16 cores)`: what the bench and the card name."""
    if device.type == "cuda":
        import torch

        props = torch.cuda.get_device_properties(device)
        return f"{props.name} ({props.total_memory / 2**30:.0f} GiB)"
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def describe_hardware(device: torch.device, num_processes: int) -> str:
    """What a run ran on, for the model card: `1 x NVIDIA H200 (140 GiB)` or `2 x CPU (x86_64, 16 cores)`."""
    return f"{num_processes} x {device_name(device)}"
