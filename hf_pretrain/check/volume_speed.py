"""Part (e): the volume a checkpoint will be written to (the output_dir's, or its nearest existing
parent's): write a checkpoint's bytes (capped by the part's time and a quarter of the free space),
fsync, then read them back with the page cache dropped for the file (posix_fadvise), so the read is the
disk's and not memory's. The file is the check's own, named for its process, and removed after."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np

from hf_pretrain.check.figures import Report

CHUNK = 64 * 2**20
MAX_BYTES = 8 * 2**30  # more says nothing more of a disk's speed


def existing_parent(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def measure(folder: Path, checkpoint_bytes: int, report: Report, limit_s: float) -> None:
    where = existing_parent(folder)
    free = shutil.disk_usage(where).free
    target = int(min(checkpoint_bytes, MAX_BYTES, free // 4))
    chunk = np.random.default_rng(0).integers(0, 256, size=min(CHUNK, max(target, 1)), dtype=np.uint8).tobytes()
    scratch = where / f".hf_pretrain_check.{os.getpid()}.tmp"
    try:
        written, started = 0, time.perf_counter()
        with scratch.open("wb") as file:
            while written < target and time.perf_counter() - started < 0.4 * limit_s:
                file.write(chunk[: target - written])
                written += min(len(chunk), target - written)
            file.flush()
            os.fsync(file.fileno())
        write_s = time.perf_counter() - started
        write_rate = written / write_s
        seal = checkpoint_bytes / write_rate
        report.figure(
            "write",
            write_rate / 1e6,
            "MB/s",
            f"write: {write_rate / 1e6:,.0f} MB/s in {where} ({written / 1e9:.2f} GB, fsync'd): "
            f"a {checkpoint_bytes / 1e9:.2f} GB checkpoint takes ~{seal:,.1f} s to write",
            bytes=written,
            folder=str(where),
            checkpoint_s=seal,
        )
        fd = os.open(scratch, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the read below is the disk's, not the cache's
            read, started = 0, time.perf_counter()
            while read < written and time.perf_counter() - started < 0.4 * limit_s:
                block = os.read(fd, CHUNK)
                if not block:
                    break
                read += len(block)
            read_rate = read / (time.perf_counter() - started)
        finally:
            os.close(fd)
        report.figure(
            "read",
            read_rate / 1e6,
            "MB/s",
            f"read: {read_rate / 1e6:,.0f} MB/s ({read / 1e9:.2f} GB, page cache dropped): a resume reads "
            f"the checkpoint in ~{checkpoint_bytes / read_rate:,.1f} s",
            bytes=read,
            folder=str(where),
        )
    finally:
        scratch.unlink(missing_ok=True)
