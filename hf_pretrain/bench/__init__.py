"""`hf-pretrain bench`: measure recipe variants with short runs of the real training loop.

    bench_command.py  the command: its flags, parsed into a `BenchRequest` (its modules load after the parse)
    sweep.py     the bench: the recipe as written, the variants asked for, the micro-batch search, the verdict
    variants.py  one variant: a short run in a child process, and what it measured
    measure.py   the matmul peak (several sizes, the largest wins), peak memory, MFU and money (measured for
                 this GPU, estimates for the others); throughput comes from economics/measurements.py
    search.py    the largest micro-batch that fits without gradient checkpointing, each tried on the device
    results.py   the verdict and bench.md

`python -m hf_pretrain.bench` runs the command (each variant's child process runs it too).
"""

from __future__ import annotations

from hf_pretrain.bench.bench_command import main  # its flags; the bench loads after the parse

__all__ = ["main"]
