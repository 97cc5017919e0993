"""The checksums of a checkpoint's files: computed as the bytes are written, checked at the disk's speed.

A save hashes each byte once, on its way to the disk (`ChecksummedFile`), never by reading the file
back; a resume reads each file once, in large blocks. The checksum is XXH3-128 (xxhash, which
`datasets` ships): ~19 GB/s on one core of the machine that measured it, where SHA-256 did 0.8 GB/s
and was the slowest part of a save and of a resume (docs/benchmarks.md). It detects corruption (a
torn write, a flipped bit); it is no signature, which a checkpoint never had. Manifests written
before say `sha256` and still verify (`CHECKSUM_OF_OLD_MANIFESTS`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import xxhash

from hf_pretrain.checkpoints.progress import ByteCount

ALGORITHM = "xxh3_128"  # what a new manifest records
CHECKSUM_OF_OLD_MANIFESTS = "sha256"  # manifests that name no algorithm (format_version 1)
READ_BLOCK = 16 << 20  # bytes read at a time when a file is checked
WRITE_BLOCK = 64 << 20  # bytes handed to the disk (and counted) at a time
# Dirty pages flushed every so often while writing: the rate shown is the disk's, not the page cache's,
# and the final flush (the seal's) has little left to do.
FLUSH_EVERY = 512 << 20


def new_checksum(algorithm: str = ALGORITHM) -> Any:
    if algorithm == "xxh3_128":
        return xxhash.xxh3_128()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown checksum {algorithm!r}")


def file_checksum(path: Path, algorithm: str = ALGORITHM, count: ByteCount | None = None) -> str:
    """The checksum of a file, read once in large blocks; `count` gets the bytes as they are read."""
    digest = new_checksum(algorithm)
    block = bytearray(READ_BLOCK)
    view = memoryview(block)
    with path.open("rb", buffering=0) as f:
        while n := f.readinto(block):
            digest.update(view[:n])
            if count is not None:
                count.add(n)
    return digest.hexdigest()


class ChecksummedFile:
    """A file opened for writing that checksums what goes through `write`, counts it into `count`,
    and flushes it to the disk every `FLUSH_EVERY` bytes and when closed. `torch.save` writes into it
    as into any file; `checksum` is set once it is closed."""

    def __init__(self, path: Path, count: ByteCount | None = None, algorithm: str = ALGORITHM):
        self.path, self.count = path, count
        self._file = path.open("wb", buffering=0)
        self._digest = new_checksum(algorithm)
        self._unflushed = 0
        self.checksum: str | None = None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), WRITE_BLOCK):
            block = view[start : start + WRITE_BLOCK]
            written = 0
            while written < len(block):  # a raw write may take less than it was given
                written += self._file.write(block[written:])
            self._digest.update(block)
            self._unflushed += len(block)
            if self.count is not None:
                self.count.add(len(block))
            if self._unflushed >= FLUSH_EVERY:
                os.fdatasync(self._file.fileno())
                self._unflushed = 0
        return len(view)

    def flush(self) -> None:  # torch.save flushes when it is done: the data is on disk at `close`
        pass

    def close(self) -> str:
        if self.checksum is None:
            os.fsync(self._file.fileno())
            self._file.close()
            self.checksum = self._digest.hexdigest()
        return self.checksum

    def __enter__(self) -> ChecksummedFile:
        return self

    def __exit__(self, exc_type, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._file.close()
