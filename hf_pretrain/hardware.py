"""The one home of what depends on the machine: precision, device names, peak memory; a device's peak
FLOPs come from the GPU table (economics/gpus.yaml).

Every other module asks here instead of deciding again, so training, the doctor, the memory and
disk estimates, evaluation and the benchmarks always agree on what `mixed_precision: auto` means
on this machine and on which GPU a name refers to.
"""

from __future__ import annotations

import os
import platform
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a function asks the machine: `plan` and `stop` never do
    import torch

from hf_pretrain.economics.gpus import find_gpu


def cuda_bf16_available() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def training_precision(requested: str, cuda_available: bool | None = None, bf16_supported: bool | None = None) -> str:
    """Accelerate's `mixed_precision` for the recipe's value: `auto` is bf16 on a GPU that supports
    it and full fp32 (`no`) elsewhere; an explicit `no`/`bf16`/`fp16` is kept as asked.

    `cuda_available`/`bf16_supported` default to this machine; the doctor passes them to ask "what
    would a run do on the GPU it will rent".
    """
    if requested != "auto":
        return requested
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    cuda = cuda_available
    bf16 = (cuda_bf16_available() if bf16_supported is None else bf16_supported) if cuda else False
    return "bf16" if cuda and bf16 else "no"


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


def inference_device_and_dtype() -> tuple[str, torch.dtype]:
    """Where and in what dtype to run a model for evaluation: a GPU in bf16 (fp16 where bf16 is
    missing, fine for inference), else the CPU in fp32."""
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return "cpu", torch.float32


def peak_flops_for_name(name: str) -> float | None:
    """Datasheet dense bf16 FLOP/s of a GPU named like a table entry or a CUDA device, or None
    (the figures live in economics/gpus.yaml)."""
    gpu = find_gpu(name)
    return gpu.bf16_flops if gpu else None


def device_peak_flops(device: torch.device) -> float | None:
    """The bf16 peak of a known CUDA device, or None (CPU, unknown GPU): then no MFU is shown."""
    if device.type != "cuda":
        return None
    import torch

    return peak_flops_for_name(torch.cuda.get_device_name(device))


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
