"""What moving a run between machines costs in egress: the newest checkpoint a new machine pulls from the
store, and the data it reads (once over the whole run, wherever it trains), at the rate each store's
provider charges (egress.yaml beside this module: the price table of stores, 0 where none is charged)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from hf_pretrain.economics.memory import CHECKPOINT_BYTES_PER_PARAMETER

EGRESS_TABLE_FILE = Path(__file__).with_name("egress.yaml")
UINT16_VOCAB = 2**16  # prepared token files are uint16 below this vocabulary size, else uint32 (data/prepared.py)


@dataclass(frozen=True)
class StoreRate:
    provider: str
    usd_per_gb: float
    source: str


@cache
def egress_rates() -> tuple[StoreRate, ...]:
    raw = yaml.safe_load(EGRESS_TABLE_FILE.read_text())
    return tuple(StoreRate(name, float(entry["usd_per_gb"]), entry["source"]) for name, entry in raw.items())


@dataclass(frozen=True)
class MoveCost:
    """A move in GB, and its dollars per provider: (provider, $ per GB, $ per move, data's $ per billion tokens)."""

    checkpoint_gb: float
    data_gb: float  # the whole run's tokens as prepared (read once over the run)
    data_gb_per_billion_tokens: float
    providers: list[tuple[str, float, float, float]]


def move_cost(parameters: int, tokens: float, vocab_size: int | None) -> MoveCost:
    token_bytes = 2 if vocab_size is not None and vocab_size <= UINT16_VOCAB else 4
    checkpoint_gb = CHECKPOINT_BYTES_PER_PARAMETER * parameters / 1e9
    per_billion = token_bytes  # GB per billion tokens
    rows = [
        (rate.provider, rate.usd_per_gb, rate.usd_per_gb * checkpoint_gb, rate.usd_per_gb * per_billion)
        for rate in egress_rates()
    ]
    return MoveCost(checkpoint_gb, token_bytes * tokens / 1e9, per_billion, rows)
