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
    cloud: str | None = None  # the GPU cloud it belongs to (SkyPilot's name), None for a store of no GPU cloud


@cache
def egress_rates() -> tuple[StoreRate, ...]:
    raw = yaml.safe_load(EGRESS_TABLE_FILE.read_text())
    return tuple(
        StoreRate(name, float(entry["usd_per_gb"]), entry["source"], entry.get("cloud")) for name, entry in raw.items()
    )


@dataclass(frozen=True)
class StorePlace:
    """Where a run's store is: its provider's egress rate, and the region where it sits (None: unknown)."""

    rate: StoreRate
    region: str | None = None

    def egress_usd(self, gigabytes: float, cloud: str, region: str) -> float:
        """What reading `gigabytes` out of the store costs a machine in `cloud`'s `region`: nothing in the
        store's own cloud and region (or from a store without egress fees), its provider's rate otherwise."""
        if self.rate.cloud == cloud and self.region is not None and self.region == region:
            return 0.0
        return gigabytes * self.rate.usd_per_gb

    def describe(self) -> str:
        return f"{self.rate.provider}" + (f" in {self.region}" if self.region else " (region not given)")


def store_place(spec: str) -> StorePlace:
    """`--store PROVIDER[:REGION]` (a provider of egress.yaml, e.g. `aws_s3:us-east-1`, `cloudflare_r2`)."""
    provider, _, region = spec.partition(":")
    rates = {rate.provider: rate for rate in egress_rates()}
    if provider not in rates:
        raise ValueError(f"--store {spec!r}: no store {provider!r}; one of {', '.join(rates)} (e.g. aws_s3:us-east-1)")
    return StorePlace(rates[provider], region or None)


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
