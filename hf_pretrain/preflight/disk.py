"""The output folder: writable, with room for the checkpoints and the exported model."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from pathlib import Path

from hf_pretrain.checkpoints.disk_space import nearest_existing
from hf_pretrain.checkpoints.layout import MANIFEST
from hf_pretrain.checkpoints.store import list_checkpoints
from hf_pretrain.config import CheckpointConfig, DataConfig, TrainConfig
from hf_pretrain.economics.memory import CHECKPOINT_BYTES_PER_PARAMETER
from hf_pretrain.formatting import human_bytes
from hf_pretrain.machine.hardware import DTYPE_BYTES
from hf_pretrain.preflight.result import CheckResult
from hf_pretrain.run_folder.run_dir import FINAL_DTYPE
from hf_pretrain.run_folder.run_lock import holder_of

# Beside the tensors: RNG states (~15 KB a process), config, manifest, train state (a few KB each).
SMALL_FILES_BYTES = 2**20
# The tokenizer every checkpoint carries, where the prepared data does not hold it yet: ~65 bytes a
# vocabulary entry for our byte-level BPE (0.26 MB at 4K entries), rounded up.
TOKENIZER_BYTES_PER_ENTRY = 100
# A milestone past the kept checkpoints keeps its weights only, in bf16 (checkpoints/store.py),
# unless milestone_full_state keeps it whole.
MILESTONE_BYTES_PER_PARAMETER = DTYPE_BYTES["bf16"]


def checkpoint_bytes(parameters: int, tokenizer_bytes: int = 0) -> int:
    """One whole checkpoint of a model: fp32 weights, AdamW's moments, the small files beside them.
    (A flat 64 MB for those once made the smoke model's 16 MB checkpoint an 80 MB one.)"""
    return CHECKPOINT_BYTES_PER_PARAMETER * parameters + SMALL_FILES_BYTES + tokenizer_bytes


def tokenizer_bytes(data: DataConfig) -> int:
    """What the data's tokenizer takes in a checkpoint: the prepared one's files, else an estimate."""
    folder = Path(data.data_dir) / "tokenizer"
    files = [f for f in folder.rglob("*") if f.is_file()] if folder.is_dir() else []
    return sum(f.stat().st_size for f in files) if files else TOKENIZER_BYTES_PER_ENTRY * data.vocab_size


def newest_checkpoint_bytes(output_dir: str | Path) -> int:
    """The size of the run's newest sealed checkpoint (it has its manifest), 0 if none: the real figure."""
    sealed = [c.path for c in list_checkpoints(output_dir) if (c.path / MANIFEST).is_file()]
    return sum(f.stat().st_size for f in sealed[0].rglob("*") if f.is_file()) if sealed else 0


def check_output_writable(output_dir: str | Path) -> CheckResult:
    """The run folder can be created and written (the folder alone decides it)."""
    output_dir = Path(output_dir)
    existing = nearest_existing(output_dir)
    fix = "--output_dir on a writable disk"
    if not existing.is_dir():
        return CheckResult("output_dir", "fail", f"cannot create {output_dir}: {existing} is a file, not a folder", fix)
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".hf-pretrain-doctor-"):
            pass
    except OSError as exc:
        return CheckResult("output_dir", "fail", f"cannot write in {existing}: {exc.strerror or exc}", fix)
    where = "exists" if existing == output_dir.absolute() else f"will be created in {existing}"
    return CheckResult("output_dir", "pass", f"{output_dir} {where}, writable")


def check_not_in_use(output_dir: str) -> CheckResult:
    """Whether another training holds the run folder now (run_lock.py): it would refuse this one."""
    if os.environ.get("RANK", "0") != "0":
        return CheckResult("in use", "skip", "the job's first process takes the run folder's lock")
    holder = holder_of(output_dir)
    if holder is None or holder.get("pid") == os.getpid():
        return CheckResult("in use", "pass", f"no other training writes {output_dir}")
    who = f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}" if holder else "a training"
    return CheckResult(
        "in use",
        "fail",
        f"{output_dir} is in use by {who}",
        "wait for it to end, stop it, or choose another --output_dir",
    )


def milestone_count(checkpoints: CheckpointConfig, max_steps: int) -> int:
    """Checkpoints never pruned: saves (every save_interval) at multiples of milestone_interval,
    before the final step's, which is among the kept ones anyway."""
    return (
        (max_steps - 1) // math.lcm(checkpoints.save_interval, checkpoints.milestone_interval)
        if checkpoints.milestone_interval
        else 0
    )


def existing_checkpoint_bytes(output_dir: str | Path) -> int:
    """Bytes in the run's checkpoint folders, unfinished ones included (the next saves prune them)."""
    folders = list_checkpoints(output_dir, include_unfinished=True)
    return sum(f.stat().st_size for c in folders for f in c.path.rglob("*") if f.is_file())


def is_working_copy(folder: Path) -> bool:
    """Whether `folder` is a URL run's working copy in the cache (`<cache>/runs/<scheme>/<bucket>/...`). Its
    checkpoints take room on the cache's disk, not in the store: the rows say so without the copy's path (issue
    57: "72.8 GB free on s3://bucket/...", the path read as the URL it stands for; and no line of a URL run
    names the cache's folders)."""
    from hf_pretrain.run_folder.run_dir import RunDir
    from hf_pretrain.store.cache import url_of_copy

    # one that trained says its URL in store.json; one that has not yet is where the user's cache puts copies
    return RunDir(folder).shown_as() != str(folder) or url_of_copy(folder) is not None


def check_disk_space(
    t: TrainConfig, checkpoints: CheckpointConfig, data: DataConfig, *, parameters: int
) -> CheckResult:
    """Free space for keep_checkpoints + 1 checkpoints (a new one is complete before the oldest is
    pruned), the milestones, and the final export, less what the run's checkpoints already take: of a
    model of `parameters` (`model.llama.model_parameter_count`), with `data`'s tokenizer."""
    n = parameters
    tokenizer = tokenizer_bytes(data)
    checkpoint = newest_checkpoint_bytes(t.output_dir) or checkpoint_bytes(n, tokenizer)
    small = SMALL_FILES_BYTES + tokenizer
    milestone = checkpoint if checkpoints.milestone_full_state else MILESTONE_BYTES_PER_PARAMETER * n + small
    export = DTYPE_BYTES[FINAL_DTYPE] * n  # final/ is exported in FINAL_DTYPE whatever the training precision
    milestones = milestone_count(checkpoints, t.max_steps)
    already = existing_checkpoint_bytes(t.output_dir)
    needed = max(0, (checkpoints.keep_checkpoints + 1) * checkpoint + milestones * milestone + export - already)
    disk = nearest_existing(Path(t.output_dir))
    if not disk.is_dir():
        return CheckResult("disk space", "skip", f"{disk} is not a folder (see output_dir)")
    free = shutil.disk_usage(disk).free
    cache = is_working_copy(Path(t.output_dir))
    count = checkpoints.keep_checkpoints + 1
    kind = "whole" if checkpoints.milestone_full_state else "bf16 weights only"
    kept = f" + {milestones} milestones of {human_bytes(milestone)} ({kind})" if milestones else ""
    existing = f" - {human_bytes(already)} in existing checkpoints" if already else ""
    reason = (
        f"needs {human_bytes(needed)} = {count} checkpoints of {human_bytes(checkpoint)} "
        f"({checkpoints.keep_checkpoints} kept + 1 being written){kept} + a {human_bytes(export)} export{existing}; "
        + (
            f"{human_bytes(free)} free on the disk of the cache that holds the run's working copy"
            if cache
            else f"{human_bytes(free)} free on {disk}"
        )
    )
    if free < needed:
        where = (
            "move the cache with --cache_dir (or HF_PRETRAIN_HOME)" if cache else "put --output_dir on a bigger disk"
        )
        return CheckResult(
            "disk space",
            "fail",
            reason,
            f"free space, {where}, or lower --keep_checkpoints" + (" / --milestone_interval" if milestones else ""),
        )
    return CheckResult("disk space", "pass", reason)


# At most, a save blocks the training thread while it writes the tensors (a periodic one where it cannot
# stage them: FSDP; the checksum, flush and rename run beside training: checkpoints/saving.py), so its
# share of the run is bytes / disk speed over the time between saves. The probe is small enough to cost about a second on a slow disk.
SAVE_SHARE_LIMIT = 0.01
PROBE_BYTES = 128 * 2**20
PROBE_CHUNK = 8 * 2**20


def disk_write_bytes_per_s(folder: Path) -> float:
    """Sustained write speed into `folder`: PROBE_BYTES of incompressible data, flushed to the disk."""
    chunk = os.urandom(PROBE_CHUNK)  # zeros would flatter a compressing filesystem
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".hf-pretrain-doctor-speed-") as probe:
        started = time.perf_counter()
        for _ in range(PROBE_BYTES // PROBE_CHUNK):
            probe.write(chunk)
        probe.flush()
        os.fsync(probe.fileno())
        return PROBE_BYTES / max(time.perf_counter() - started, 1e-9)


def check_save_speed(
    t: TrainConfig, checkpoints: CheckpointConfig, data: DataConfig, *, parameters: int, expected_tokens_per_s: float
) -> CheckResult:
    """Whether writing a checkpoint (of a model of `parameters`, with `data`'s tokenizer) every save_interval
    steps costs more than 1% of the run, at `expected_tokens_per_s` (the reporting section's)."""
    if not expected_tokens_per_s:
        return CheckResult("save speed", "skip", "the step time is unknown (expected_tokens_per_s=0)")
    if os.environ.get("RANK", "0") != "0":
        return CheckResult("save speed", "skip", "measured by the job's first process")
    if checkpoints.save_interval >= t.max_steps:
        return CheckResult("save speed", "pass", "one save, at the end of the run")
    disk = nearest_existing(Path(t.output_dir))
    if not disk.is_dir():
        return CheckResult("save speed", "skip", f"{disk} is not a folder (see output_dir)")
    speed = disk_write_bytes_per_s(disk)
    cache = is_working_copy(Path(t.output_dir))  # a URL run saves into the cache, then uploads
    where = "the disk of the cache that holds the run's working copy" if cache else str(disk)
    write_s = checkpoint_bytes(parameters, tokenizer_bytes(data)) / speed
    between_saves_s = checkpoints.save_interval * t.global_batch_tokens / expected_tokens_per_s
    share = write_s / between_saves_s
    # An upper bound: the probe is flushed to the disk, while the page cache can take part of a save
    reason = (
        f"{where} writes {human_bytes(speed)}/s flushed: a checkpoint blocks training up to ~{write_s:,.0f} s "
        f"every {between_saves_s / 60:,.0f} min ({share:.1%} of the run)"
    )
    if share <= SAVE_SHARE_LIMIT:
        return CheckResult("save speed", "pass", reason)
    under = math.ceil(write_s / SAVE_SHARE_LIMIT / (between_saves_s / checkpoints.save_interval))
    return CheckResult(
        "save speed",
        "warn",
        reason,
        f"--save_interval {under:,} keeps it under {SAVE_SHARE_LIMIT:.0%} (a crash then loses more "
        f"steps), or put {'--cache_dir' if cache else '--output_dir'} on a faster disk (a local NVMe writes 2-3 GB/s)",
    )
