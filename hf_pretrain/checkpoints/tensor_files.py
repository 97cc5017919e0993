"""The two kinds of file Accelerate writes a training state into, written here in one pass: every byte
checksummed and counted as it goes to the disk (checkpoints/checksum.py).

- safetensors (the weights): the same bytes as `safetensors.torch.save_file` (the header: the
  tensors sorted by dtype, widest first, then by name; JSON without spaces, padded to 8 bytes),
  held equal by a test; a dtype this file does not know goes through `save_file` and is read back.
- torch.save (the optimizer state): `torch.save` into a `ChecksummedFile`, the zip archive it writes
  into a path (its records named `archive/`), without the CRC-32 of each record: torch computes it on
  one thread at ~0.9 GB/s (measured: slower than the disk, 9 s for the 1b's 8.3 GB of AdamW moments),
  `torch.load` does not check it, and the file's XXH3 in the manifest covers every byte.

Tensors may live on the GPU: each is copied to the host as it is written (the last save of a run,
which stages nothing).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch

from hf_pretrain.checkpoints.checksum import ChecksummedFile, file_checksum
from hf_pretrain.checkpoints.progress import ByteCount

# safetensors' dtypes in the order of its Rust enum (the header sorts by it, descending), as torch names them
SAFETENSORS_DTYPES = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.float8_e5m2: "F8_E5M2",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.int16: "I16",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int64: "I64",
}
_RANK = {name: i for i, name in enumerate(SAFETENSORS_DTYPES.values())}


def tensor_bytes(obj: Any) -> int:
    """The bytes of every tensor in `obj` (dicts, lists, tuples): about what writing it takes."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def write_safetensors(
    tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str], count: ByteCount | None = None
) -> str:
    """Write `tensors` as `save_file(tensors, path, metadata)` would; returns the file's checksum."""
    if any(t.dtype not in SAFETENSORS_DTYPES or not t.is_contiguous() for t in tensors.values()):
        from safetensors.torch import save_file

        save_file(tensors, path, metadata=metadata)  # its own checks and messages; then read once
        return file_checksum(path, count=count)
    order = sorted(tensors, key=lambda name: (-_RANK[SAFETENSORS_DTYPES[tensors[name].dtype]], name))
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name in order:
        t = tensors[name]
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    with ChecksummedFile(path, count) as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name in order:
            t = tensors[name].detach()
            if t.numel():
                f.write(t.cpu().reshape(-1).view(torch.uint8).numpy())
    return f.checksum


def write_torch(obj: Any, path: Path, count: ByteCount | None = None) -> str:
    """`torch.save(obj, path)`, checksummed as written, no CRC-32 records; returns the file's checksum."""
    from torch.serialization import get_crc32_options, set_crc32_options

    crc32 = get_crc32_options()  # a process-wide option: another thread's save meanwhile may skip it too
    set_crc32_options(False)
    try:
        with ChecksummedFile(path, count) as f:
            torch.save(obj, f)
    finally:
        set_crc32_options(crc32)
    return f.checksum
