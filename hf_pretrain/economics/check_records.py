"""What `hf-pretrain check` measured, kept in the measurement store beside bench's and training's figures.

A check record is one JSON line of the same `measurements.jsonl` (economics/measurements.py finds it:
`$HF_PRETRAIN_HOME`, else the user's cache), tagged `"kind": "check"`: one figure of one part (the
matmul peak, an SDPA kernel, the step, the disk, ...), labelled with the device, the GPU table's
name for it (`cpu` for a CPU), versions and date. `measurements.Measurement` cannot read such a line
(other fields: it is skipped), so `plan` and the doctor never price anything with a check record,
least of all a CPU's: what a GPU's step measured reaches `plan` only through `record_measurement`,
which records GPUs alone.

Two readers ask these records: `attention_backend: auto` takes the fastest SDPA kernel the check
measured on this card for the recipe's attention shape (`fastest_attention_backend`), and the check's
verdict compares a card with what the same card measured before (`earlier_figure`).
"""

from __future__ import annotations

import datetime
import fcntl
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hf_pretrain.config import ModelConfig
from hf_pretrain.economics.measurements import RECORD_ENV, SHIPPED_STORE, store_path
from hf_pretrain.machine.gpus import find_gpu
from hf_pretrain.versions import installed_version

CHECK_KIND = "check"
CPU = "cpu"  # the `gpu` of a record made without one: never a GPU table name


@dataclass(frozen=True)
class CheckRecord:
    part: str  # matmul | attention | step | micro_batch | disk | object_store | all_reduce
    name: str  # what of the part: `bf16`, `fp8`, `flash`, `recipe as written`, `write`, ...
    value: float
    unit: str  # TFLOP/s, ms, tokens/s, MB/s, GB/s, ...
    device: str  # as CUDA names it, or `cpu`
    gpu: str  # the GPU table's name, the device's own for a card the table lacks, `cpu` for a CPU
    detail: dict[str, Any] = field(default_factory=dict)  # the shape, the configuration, peak memory, ...
    date: str = ""
    torch: str = ""
    transformers: str = ""
    cuda: str | None = None
    cudnn: int | None = None
    kind: str = CHECK_KIND


def new_record(part: str, name: str, value: float, unit: str, device: str | None, **detail: Any) -> CheckRecord:
    """A record of what `device` (a CUDA name; None for the CPU) measured today, with the versions."""
    import torch

    gpu = find_gpu(device) if device else None
    return CheckRecord(
        part=part,
        name=name,
        value=float(value),
        unit=unit,
        device=device or CPU,
        gpu=(gpu.name if gpu else device) if device else CPU,
        detail=detail,
        date=datetime.date.today().isoformat(),
        torch=str(installed_version("torch") or "?"),
        transformers=str(installed_version("transformers") or "?"),
        cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version() if device else None,
    )


class StoreNotWritten(OSError):
    """The measurement store could not be written: the message says which file, why and what to set."""


def record_checks(records: list[CheckRecord], path: Path | None = None) -> Path | None:
    """Append `records` to the store; the store's path, or None when there was nothing to write or
    recording is off. A store that cannot be written raises `StoreNotWritten` saying why (the check
    says it in one line and goes on: it never fails on its records)."""
    import os

    if not records or os.environ.get(RECORD_ENV) == "0":
        return None
    store = path or store_path()
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        with store.open("a") as file:
            fcntl.flock(file, fcntl.LOCK_EX)  # one writer at a time, as measurements.py does
            file.writelines(json.dumps(asdict(record)) + "\n" for record in records)
    except OSError as exc:
        raise StoreNotWritten(
            f"the measurement store {store} cannot be written ({exc.strerror or exc}); set HF_PRETRAIN_HOME "
            f"to a writable folder (or {RECORD_ENV}=0 to record nothing)"
        ) from None
    return store


def stored_checks(path: Path | None = None, shipped: bool = True) -> list[CheckRecord]:
    """Every check record of the user's store, then the shipped ones; newest first within each."""
    found: list[CheckRecord] = []
    for store in [path or store_path(), *([SHIPPED_STORE] if shipped else [])]:
        try:
            lines = store.read_text().splitlines()
        except OSError:
            continue
        for line in reversed(lines):
            try:
                raw = json.loads(line)
                if raw.get("kind") == CHECK_KIND:
                    found.append(CheckRecord(**raw))
            except (ValueError, TypeError, AttributeError):  # a torn line, another version's
                continue
    return found


def attention_shape(heads: int, kv_heads: int, head_dim: int, seq_len: int) -> str:
    """The key an SDPA record is kept under: `32q/8kv x 64, 2048 tokens, causal`."""
    return f"{heads}q/{kv_heads}kv x {head_dim}, {seq_len} tokens, causal"


def fastest_attention_backend(gpu: str, shape: str, path: Path | None = None) -> CheckRecord | None:
    """The fastest SDPA kernel (lowest forward + backward ms) that a check measured on `gpu` (a table name
    or a CUDA name) for `shape`, from the newest check of that card; None where none was measured."""
    from hf_pretrain.model.attention import BACKENDS  # the kernels a recipe can name (torch's default is not one)

    table = find_gpu(gpu)
    name = table.name if table else gpu
    timed = [
        r
        for r in stored_checks(path)
        if r.part == "attention"
        and r.name in BACKENDS
        and r.gpu == name
        and r.gpu != CPU
        and r.detail.get("shape") == shape
    ]
    if not timed:
        return None
    newest = timed[0].date
    return min((r for r in timed if r.date == newest), key=lambda r: r.value)


def earlier_figure(
    part: str, name: str, gpu: str, today: list[CheckRecord], path: Path | None = None
) -> CheckRecord | None:
    """The best figure (largest) of `part`/`name` that `gpu` measured in an earlier check (not `today`'s)."""
    same = [
        r
        for r in stored_checks(path)
        if r.part == part and r.name == name and r.gpu == gpu and r.gpu != CPU and r not in today
    ]
    return max(same, key=lambda r: r.value, default=None)


def model_attention_shape(m: ModelConfig, seq_len: int) -> str:
    """The model section's attention at `seq_len` tokens, as a check's record keys it."""
    return attention_shape(
        m.num_attention_heads, m.num_key_value_heads, m.hidden_size // m.num_attention_heads, seq_len
    )


def resolved_attention_backend(
    backend: str, model: ModelConfig, seq_len: int, device: str | None, path: Path | None = None
) -> tuple[str, str | None]:
    """(the SDPA kernel a run uses, the line that says why when `auto` chose one): `backend` (the compute
    section's choice), or for `auto` the fastest a check measured on this GPU (`device`, a CUDA name) for
    the model's attention at `seq_len`, else `auto` (torch's own choice)."""
    if backend != "auto" or device is None:
        return backend, None
    fastest = fastest_attention_backend(device, model_attention_shape(model, seq_len), path)
    if fastest is None:
        return "auto", None
    return fastest.name, (
        f"attention: {fastest.name} (attention_backend auto: the fastest SDPA kernel `hf-pretrain check` "
        f"measured on this {fastest.gpu}, {fastest.value:.2f} ms forward + backward, {fastest.date})"
    )
