"""What this machine's GPUs measured: tokens/s and peak memory of a configuration, recorded by a bench or
a training run on a GPU, read back by `plan` and the doctor before the performance model's estimate.

A measurement is one JSON line of `measurements.jsonl` in the user's cache (`$HF_PRETRAIN_HOME`, else
`$XDG_CACHE_HOME/hf_pretrain`, else `~/.cache/hf_pretrain`). Its key is the GPU (the GPU table's name,
so "NVIDIA H100 80GB HBM3" and `--gpu H100` meet) and the configuration: what changes the speed or
the memory of a step (model shape, sequence, micro-batch and batch, compile, Liger, checkpointed
layers, optimizer, precision, processes). Versions and date are kept beside it, not matched: a
newer torch rarely makes a measured figure worse than the model's, and the reader sees both. The
newest matching line wins.

A record is used only when it is one a machine could produce: its tokens/s a finite positive number
no higher than the card's dense peak over the model's FLOPs per token (MFU at most 1), its peak memory
(if any) positive and within the card's memory. Any other (a hand edit, another tool's line) is
skipped, said once per process on stderr with its file and line (`usable`).

The project's own GPU measurements ship beside this module (`measured.jsonl`, `SHIPPED_STORE`: the
`1b` on an H100 SXM, docs/gpu.md) and are read after the user's, so a
user's own record of the same configuration wins over them.

A CPU records nothing: its speed says nothing of any GPU. `HF_PRETRAIN_RECORD=0` turns recording off
(the bench sets it for its short runs, and records its own figure).
"""

from __future__ import annotations

import datetime
import fcntl
import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hf_pretrain.config import DataConfig, ModelConfig
from hf_pretrain.machine.gpus import find_gpu, gpu_table
from hf_pretrain.machine.precisions import NAMES, precision_named
from hf_pretrain.machine.run_profile import Step
from hf_pretrain.model.llama import model_flops_per_token, tokenizer_size_of
from hf_pretrain.versions import installed_version

STORE_NAME = "measurements.jsonl"
SHIPPED_STORE = Path(__file__).with_name("measured.jsonl")  # the project's own runs, package data
RECORD_ENV = "HF_PRETRAIN_RECORD"  # "0": record nothing


def store_path() -> Path:
    """`$HF_PRETRAIN_HOME/measurements.jsonl`, else under `$XDG_CACHE_HOME/hf_pretrain` (default ~/.cache)."""
    home = os.environ.get("HF_PRETRAIN_HOME")
    if home:
        return Path(home).expanduser() / STORE_NAME
    cache = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(cache).expanduser() / "hf_pretrain" / STORE_NAME


@dataclass(frozen=True)
class Configuration:
    """What a measurement is the measurement of, built once from the model, data and step (`configuration`): its `key`,
    matched whole, and the model's training FLOPs per token, which rule out a figure no card could produce
    (`impossible`). Recording and reading measurements needs nothing else of the recipe."""

    key: dict[str, Any]
    flops_per_token: float

    @property
    def world_size(self) -> int:
        """The processes it ran on (a measurement's tokens/s is one GPU's)."""
        return self.key["world_size"]


def configuration(model: ModelConfig, data: DataConfig, step: Step, *, global_batch_tokens: int) -> Configuration:
    """What a measurement of the model section's Llama, at the data section's context and tokenizer, in
    batches of `global_batch_tokens`, run as `step` says is the measurement of: the model's shape and the
    batch, and the step (run_profile.Step.key: every setting that changes a step's speed or memory, its world
    size included). `step` is a door's profile's (the card that measured), or a what-if's for the card asked
    of (machine/what_if.py): no card is assumed here."""
    key = {
        "layers": model.num_hidden_layers,
        "hidden_size": model.hidden_size,
        "intermediate_size": model.intermediate_size,
        "heads": model.num_attention_heads,
        "kv_heads": model.num_key_value_heads,
        "vocab": tokenizer_size_of(data),
        "tie_word_embeddings": model.tie_word_embeddings,
        "seq_len": data.seq_len,
        "global_batch_tokens": global_batch_tokens,
        **step.key(),
    }
    return Configuration(key, model_flops_per_token(model, data)[1])


@dataclass(frozen=True)
class Measurement:
    gpu: str  # the GPU table's name (machine/gpus.yaml), or the device's own for a GPU the table lacks
    device: str  # as CUDA names it
    configuration: dict[str, Any]
    tokens_per_s: float  # one GPU's, after the warm-up (compilation)
    peak_memory_gib: float | None  # torch's peak allocated on the device
    source: str  # "bench" or "train"
    date: str  # ISO date
    torch: str
    transformers: str
    shipped: bool = False  # one of the project's own measurements (`SHIPPED_STORE`), not the user's

    def label(self) -> str:
        """`measured by bench on NVIDIA H100 80GB HBM3, 2026-11-25 (torch 2.11.0, transformers 5.23.0)`; a
        shipped one names its source: `measured: project's H100 run, 2026-11-25, docs/gpu.md (NVIDIA ...)`."""
        if self.shipped:
            return f"measured: {self.source} ({self.device}, torch {self.torch}, transformers {self.transformers})"
        return (
            f"measured by {self.source} on {self.device}, {self.date} "
            f"(torch {self.torch}, transformers {self.transformers})"
        )


def _table_name(device: str) -> str:
    gpu = find_gpu(device)
    return gpu.name if gpu else device


def record_measurement(
    measured: Configuration,
    device: str | None,
    tokens_per_s: float,
    peak_memory_gib: float | None,
    source: str,
    path: Path | None = None,
) -> Measurement | None:
    """Append what `device` (a CUDA device name; None for a CPU) measured of the configuration; None when
    nothing was written (a CPU, no rate, recording off, or a cache that cannot be written: a run never fails on it)."""
    if device is None or not _positive_number(tokens_per_s, MIN_TOKENS_PER_S) or os.environ.get(RECORD_ENV) == "0":
        return None
    version = {name: installed_version(name) for name in ("torch", "transformers")}
    measurement = Measurement(
        gpu=_table_name(device),
        device=device,
        configuration=measured.key,
        tokens_per_s=float(tokens_per_s),
        peak_memory_gib=peak_memory_gib,
        source=source,
        date=datetime.date.today().isoformat(),
        torch=str(version["torch"] or "?"),
        transformers=str(version["transformers"] or "?"),
    )
    store = path or store_path()
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        with store.open("a") as file:
            # one writer at a time: two runs that end together never interleave their lines
            fcntl.flock(file, fcntl.LOCK_EX)
            file.write(json.dumps(asdict(measurement)) + "\n")
    except OSError:
        return None
    return measurement


_SAID: set[tuple[Path, int]] = set()  # records already said to be skipped, by file and line: said once


def _skip(store: Path, line: int, why: str) -> None:
    if (store, line) in _SAID:
        return
    _SAID.add((store, line))
    print(
        f"note: {store} line {line} is not used as a measurement: {why} (no machine measures that: delete the "
        f"line; `hf-pretrain bench` on the GPU measures it again)",
        file=sys.stderr,
    )


def _positive_number(value: Any, floor: float = 0.0) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
        and value >= floor
    )


# Fewer tokens a second than this is no GPU's step, whatever the model (a 1B trains at tens of thousands
# on one H100): a figure under it (1e-300) would price a run at infinite hours and dollars.
MIN_TOKENS_PER_S = 1.0


def _current(record: dict[str, Any]) -> dict[str, Any]:
    """A record as this version keys it: fp32 was once keyed by Accelerate's name, `no`."""
    record.pop("shipped", None)
    key = record.get("configuration")
    if isinstance(key, dict) and key.get("precision") == "no":
        record["configuration"] = {**key, "precision": "fp32"}
    return record


def _stored(store: Path, shipped: bool) -> list[tuple[Measurement, int]]:
    """The measurements of one store with their line numbers, newest first (nothing where it cannot be
    read); a record whose figures are not finite positive numbers is skipped, and said (`_skip`)."""
    try:
        lines = store.read_text().splitlines()
    except OSError:
        return []
    found = []
    for number, line in reversed(list(enumerate(lines, start=1))):
        try:
            record = json.loads(line)
        except ValueError:  # a torn line, or one edited by hand
            if line.strip():
                _skip(store, number, "it is not JSON")
            continue
        try:
            measurement = Measurement(**_current(record), shipped=shipped)
        except (TypeError, AttributeError):  # a line another version wrote, or another kind (a check's record)
            continue
        memory = measurement.peak_memory_gib
        if not _positive_number(measurement.tokens_per_s, MIN_TOKENS_PER_S):
            _skip(
                store,
                number,
                f"tokens_per_s is {measurement.tokens_per_s!r}, not a finite number of at least {MIN_TOKENS_PER_S:g}",
            )
        elif memory is not None and not _positive_number(memory):
            _skip(store, number, f"peak_memory_gib is {memory!r}, not a finite positive number")
        else:
            found.append((measurement, number))
    return found


def impossible(measurement: Measurement, flops_per_token: float) -> str | None:
    """Why `measurement` (of a model of `flops_per_token` training FLOPs a token) is no figure its GPU could
    produce, or None: more tokens/s than the card's dense peak over the model's FLOPs per token allows (MFU above 1), or a peak
    memory beyond the card's. A GPU the table lacks is held to the first rule only where it is known."""
    gpu = find_gpu(measurement.gpu)
    if gpu is None:
        return None
    name = measurement.configuration.get("precision")
    # the peak its converted linears run at (FP8's) where the card lists it, else the dense bf16 peak
    peak_name = precision_named(name).peak if name in NAMES else "bf16"
    peak_name = peak_name if gpu.flops_at(peak_name) else "bf16"
    peak = gpu.flops_at(peak_name)
    mfu = measurement.tokens_per_s * flops_per_token / peak
    if mfu > 1:
        return (
            f"{measurement.tokens_per_s:,.0f} tokens/s is {mfu:,.1f}x what the {gpu.name}'s dense "
            f"{peak_name} peak allows for this model (MFU above 1)"
        )
    if measurement.peak_memory_gib is not None and measurement.peak_memory_gib * 2**30 > gpu.memory_bytes:
        return (
            f"a peak of {measurement.peak_memory_gib:,.1f} GiB is more than the {gpu.name}'s "
            f"{gpu.memory_bytes / 2**30:,.0f} GiB"
        )
    return None


def recorded_measurement(wanted: Configuration, gpu: str, path: Path | None = None) -> Measurement | None:
    """The newest measurement of the `wanted` configuration on `gpu` (a table name, a `--gpu` argument or a
    CUDA device name) in the user's store, else the project's shipped one, or None. A record no machine
    could produce (`impossible`) is passed over, and said once."""
    stores = ((path or store_path(), False), (SHIPPED_STORE, True))
    return _matching(
        [(store, m, line) for store, shipped in stores for m, line in _stored(store, shipped)], wanted, gpu
    )


def shipped_measurement(wanted: Configuration, gpu: str) -> Measurement | None:
    """The project's own measurement of the `wanted` configuration on `gpu` (`measured.jsonl` alone, never
    the user's): the one home of those figures; published.py's check and the doctor's lines read them."""
    return _matching([(SHIPPED_STORE, m, line) for m, line in _stored(SHIPPED_STORE, True)], wanted, gpu)


def _matching(measurements: list[tuple[Path, Measurement, int]], wanted: Configuration, gpu: str) -> Measurement | None:
    name = _table_name(gpu)
    for store, measurement, line in measurements:
        if measurement.gpu != name or measurement.configuration != wanted.key:
            continue
        why = impossible(measurement, wanted.flops_per_token)
        if why is None:
            return measurement
        _skip(store, line, why)
    return None


def timed_throughput(records: list[dict[str, Any]], warmup: int) -> tuple[float, float, float | None] | None:
    """(tokens/s, seconds per step, data-wait share) over the logged train records after step `warmup`.

    Each train record's window runs from the previous record, so its seconds are the tokens it
    added over its rate; the data-wait share is weighted by those seconds.
    """
    train = [r for r in records if r.get("kind") == "train"]
    tokens = seconds = waited = 0.0
    steps, has_wait = 0, True
    previous = None
    for record in train:
        if previous is not None and record["step"] > warmup:
            window_tokens = record["tokens"] - previous["tokens"]
            window_seconds = window_tokens / record["tokens_per_s"]
            tokens += window_tokens
            seconds += window_seconds
            steps += record["step"] - previous["step"]
            if "data_wait_share" in record:
                waited += record["data_wait_share"] * window_seconds
            else:
                has_wait = False
        previous = record
    if not steps:
        return None
    return tokens / seconds, seconds / steps, (waited / seconds if has_wait else None)


def record_training_run(
    run: Configuration,
    gpu: str | None,
    session_records: list[dict[str, Any]],
    peak_memory_gib: float | None,
) -> Measurement | None:
    """What a training session of the `run` configuration on `gpu` (the run's card: `Machine.gpu_name`)
    measured, recorded: the job's rate over its train records after the first (which holds compilation and
    warm-up), per GPU. None on a CPU (`gpu` None) or with too few records."""
    train = [r for r in session_records if r.get("kind") == "train"]
    timed = timed_throughput(train, warmup=train[0]["step"]) if train else None
    if timed is None:
        return None
    return record_measurement(run, gpu, timed[0] / run.world_size, peak_memory_gib, "train")


def measured_on_a_gpu(wanted: Configuration) -> Measurement | None:
    """The newest measurement of the `wanted` configuration on any GPU of the table, the user's before the
    project's shipped ones: what the doctor quotes on a machine without a GPU (labelled with its card)."""
    found = [m for name in gpu_table() if (m := recorded_measurement(wanted, name)) is not None]
    return max(found, key=lambda m: (not m.shipped, m.date), default=None)


def measured_here(wanted: Configuration, gpu: str | None) -> Measurement | None:
    """What the `wanted` configuration measured on the run's GPU, `gpu` (the doctor's question), or None (a
    CPU: `gpu` None)."""
    return recorded_measurement(wanted, gpu) if gpu else None
