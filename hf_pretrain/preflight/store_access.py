"""A run whose output_dir is a URL: the store's rows of the doctor, one line each, redacted.

The store (store/reach.py): it answers, its bucket exists, the credentials are accepted and
may write under the run's prefix. The upload: one checkpoint's time at the rate a small test object
(`RATE_PROBE_BYTES`, put then deleted: an object the doctor wrote) measured, against the time between
saves (training never waits for it, but a store slower than the saves falls behind). The cache: the
local working copy's disk (the checkpoints are sealed there first) against what the run keeps there.
The local-folder checks (disk space, save speed, in use) then run on the working copy.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from hf_pretrain.checkpoints.layout import PREFIX
from hf_pretrain.checkpoints.manifest import CheckpointError
from hf_pretrain.checkpoints.resume_decision import finished_step
from hf_pretrain.checkpoints.resume_plan import Continuation, ResumeRefused
from hf_pretrain.config import CheckpointConfig, DataConfig, TrainConfig
from hf_pretrain.formatting import human_bytes, human_duration
from hf_pretrain.preflight.disk import checkpoint_bytes, nearest_existing, newest_checkpoint_bytes, tokenizer_bytes
from hf_pretrain.preflight.result import CheckResult
from hf_pretrain.preflight.resume import check_resume
from hf_pretrain.store.location import Location

RATE_PROBE_BYTES = 8 * 2**20  # big enough that the request's latency is not the whole measure
RATE_PROBE = ".hf_pretrain_doctor_rate"


def data_store_refused(data: Location) -> CheckResult | None:
    """A URL data_dir (the door's `Where.data`, as the user named it) whose store does not answer (or has no
    such bucket): the one row, from one probe. Without it each data check retried its own reads: 2 to 2.5
    minutes of silence for an unreachable endpoint."""
    if not data.in_store:
        return None
    from hf_pretrain.store.reach import StoreRefused, open_checked

    try:
        open_checked(data.given, write=False, what="the data")
    except StoreRefused as exc:
        return CheckResult("data", "fail", str(exc), "see the message; the other checks need the data")
    return None


def newest_in_store(fs, url) -> tuple[int, dict] | None:
    """The step and train state of the newest complete checkpoint of the run at `url`: one small object
    read, nothing pulled (None when the store holds none)."""
    import json

    from hf_pretrain.checkpoints.layout import TRAIN_STATE
    from hf_pretrain.store.run.pull import complete_steps

    steps = complete_steps(fs, url)
    if not steps:
        return None
    folder = url.join("checkpoints", f"{PREFIX}{steps[0]:08d}")
    return steps[0], json.loads(fs.cat_file(folder.join(TRAIN_STATE).path))


def _store_of(output_dir: str):
    """(url, file system) of a run URL to read, or None when it cannot be read (the store row says why)."""
    from hf_pretrain.store.reach import StoreRefused, open_checked

    try:
        return open_checked(output_dir, write=False)
    except StoreRefused:
        return None


def check_resume_from_store(
    run: Location,
    train: TrainConfig,
    checkpoints: CheckpointConfig,
    decision: Callable[[], Continuation],
    *,
    goes_on_from: Callable[[dict], Continuation],
) -> CheckResult:
    """The resume row of a run URL on a machine whose working copy is behind the store (a fresh machine:
    empty): what training will do once it has pulled the store's newest checkpoint, judged on that
    checkpoint's train state (its checksums are checked when it is pulled) by `goes_on_from` (the recipe's
    `plan_continuation` from a train state). `run`: the door's, its URL. `decision`: this machine's copy's."""
    store, newest = _store_of(run.given), None
    if store is not None:
        url, fs = store
        try:
            newest = newest_in_store(fs, url)
        except (OSError, ValueError):  # unreadable: the store row says why
            pass
    try:
        here = decision().saved
    except (ResumeRefused, CheckpointError):
        here = None
    if newest is None or (here is not None and here["step"] >= newest[0]):
        return check_resume(train, checkpoints, decision)  # this machine's copy is as new as the store's
    step, saved = newest
    row = check_resume(train, checkpoints, lambda: goes_on_from(saved))
    pulled = f"step {step:,} is in the store; training pulls it into this machine's copy first"
    return dataclasses.replace(row, reason=f"{row.reason} ({pulled})")


def finished_in_store(train: TrainConfig, checkpoints: CheckpointConfig) -> int | None:
    """`resume_decision.finished_at` for a run URL: the step it finished at, read in the store (its
    checkpoints listed only when final/ is whole there, as training's start judges it: `final_in_store`)."""
    from hf_pretrain.store.run.pull import final_in_store

    store = _store_of(train.output_dir)
    if store is None:
        return None
    url, fs = store
    try:
        newest = newest_in_store(fs, url) if final_in_store(fs, url) else None
    except (OSError, ValueError):
        return None
    return finished_step(checkpoints.resume, train.max_steps, newest[1]) if newest else None


def check_store(
    run: Location,
    train: TrainConfig,
    checkpoints: CheckpointConfig,
    *,
    data: DataConfig,
    parameters: int,
    expected_tokens_per_s: float,
) -> list[CheckResult]:
    """The store's rows: reachable and writable (else the only row: the others need it); `run`: the door's, its
    URL and its working copy on this machine. A checkpoint is estimated for a model of `parameters` with
    `data`'s tokenizer, saved at `train`'s interval and `expected_tokens_per_s`."""
    from hf_pretrain.store.reach import StoreRefused, open_checked, where
    from hf_pretrain.store.urls import StoreURL

    try:
        url, fs = open_checked(run.given)
    except StoreRefused as exc:
        return [CheckResult("store", "fail", str(exc), "see the message; then run the doctor again")]
    from hf_pretrain.store.run.pull import complete_steps

    steps = complete_steps(fs, url)
    newest = f"its newest complete checkpoint is step {steps[0]:,}" if steps else "no checkpoint in it yet"
    said = f"{where(StoreURL.parse(str(url)))} answers, the credentials may write; {newest}"
    rows = [CheckResult("store", "pass", said)]
    size = checkpoint_size(run.local, data, parameters=parameters)
    upload = upload_time(url, fs, train, checkpoints, size=size, expected_tokens_per_s=expected_tokens_per_s)
    return rows + [upload, cache_disk(run.local, size)]


def checkpoint_size(local: Path, data: DataConfig, *, parameters: int) -> int:
    """A checkpoint of the run whose working copy is `local`: its newest one's size, else the estimate for a
    model of `parameters` with `data`'s tokenizer."""
    return newest_checkpoint_bytes(local) or checkpoint_bytes(parameters, tokenizer_bytes(data))


def upload_time(
    url, fs, t: TrainConfig, checkpoints: CheckpointConfig, *, size: int, expected_tokens_per_s: float
) -> CheckResult:
    """One checkpoint's upload time (`size` bytes) at the measured rate, against the time between saves."""
    from hf_pretrain.store.reach import describe_failure

    if os.environ.get("RANK", "0") != "0":
        return CheckResult("store upload", "skip", "measured by the job's first process")
    probe = url.join(RATE_PROBE).path
    data = os.urandom(RATE_PROBE_BYTES)  # incompressible, as a checkpoint's bytes are
    try:
        started = time.perf_counter()
        fs.pipe_file(probe, data)
        rate = RATE_PROBE_BYTES / max(time.perf_counter() - started, 1e-9)
        fs.rm_file(probe)
    except Exception as exc:
        return CheckResult("store upload", "warn", describe_failure(url, exc, "measuring the upload rate"))
    upload_s = size / rate
    reason = (
        f"{human_bytes(rate)}/s measured with {human_bytes(RATE_PROBE_BYTES)}: a {human_bytes(size)} checkpoint "
        f"uploads in ~{human_duration(upload_s)} in the background"
    )
    if not expected_tokens_per_s or checkpoints.save_interval >= t.max_steps:
        return CheckResult("store upload", "pass", reason)
    between_s = checkpoints.save_interval * t.global_batch_tokens / expected_tokens_per_s
    reason += f", every {human_duration(between_s)} of training"
    if upload_s <= between_s:
        return CheckResult("store upload", "pass", reason)
    return CheckResult(
        "store upload",
        "warn",
        reason + ": the store falls behind (older checkpoints are skipped, the newest goes up)",
        "raise --save_interval, or use a store nearer the machine (a crash loses the steps not in the store)",
    )


def cache_disk(local: Path, size: int) -> CheckResult:
    """The working copy `local`'s disk against one checkpoint of `size` bytes (the full need is the disk
    space row below)."""
    disk = nearest_existing(local)
    free = shutil.disk_usage(disk).free
    reason = f"the working copy {local}: {human_bytes(free)} free on {disk}, a checkpoint takes {human_bytes(size)}"
    if free < size:
        return CheckResult(
            "store cache", "fail", reason, "free space, or move the cache with --cache_dir (or HF_PRETRAIN_HOME)"
        )
    return CheckResult("store cache", "pass", reason)
