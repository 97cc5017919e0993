"""`hf-pretrain bench`: measure recipe variants with short runs of the real training loop.

    command.py   the command: its flags, parsed into a `BenchRequest`
    sweep.py     the bench: the recipe as written, the variants asked for, the micro-batch search, the verdict
    variants.py  one variant: a short run in a child process, and what it measured
    measure.py   the matmul peak (several sizes, the largest wins), peak memory, MFU and money (measured for
                 this GPU, estimates for the others); throughput comes from economics/measurements.py
    search.py    the largest micro-batch that fits without gradient checkpointing, each tried on the device
    report.py    the verdict and bench.md

`python -m hf_pretrain.bench` runs the command (each variant's child process runs it too).
"""

from __future__ import annotations

import importlib

# Imported on first use: `hf-pretrain check` runs bench's matmul measurement (measure.py) in a fresh process
# per part, which should not pay for the whole command (the data pipeline, transformers) to import it.
_EXPORTS = {
    "main": "hf_pretrain.bench.benchmark",
    "largest_fitting": "hf_pretrain.bench.search",
    "variant_grid": "hf_pretrain.bench.variants",
    "timed_throughput": "hf_pretrain.economics.measurements",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
