"""The GPU price table ($ per GPU-hour) and matching GPU names to it and to the peak-FLOPs table.

The defaults live in prices.yaml next to this file; `--prices FILE` replaces them and
`--price NAME=USD` adds or overrides single entries, so the table is data, never code.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import yaml

from hf_pretrain.metrics import PEAK_BF16_FLOPS

DEFAULT_PRICES_FILE = Path(__file__).resolve().parent / "prices.yaml"


class PriceError(ValueError):
    """A price table or `--price` argument that does not hold positive dollars per hour."""


def load_prices(path: str | Path | None = None) -> dict[str, float]:
    """`{gpu name: $ per hour}` from a YAML mapping (the shipped table when `path` is None)."""
    path = Path(path) if path is not None else DEFAULT_PRICES_FILE
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise PriceError(f"cannot read the price table {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise PriceError(f"{path} must map GPU names to dollars per hour, e.g. `H100: 2.99`")
    return {str(name): _positive_price(str(name), value, str(path)) for name, value in raw.items()}


def parse_price(text: str) -> tuple[str, float]:
    """`"H100=2.49"` -> `("H100", 2.49)`; the form of `--price`."""
    name, sep, value = text.rpartition("=")
    if not sep or not name.strip():
        raise PriceError(f"--price {text!r} must look like NAME=USD_PER_HOUR, e.g. H100=2.49")
    try:
        number = float(value)
    except ValueError:
        raise PriceError(f"--price {text!r}: {value!r} is not a number of dollars per hour") from None
    return name.strip(), _positive_price(name.strip(), number, "--price")


def price_table(prices_file: str | Path | None = None, extra: Iterable[str] = ()) -> dict[str, float]:
    """The table from `prices_file` (or the shipped one), with `NAME=USD` entries on top."""
    table = load_prices(prices_file)
    table.update(parse_price(text) for text in extra)
    return table


def _positive_price(name: str, value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise PriceError(f"{where}: the price of {name} must be a positive number of dollars per hour, got {value!r}")
    return float(value)


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


def peak_flops_for_name(name: str) -> float | None:
    """Datasheet dense bf16 FLOP/s of a GPU named like a price entry or a CUDA device, or None."""
    key = best_match(name, PEAK_BF16_FLOPS)
    return PEAK_BF16_FLOPS[key] if key else None
