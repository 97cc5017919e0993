"""The largest micro-batch that fits without gradient checkpointing.

Doubling from the recipe's micro_batch_size until a probe fails, then bisecting. A probe is a
two-step run in a child process, tried on the device whatever the memory estimate says (the
preflight only warns in a probe): it fails when the device runs out of memory, the error being
the answer, or when its peak memory exceeds the budget (on the CPU, where nothing runs out, the
budget is the only limit and the peak is the process's peak RSS). Only micro-batches that divide
the recipe's batch are tried, since a larger one would change the global batch, not just its speed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_pretrain.bench.variants import RunResult, run_in_child
from hf_pretrain.config import Recipe, build_recipe

# Optimizer steps of a micro-batch probe: the second step is the first with AdamW's moments
# allocated, so it holds the true peak.
PROBE_STEPS = 2
# The worker status that means "does not fit" rather than "broken": the device ran out of memory.
OUT_OF_MEMORY = "oom"


class ProbeError(RuntimeError):
    """A micro-batch probe that failed for another reason than memory: the search cannot go on."""


@dataclass
class Probe:
    micro_batch_size: int
    fits: bool
    status: str
    peak_memory_gib: float | None  # at the error, when it ran out of memory
    verdict: str = ""  # "fits", "does not fit (out of memory at 71.20 GiB)", ...


def verdict(run: RunResult, budget_gib: float | None) -> tuple[bool, str]:
    """(fits, what to print) of a probe that ran ("ok") or ran out of memory on the device."""
    memory = f"{run.peak_memory_gib:.2f} GiB" if run.peak_memory_gib is not None else "? GiB"
    if run.status == OUT_OF_MEMORY:
        return False, f"does not fit (out of memory at {memory})"
    if budget_gib is not None and (run.peak_memory_gib or 0.0) > budget_gib:
        return False, f"does not fit (peak {memory}, over the budget of {budget_gib:.2f} GiB)"
    return True, f"fits (peak {memory})"


@dataclass
class SearchResult:
    candidates: list[int]  # micro-batches that divide the recipe's batch
    memory_budget_gib: float | None
    probes: list[Probe]
    largest_fitting: int | None


def usable_micro_batches(global_batch_tokens: int, seq_len: int) -> list[int]:
    """Micro-batches that split the global batch on one process (whole accumulation steps)."""
    sequences = global_batch_tokens // seq_len
    return [n for n in range(1, sequences + 1) if global_batch_tokens % (n * seq_len) == 0]


def largest_fitting(candidates: list[int], start: int, fits: Callable[[int], bool]) -> int | None:
    """The largest candidate for which `fits` holds, assuming fitting is monotone in size.

    Doubles from `start` (or the nearest candidate) until a probe fails or the candidates end,
    then bisects between the last fit and the first failure; starting from a failure it bisects
    below. Each candidate is probed at most once.
    """
    candidates = sorted(set(candidates))
    low, high = -1, len(candidates)  # indices of the largest known fit and the smallest known failure
    index = min(range(len(candidates)), key=lambda i: abs(candidates[i] - start), default=0)
    while index < high:  # doubling
        if not fits(candidates[index]):
            high = index
            break
        low = index
        doubled = [i for i in range(index + 1, len(candidates)) if candidates[i] >= 2 * candidates[index]]
        # past the last doubling, the largest candidate is the last one worth a probe
        index = doubled[0] if doubled else (len(candidates) - 1 if index < len(candidates) - 1 else high)
    while high - low > 1:  # bisection between what fits and what does not
        middle = (low + high) // 2
        if fits(candidates[middle]):
            low = middle
        else:
            high = middle
    return candidates[low] if low >= 0 else None


def search_micro_batch(
    recipe: Recipe,
    short_run: dict[str, Any],
    folder: Path,
    budget_gib: float | None,
    say: Callable[[str], None],
    probe: Callable[[Recipe, Path], RunResult] = run_in_child,
) -> SearchResult:
    """The largest usable micro-batch that fits without gradient checkpointing (see the module doc);
    `probe` runs a probe's recipe on the device (a child process) and says how it went."""
    candidates = usable_micro_batches(recipe.train.global_batch_tokens, recipe.data.seq_len)
    probes: list[Probe] = []

    def fits(size: int) -> bool:
        probe_recipe = build_recipe(
            recipe.to_dict(),
            {
                **short_run,
                "max_steps": PROBE_STEPS,
                "warmup_steps": 1,
                "save_interval": PROBE_STEPS,
                "output_dir": str(folder / f"micro_batch_{size}" / "run"),
                "micro_batch_size": size,
                "global_batch_tokens": size * recipe.data.seq_len,
                "gradient_checkpointing": False,
                "checkpointed_layers": 0,
            },
        )
        run = probe(probe_recipe, folder / f"micro_batch_{size}")
        if run.status not in ("ok", OUT_OF_MEMORY):
            raise ProbeError(f"the probe at micro_batch_size {size} failed ({run.status}): {run.message}")
        ok, said = verdict(run, budget_gib)
        probes.append(Probe(size, ok, run.status, run.peak_memory_gib, said))
        say(f"  micro_batch_size {size}: {said}")
        return ok

    best = largest_fitting(candidates, recipe.train.micro_batch_size, fits)
    return SearchResult(candidates, budget_gib, probes, best)
