"""The training mixture: which source, and which of its samples, each position of the stream reads.

A pure function of (seed, position, the weights' segments), so a resumed run, or the same run on
another number of processes, reads the same samples; no state is saved for it.

- A segment is a run of positions under one set of weights: the main weights from position 0, the
  decay weights from the first position of a wsd decay or a cooldown (`segments_for`).
- Inside a segment, positions come in blocks of BLOCK; each block gives source s the same number of
  slots, `BLOCK * w_s` rounded by largest remainder, spread evenly through the block (slot k of s
  at (k + 1/2) / n_s of the way), so any window of the stream follows the weights within a sample
  or two per source, from the first step on.
- Each source reads its own samples in order of its own permutation, a fresh one per epoch
  (`perm(N_s, seed + epoch + s * SOURCE_SEED_STRIDE)`): a source's k-th draw is its k-th sample,
  whatever segment it was drawn in. With one source this is exactly the single-stream order
  (position p -> sample perm_{p // N}[p % N], perm_e = randperm(N, seed + e)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

BLOCK = 1 << 16
# Sources' permutation seeds lie this far apart, so no two sources share one in any plausible epoch.
SOURCE_SEED_STRIDE = 1_000_003


def normalise(weights: list[float]) -> list[float]:
    total = sum(weights)
    return [w / total for w in weights]


def block_counts(weights: list[float], block: int = BLOCK) -> list[int]:
    """Slots per source in a block: largest remainder of block * weight (ties to the earlier source);
    a source with a positive weight gets at least one slot."""
    quotas = [w * block for w in normalise(weights)]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda s: (-(quotas[s] - counts[s]), s))
    for s in by_remainder[: block - sum(counts)]:
        counts[s] += 1
    for s, w in enumerate(weights):  # a tiny weight still draws (and takes a slot from the largest)
        if w > 0 and counts[s] == 0:
            counts[s] = 1
            counts[counts.index(max(counts))] -= 1
    return counts


@dataclass
class Segment:
    """Positions from `start` on, under `weights`; `before[s]`: source s's draws before `start`."""

    start: int
    weights: list[float]
    before: list[int]
    block: int = BLOCK
    counts: list[int] = field(init=False)
    slot_source: np.ndarray = field(init=False, repr=False)  # per slot of a block: its source
    slot_rank: np.ndarray = field(init=False, repr=False)  # per slot: its source's draws before it in the block

    def __post_init__(self) -> None:
        self.counts = block_counts(self.weights, self.block)
        sources = np.concatenate([np.full(n, s, dtype=np.int64) for s, n in enumerate(self.counts)])
        ranks = np.concatenate([np.arange(n, dtype=np.int64) for n in self.counts])
        keys = np.concatenate([(np.arange(n) + 0.5) / n for n in self.counts if n])
        order = np.lexsort((sources, keys))  # by key, ties by source: the same on every machine
        self.slot_source, self.slot_rank = sources[order], ranks[order]

    def draws_before(self, position: int) -> list[int]:
        """Each source's draws before `position` (>= start), this segment's and earlier ones."""
        blocks, offset = divmod(position - self.start, self.block)
        partial = np.bincount(self.slot_source[:offset], minlength=len(self.counts))
        return [b + blocks * n + int(p) for b, n, p in zip(self.before, self.counts, partial, strict=True)]

    def draw(self, position: int) -> tuple[int, int]:
        blocks, offset = divmod(position - self.start, self.block)
        source = int(self.slot_source[offset])
        return source, self.before[source] + blocks * self.counts[source] + int(self.slot_rank[offset])


class Mixture:
    """position -> (source, sample of that source), for sources of `samples[s]` samples each."""

    def __init__(
        self, samples: list[int], seed: int, segments: list[tuple[int, list[float]]], block: int = BLOCK
    ) -> None:
        if len(segments) == 0 or segments[0][0] != 0:
            raise ValueError("the first segment of a mixture starts at position 0")
        self.samples, self.seed = samples, seed
        self.segments: list[Segment] = []
        for start, weights in segments:
            if len(weights) != len(samples):
                raise ValueError(f"{len(weights)} weights for {len(samples)} sources")
            before = self.segments[-1].draws_before(start) if self.segments else [0] * len(samples)
            self.segments.append(Segment(start, weights, before, block))
        self._permutations: dict[int, tuple[int, torch.Tensor]] = {}

    def _segment(self, position: int) -> Segment:
        for segment in reversed(self.segments):
            if position >= segment.start:
                return segment
        raise ValueError(f"position {position} is negative")

    def draws_before(self, position: int) -> list[int]:
        """Samples drawn from each source by the positions before `position`."""
        return self._segment(position).draws_before(position)

    def epochs_before(self, position: int) -> list[float]:
        """Passes over each source made by the positions before `position`."""
        return [d / n for d, n in zip(self.draws_before(position), self.samples, strict=True)]

    def source_and_draw(self, position: int) -> tuple[int, int]:
        return self._segment(position).draw(position)

    def __call__(self, position: int) -> tuple[int, int]:
        """(source, sample index in that source) read at `position`."""
        source, draw = self.source_and_draw(position)
        epoch, offset = divmod(draw, self.samples[source])
        cached = self._permutations.get(source)
        if cached is None or cached[0] != epoch:  # a source's draws only grow: one cached epoch each
            generator = torch.Generator().manual_seed(self.seed + epoch + source * SOURCE_SEED_STRIDE)
            cached = (epoch, torch.randperm(self.samples[source], generator=generator))
            self._permutations[source] = cached
        return source, int(cached[1][offset])
