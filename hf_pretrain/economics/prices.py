"""The GPU price table ($ per GPU-hour); `gpus.find_gpu` / `gpus.best_match` find a GPU's entry in it.

The defaults are the `usd_per_hour` of the GPU table (gpus.yaml next to this file); `--prices FILE`
(a YAML mapping of GPU names to dollars per hour) replaces them and `--price NAME=USD` adds or
overrides single entries, so the table is data, never code.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from pathlib import Path

import yaml

from hf_pretrain.machine.gpus import GPU_TABLE_FILE, find_gpu, gpu_table


class PriceError(ValueError):
    """A price table or `--price` argument that does not hold positive dollars per hour."""


def load_prices(path: str | Path | None = None) -> dict[str, float]:
    """`{gpu name: $ per hour}` from a YAML mapping (the GPU table's typical prices when `path` is None)."""
    if path is None:
        return {name: gpu.usd_per_hour for name, gpu in gpu_table().items()}
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise PriceError(f"cannot read the price table {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise PriceError(f"{path} must map GPU names to dollars per hour, e.g. `H100: 2.99`")
    return {str(name): _positive_price(str(name), value, str(path)) for name, value in raw.items()}


def table_gpu_prices(path: str | Path) -> dict[str, float]:
    """`{GPU table name: $ per hour}` from a price file every name of which is a GPU of the table (as
    `--gpu` reads it: its name or one of its `match` names). An unknown name is refused, naming the
    nearest known ones: dropped, the plan would price that GPU at the table's typical rate instead."""
    prices = {}
    for name, price in load_prices(path).items():
        gpu = find_gpu(name)
        if gpu is None:
            raise PriceError(f"{path}: no GPU `{name}` in the GPU table; {nearest_gpu_names(name)}")
        prices[gpu.name] = price
    return prices


def nearest_gpu_names(name: str) -> str:
    """ "did you mean ...": the table's GPU names nearest to `name` (all of them when none is near)."""
    table = gpu_table()
    spellings = {spelling.lower(): gpu.name for gpu in table.values() for spelling in (gpu.name, *gpu.match)}
    close = difflib.get_close_matches(name.lower(), spellings, n=6, cutoff=0.4)
    names = list(dict.fromkeys(spellings[spelling] for spelling in close))[:3]
    if names:
        return f"did you mean {' or '.join(f'`{n}`' for n in names)}? (every GPU: {GPU_TABLE_FILE.name})"
    return f"the GPUs it knows: {', '.join(table)} ({GPU_TABLE_FILE.name})"


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
    # NaN and infinity are numbers that price nothing: a row priced `nan` ranked as if it were free
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise PriceError(f"{where}: the price of {name} must be a positive number of dollars per hour, got {value!r}")
    return float(value)
