"""The GPU table (gpus.yaml beside this file): each GPU's bf16 (and FP8) peak, measured matmul efficiency,
memory, bandwidth and typical price, with their sources; and how a name finds its entry.

One home for these facts: `run_profile` asks here for a machine's card (its peak: MFU; its compute
capability: FP8), `prices` for the default price list, `performance` and `plan` for everything else.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

GPU_TABLE_FILE = Path(__file__).resolve().parent / "gpus.yaml"
ARCHITECTURES = ("ampere", "ada", "hopper", "blackwell")
LINKS = ("nvlink", "pcie")


@dataclass(frozen=True)
class GPU:
    name: str
    match: tuple[str, ...]  # alternatives, each a set of words a name must hold (see gpus.yaml)
    architecture: str
    bf16_flops: float  # dense tensor-core peak, FLOP/s
    matmul_efficiency: float | None  # measured share of the peak a matmul reaches; None: not published
    compute_capability: float  # FP8 needs fp8's row of precisions.py (8.9) or newer
    fp8_flops: float | None  # dense FP8 tensor-core peak with fp32 accumulate, FLOP/s; None: no FP8
    memory_bytes: int
    bandwidth_bytes_per_s: float
    usd_per_hour: float
    source: str
    skypilot: tuple[str, ...] = ()  # its AcceleratorName spellings in SkyPilot's price catalog
    link: str = "pcie"  # how the cards of one machine exchange gradients (nvlink, pcie)

    def flops_at(self, peak: str) -> float | None:
        """The card's dense peak named `peak` (`bf16`, `fp8`: gpus.yaml's `<peak>_tflops`; a precision's row
        says which it runs at), None where the card has none."""
        return getattr(self, f"{peak}_flops")


def _words(name: str) -> set[str]:
    return {w for w in re.split(r"[^0-9a-z]+", name.lower()) if w}


def best_match(name: str, keys: Iterable[str]) -> str | None:
    """The key all of whose words are words of `name`, the most specific (most words) first.

    `best_match("NVIDIA A100-SXM4-80GB", ["A100 40GB", "A100 80GB"])` is "A100 80GB";
    whole words only, so "L4" never matches "NVIDIA L40S".
    """
    words = _words(name)
    matching = [key for key in keys if _words(key) and _words(key) <= words]
    return max(matching, key=lambda key: len(_words(key)), default=None)


def _gpu(name: str, raw: dict) -> GPU:
    try:
        architecture = str(raw["architecture"])
        if architecture not in ARCHITECTURES:
            raise ValueError(f"architecture {architecture!r} is not one of {', '.join(ARCHITECTURES)}")
        efficiency = raw.get("matmul_efficiency")
        link = str(raw.get("link", "pcie"))
        if link not in LINKS:
            raise ValueError(f"link {link!r} is not one of {', '.join(LINKS)}")
        return GPU(
            name=name,
            match=tuple(str(m) for m in raw.get("match") or [name]),
            architecture=architecture,
            bf16_flops=float(raw["bf16_tflops"]) * 1e12,
            matmul_efficiency=float(efficiency) if efficiency is not None else None,
            compute_capability=float(raw["compute_capability"]),
            fp8_flops=float(raw["fp8_tflops"]) * 1e12 if raw.get("fp8_tflops") is not None else None,
            memory_bytes=int(float(raw["memory_gib"]) * 2**30),
            bandwidth_bytes_per_s=float(raw["bandwidth_gb_s"]) * 1e9,
            usd_per_hour=float(raw["usd_per_hour"]),
            source=str(raw["source"]),
            skypilot=tuple(str(n) for n in raw.get("skypilot") or ()),
            link=link,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{GPU_TABLE_FILE}: the entry {name!r} is malformed ({exc})") from None


@cache
def gpu_table() -> dict[str, GPU]:
    """Every GPU of the shipped table, in its order (fastest first)."""
    raw = yaml.safe_load(GPU_TABLE_FILE.read_text())
    return {str(name): _gpu(str(name), fields) for name, fields in raw.items()}


def find_gpu(name: str) -> GPU | None:
    """The entry a CUDA device name or a `--gpu` argument means, or None.

    An entry's own name matches as written (any case); else its `match` alternatives, the one with
    the most words winning: "NVIDIA H100 PCIe" is the PCIe card, "NVIDIA H100 80GB HBM3" the SXM one.
    """
    table = gpu_table()
    for gpu in table.values():
        if _words(gpu.name) == _words(name):
            return gpu
    alternatives = {alt: gpu for gpu in table.values() for alt in gpu.match}
    key = best_match(name, alternatives)
    return alternatives[key] if key else None


def skypilot_gpu(accelerator: str, instance_type: str = "") -> GPU | None:
    """The entry a SkyPilot catalog row names (its `AcceleratorName`, any case), or None for a card the
    table does not hold. An instance type that says `pcie` is the PCIe card whatever the name says
    (Lambda's `gpu_1x_h100_pcie` is listed as `H100`)."""
    spelled = accelerator.lower()
    matches = [gpu for gpu in gpu_table().values() if spelled in (n.lower() for n in gpu.skypilot)]
    if "pcie" in _words(instance_type):
        pcie = [gpu for gpu in gpu_table().values() if gpu.architecture == matches[0].architecture] if matches else []
        matches = [gpu for gpu in pcie if "pcie" in _words(gpu.name)] or matches
    return matches[0] if matches else None


def known_names() -> str:
    return ", ".join(gpu_table())


def gpu_named(name: str) -> GPU:
    """`find_gpu`, refusing a name the table does not know with the names it does."""
    gpu = find_gpu(name)
    if gpu is None:
        raise ValueError(f"unknown GPU {name!r}: the table knows {known_names()} (or --gpu all)")
    return gpu
