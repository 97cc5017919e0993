"""torch.compile in a run: what it cost and how often it compiled.

Accelerate compiles the model in `prepare` (`compile: true`); this module only watches. The cost
is the first step's extra seconds over the steps after it (the compile happens inside the first
call). The counts come from dynamo's own counters, cumulative for the process: graphs compiled,
recompilations (a frame compiled again because a guard failed; evaluation's no-grad graph is one,
once) and graph breaks (none is expected in the Llama's training step: tests/test_gpu_paths.py).
"""

from __future__ import annotations

import statistics
import time

from accelerate.utils import TorchDynamoPlugin

from hf_pretrain.config import ComputeConfig

# Steps after the first whose median is the compiled step's usual time.
SETTLE_STEPS = 3


def dynamo_plugin(compute: ComputeConfig) -> TorchDynamoPlugin:
    """How Accelerate compiles the model in `prepare`: not at all, whole (`compile`), or one decoder
    layer compiled and reused for every layer (`compile_regions`, Accelerate's regional compilation)."""
    return TorchDynamoPlugin(
        backend="inductor" if compute.compile else "no",
        use_regional_compilation=compute.compile and compute.compile_regions,
    )


def compile_counts() -> dict[str, int]:
    """`graphs`, `recompilations` and `graph_breaks` dynamo has counted in this process so far."""
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    breaks = sum(counters["graph_break"].values())
    try:  # per-compile records, each with the guard that failed when it was a recompilation
        from torch._dynamo.utils import get_compilation_metrics

        recompilations = sum(1 for m in get_compilation_metrics() if getattr(m, "recompile_reason", None))
    except ImportError:  # an older torch: every frame compiled after the first counts
        recompilations = max(0, counters["frames"]["ok"] - 1)
    return {"graphs": graphs, "recompilations": recompilations, "graph_breaks": breaks}


class CompileWatch:
    """Times the first steps of a compiled run. `step()` after each optimizer step; once the first
    step and `SETTLE_STEPS` more are timed it returns the one line that says what compiling cost.
    Time spent paused (evaluation, checkpoints) is left out with `skip`."""

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.durations: list[float] = []
        self.compile_seconds: float | None = None

    def skip(self, seconds: float) -> None:
        self.last += seconds

    def step(self, data_wait: float = 0.0) -> str | None:
        """After a step that waited `data_wait` seconds for batches (not compiling: left out)."""
        now = time.perf_counter()
        if self.compile_seconds is not None:
            return None
        self.durations.append(now - self.last - data_wait)
        self.last = now
        if len(self.durations) <= SETTLE_STEPS:
            return None
        usual = statistics.median(self.durations[1:])
        self.compile_seconds = max(0.0, self.durations[0] - usual)
        counts = compile_counts()
        return (
            f"compile: the first step took {self.durations[0]:.1f}s, {self.compile_seconds:.1f}s more than the "
            f"{SETTLE_STEPS} after it ({usual:.2f}s each); {counts['graphs']} graph(s), "
            f"{counts['recompilations']} recompilation(s), {counts['graph_breaks']} graph break(s)"
        )

    def record(self) -> dict[str, float | int]:
        """Fields for a metrics record: the compile seconds once measured, and the counts so far."""
        fields: dict[str, float | int] = dict(compile_counts())
        if self.compile_seconds is not None:
            fields["compile_s"] = self.compile_seconds
        return fields
