"""What this pod costs an hour, for the check's $ per token: `--price_per_hour` where given; else the price the
plan rented it at, where the engine says which offer this is (a SkyPilot task written by `plan --skypilot_task`
carries its candidates' prices in `PLANNED_PRICES`, and SkyPilot tells the pod its cloud and region in
`SKYPILOT_CLUSTER_INFO`); else the GPU table's typical price. Each answer says where it comes from."""

from __future__ import annotations

import json
import os

from hf_pretrain.engines.skypilot_task import PLANNED_PRICES, planned_prices

CLUSTER_INFO = "SKYPILOT_CLUSTER_INFO"  # SkyPilot's JSON of the machine: cloud, region, zone


def engine_price(card_spellings: tuple[str, ...], environ: dict[str, str] | None = None) -> tuple[float, str] | None:
    """The plan's price of this pod (its cloud from SkyPilot, its card by any of its catalog spellings), and where
    it comes from; None where the engine does not say. SkyPilot does not tell a spot machine from an on-demand
    one: where the plan listed both on this cloud and card, the spot price (the lower), said so."""
    environ = os.environ if environ is None else environ
    try:
        cloud = str(json.loads(environ.get(CLUSTER_INFO) or "{}").get("cloud") or "").lower()
    except (ValueError, AttributeError):
        return None
    spellings = {s.lower() for s in card_spellings}
    matching = [
        p
        for p in planned_prices(environ.get(PLANNED_PRICES, ""))
        if p.cloud == cloud and p.accelerator.lower() in spellings
    ]
    if not cloud or not matching:
        return None
    best = min(matching, key=lambda p: p.usd_per_hour)
    market = "spot" if best.spot else "on-demand"
    both = " (spot or on-demand not told by SkyPilot: the lower)" if len({p.spot for p in matching}) > 1 else ""
    return best.usd_per_hour, f"the plan's {market} price on {cloud}{both}"
