"""Every offer of SkyPilot's catalog priced by the run's tokens: the card's rate for the recipe (a recorded
measurement, else the performance model: gpu_ranking's row), data parallel over the offer's GPUs, spot's
preemptions priced in (economics/spot.py); ranked by the run's expected dollars. SkyPilot's optimizer ranks by
the hour; this ranks by the token.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from hf_pretrain.economics.egress import StorePlace
from hf_pretrain.economics.planning.data_parallel import INTERCONNECT_GBPS, scaling_row
from hf_pretrain.economics.planning.gpu_ranking import GpuRow
from hf_pretrain.economics.skypilot_catalog import Offer
from hf_pretrain.economics.spot import PreemptionCost, expected_run, preemption_rate


@dataclass(frozen=True)
class SpotAssumptions:
    """What a preemption costs, for every spot offer: the relaunch, the save interval, the store's place, the
    checkpoint pulled; the rate is per cloud (spot.yaml) unless `preemptions_per_hour` sets one for all."""

    relaunch_s: float
    relaunch_source: str  # the run's own measurement, or the estimate's terms
    save_interval_steps: int
    checkpoint_gb: float
    store: StorePlace
    preemptions_per_hour: float | None = None  # None: spot.yaml's rate of each cloud


@dataclass(frozen=True)
class PricedRun:
    """The run every offer is priced for: its tokens (`quality_per_token`: FP8's worth of a bf16 token), its
    optimizer steps and the gradient bytes each all-reduces, its batch, and what a spot preemption costs it."""

    tokens: float
    quality_per_token: float
    optimizer_steps: int
    gradient_bytes: float
    global_batch_tokens: int
    spot: SpotAssumptions


@dataclass(frozen=True)
class OfferRow:
    """One offer of the catalog, priced for the run (expected: spot's preemptions included)."""

    cloud: str
    region: str
    accelerator: str  # the catalog's spelling: what a SkyPilot task asks for
    card: str  # the GPU table's name
    gpus: int
    spot: bool
    price_per_hour: float  # the machine's, all its GPUs
    tokens_per_s: float  # the job's, all its GPUs (communication included)
    measured: str | None  # where the one-GPU rate is a recorded measurement: which
    preemptions_per_hour: float
    preemptions: float  # expected over the run
    hours: float  # expected wall clock
    usd: float  # expected dollars of the run
    usd_per_billion_tokens: float

    @property
    def market(self) -> str:
        return "spot" if self.spot else "on-demand"


@dataclass(frozen=True)
class RankedOffers:
    rows: list[OfferRow]  # the offers the recipe fits, cheapest expected run first
    unfit: dict[str, str]  # card -> why the recipe does not fit it (its offers left out)
    unknown: dict[str, int]  # catalog spelling the GPU table does not know -> its offers (left out, said so)
    machines_of_more_gpus: int = 0  # offers of more GPUs a machine than the task trains on (left out, said so)


def price_offer(offer: Offer, card: GpuRow, run: PricedRun) -> OfferRow:
    """`offer` for `run`, whose one-GPU row on the offer's card is `card` (it fits)."""
    assert card.tokens_per_s is not None and offer.gpu is not None
    tokens, spot = run.tokens, run.spot
    gbps = INTERCONNECT_GBPS[offer.gpu.link]
    scaled = scaling_row(offer.gpus, tokens, card.tokens_per_s, None, run.optimizer_steps, run.gradient_bytes, gbps)
    rate = scaled.tokens_per_s
    work_hours = tokens / run.quality_per_token / rate / 3600
    per_hour = preemption_rate(offer.cloud, spot.preemptions_per_hour).per_hour if offer.spot else 0.0
    cost = PreemptionCost(
        relaunch_s=spot.relaunch_s,
        lost_work_s=spot.save_interval_steps * run.global_batch_tokens / rate / 2,
        egress_usd=spot.store.egress_usd(spot.checkpoint_gb, offer.cloud, offer.region),
    )
    expected = expected_run(work_hours, offer.price_per_hour, per_hour, cost)
    return OfferRow(
        offer.cloud,
        offer.region,
        offer.accelerator,
        offer.card,
        offer.gpus,
        offer.spot,
        offer.price_per_hour,
        rate,
        card.measured,
        per_hour,
        expected.preemptions,
        expected.hours,
        expected.usd,
        expected.usd / (tokens / 1e9) if expected.finishes else math.inf,
    )


def rank_offers(
    offers: tuple[Offer, ...], cards: dict[str, GpuRow], run: PricedRun, gpus_per_machine: int = 1
) -> RankedOffers:
    """Every offer of up to `gpus_per_machine` GPUs on a card the recipe fits (`cards`: the one-GPU row of each
    table card), cheapest expected run first, on-demand before spot at the same dollars; the rest said: cards
    that do not fit, cards unknown, machines of more GPUs. One GPU by default: what the shipped task's run block
    trains on (a machine of eight rented for it would bill eight and use one)."""
    rows, unfit, unknown, bigger = [], {}, Counter(), 0
    for offer in offers:
        if offer.gpus > gpus_per_machine:
            bigger += 1
            continue
        if offer.gpu is None:
            unknown[offer.accelerator] += 1
            continue
        card = cards[offer.gpu.name]
        if not card.fits:
            unfit[card.gpu] = card.reason
            continue
        rows.append(price_offer(offer, card, run))
    rows.sort(key=lambda row: (row.usd, row.spot, row.cloud, row.region))
    return RankedOffers(rows, unfit, dict(unknown.most_common()), bigger)


def task_candidates(rows: list[OfferRow], limit: int) -> list[OfferRow]:
    """The offers a SkyPilot task lists in `resources.ordered`: the cheapest of each (cloud, card, GPU count,
    spot or on-demand), at most `limit`, cheapest first. A candidate names its cloud, not its region: SkyPilot
    takes that cloud's cheapest region with capacity, which is the row's region while it has some, and a
    preempted job's next region (EAGER_NEXT_REGION) stays within the candidates."""
    seen, chosen = set(), []
    for row in rows:
        key = (row.cloud, row.accelerator, row.gpus, row.spot)
        if key in seen or not math.isfinite(row.usd):
            continue
        seen.add(key)
        chosen.append(row)
        if len(chosen) == limit:
            break
    return chosen
