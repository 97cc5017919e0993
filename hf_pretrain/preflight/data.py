"""The data side of a run: prepared shards that match the recipe, and a loader that survives workers."""

from __future__ import annotations

import pickle
import shutil
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from hf_pretrain.config import DataConfig, EvaluationConfig, ModelConfig, OptimConfig, RecipeError, TrainConfig
from hf_pretrain.config.schema import grad_accum_steps
from hf_pretrain.data.loader import build_mixture, sections_data
from hf_pretrain.data.prepared import DataMismatchError
from hf_pretrain.data.tokenizer import TokenizerUnreadable
from hf_pretrain.formatting import human_bytes
from hf_pretrain.optim.build import Schedule
from hf_pretrain.preflight.result import CheckResult
from hf_pretrain.store.location import Location
from hf_pretrain.store.store_calls import StoreError

# The run's prepared data checked against its recipe (`check_prepared_data`), made once by `run_checks`
# for every data row (a failure is raised again to each, which says it its way).
Prepared = Callable[[], dict[str, Any]]


def check_prepared(data: DataConfig, evaluation: EvaluationConfig, prepared: Prepared) -> CheckResult:
    """meta.json, tokenizer and shards in data_dir agree with the recipe (tokenizer, vocabulary, sizes)."""
    try:
        meta = prepared()
    except StoreError as exc:  # data_dir's store: unreachable, a missing bucket, refused credentials (redacted)
        reason, _, fix = str(exc).rpartition("; ")
        return CheckResult("data", "fail", reason or fix, fix if reason else "")
    except DataMismatchError as exc:
        if isinstance(exc.__cause__, TokenizerUnreadable):  # a prepare would find the folder prepared
            reason, _, fix = str(exc).partition("; ")
            return CheckResult("data", "fail", reason, fix)
        # The message ends with its fix, a prepare (into this folder, or a new one); the table shows it once.
        message = str(exc)
        if exc.fix:
            return CheckResult("data", "fail", message.removesuffix(f"; {exc.fix}"), exc.fix)
        reason, _, fix = message.rpartition("; ")
        return CheckResult("data", "fail", reason or fix, fix if reason else "")
    train_tokens, val_tokens = meta["splits"]["train"]["tokens"], meta["splits"]["validation"]["tokens"]
    reason = (
        f"{data.data_dir}: {train_tokens:,} training tokens, {val_tokens:,} validation tokens, "
        f"vocabulary {meta['vocab_size']:,}, {meta['dtype']}"
    )
    if val_tokens < evaluation.eval_tokens:  # val_loss then covers all of them: still the same on any world size
        return CheckResult(
            "data",
            "warn",
            f"{reason}; eval_tokens={evaluation.eval_tokens:,} asks for more, so "
            f"every evaluation uses all {val_tokens:,}",
            f"--eval_tokens {val_tokens} to say so, or a lower val_every at the next prepare",
        )
    return CheckResult("data", "pass", reason)


# A source read more often than this many times is worth a warning: up to ~4 epochs cost little
# (Muennighoff et al. 2023, "Scaling Data-Constrained Language Models"), past it repeats lose value fast.
MAX_EPOCHS = 4


def check_data_budget(t: TrainConfig, data: DataConfig, optim: OptimConfig, prepared: Prepared) -> CheckResult:
    """How many passes over each source's prepared training data the planned steps make, under the
    recipe's weights (and decay weights from the decay on): past one, a source repeats (each pass
    over the most-read source is logged); past MAX_EPOCHS, the later tokens are worth much less."""
    try:
        meta = prepared()
    except (DataMismatchError, StoreError):
        return CheckResult("data budget", "skip", "needs valid prepared data (see `data`)")
    seq_len = data.seq_len
    samples = [max(0, (s["splits"]["train"]["tokens"] - 1) // seq_len) for s in meta["sources"]]  # the loader's
    per_step = t.global_batch_tokens // seq_len
    decay_start = Schedule(optim, max_steps=t.max_steps).decay_start()
    decay_position = None if decay_start is None else decay_start * per_step
    mixture = build_mixture(data.sources, samples, decay_position, seed=t.seed)
    planned = t.max_steps * t.global_batch_tokens
    epochs = mixture.epochs_before(t.max_steps * per_step)
    names = [s["name"] for s in meta["sources"]]
    per_source = ", ".join(f"{n} {e:.2f}" for n, e in zip(names, epochs, strict=True))
    prepared = meta["splits"]["train"]["tokens"]
    reason = (
        f"the plan reads {planned:,} tokens ({t.max_steps:,} steps x {t.global_batch_tokens:,}) of "
        f"{prepared:,} prepared: {max(epochs):.2f} epochs of the most-read source (epochs per source: {per_source})"
    )
    if max(epochs) <= 1:
        return CheckResult("data budget", "pass", reason)
    fix = (
        "prepare more (a higher data.max_tokens, more documents) into a new data_dir, "
        "or lower the weight of the sources that repeat"
    )
    over = [n for n, e in zip(names, epochs, strict=True) if e > MAX_EPOCHS]
    if over:
        return CheckResult(
            "data budget",
            "warn",
            f"{reason}; {', '.join(over)} would repeat more than {MAX_EPOCHS} times, where repeated tokens "
            f"are worth much less (Muennighoff et al. 2023)",
            fix,
        )
    return CheckResult(
        "data budget",
        "warn",
        reason + "; the data repeats, each epoch boundary is logged",
        fix + f", or accept it: up to ~{MAX_EPOCHS} epochs cost little (Muennighoff et al. 2023)",
    )


def check_context(data: DataConfig, model: ModelConfig) -> CheckResult:
    """The data's sequences fit the model's positions."""
    seq_len, limit = data.seq_len, model.max_position_embeddings
    if seq_len > limit:
        return CheckResult(
            "seq_len",
            "fail",
            f"seq_len={seq_len} exceeds max_position_embeddings={limit}",
            f"--seq_len {limit} or --max_position_embeddings {seq_len}",
        )
    return CheckResult("seq_len", "pass", f"{seq_len} within max_position_embeddings={limit}")


def check_batch_split(t: TrainConfig, world_size: int, *, seq_len: int) -> CheckResult:
    """The global batch of `t` splits into whole micro-batches of `seq_len` samples on `world_size` processes."""
    try:
        accumulation = grad_accum_steps(t, world_size, seq_len=seq_len)
    except RecipeError as exc:  # its own advice (change either key) may not work: the fix names values that do
        return CheckResult("batch", "fail", str(exc).partition("; change")[0], batch_split_fix(t, seq_len, world_size))
    return CheckResult(
        "batch",
        "pass",
        f"{t.global_batch_tokens:,} tokens/step = {world_size} process(es) x "
        f"{accumulation} micro-batch(es) x {t.micro_batch_size} x {seq_len}",
    )


def _either(values: list) -> str:
    """`1, 2 or 4`."""
    values = [str(v) for v in values]
    return ", ".join(values[:-1]) + " or " + values[-1] if len(values) > 1 else "".join(values)


def batch_split_fix(t: TrainConfig, seq_len: int, world_size: int) -> str:
    """The values that do split the batch: micro-batch sizes on these processes (at most the recipe's,
    for memory), global_batch_tokens near the asked one, and process counts for this batch."""
    sequences = t.global_batch_tokens // seq_len  # whole: the recipe checks it splits on one process
    fixes, heading = [], ""
    if sequences % world_size == 0:
        per_process = sequences // world_size
        sizes = [m for m in range(t.micro_batch_size, 0, -1) if per_process % m == 0][:3]
        fixes.append(f"--micro_batch_size {_either(sizes)} ({per_process} sequences per process)")
    else:
        heading = f"no micro_batch_size splits {sequences} sequences over {world_size} processes: "
    per_pass = t.micro_batch_size * seq_len * world_size
    below, above = t.global_batch_tokens // per_pass * per_pass, (t.global_batch_tokens // per_pass + 1) * per_pass
    near = [tokens for tokens in (below, above) if tokens]
    fixes.append(
        f"--global_batch_tokens {_either(near)} (multiples of {world_size} x {t.micro_batch_size} x {seq_len})"
    )
    worlds = [w for w in range(1, max(8, 2 * world_size) + 1) if sequences % (w * t.micro_batch_size) == 0]
    fixes.append(f"keep this batch on {_either(worlds)} process(es)")
    return heading + ", or ".join(fixes)


def check_num_workers(data: DataConfig) -> CheckResult:
    workers = data.num_workers
    if workers == 0:
        return CheckResult(
            "num_workers",
            "warn",
            "num_workers=0: the training thread waits while every batch is read",
            "--num_workers 2 (or more)",
        )
    return CheckResult("num_workers", "pass", f"{workers} loader process(es)")


def check_loader_pickling(t: TrainConfig, data: DataConfig, location: Location) -> CheckResult:
    """What a worker process receives (dataset, collate_fn, worker_init_fn) survives pickling and
    yields a batch from the copy, the way a `spawn`/`forkserver` worker would get it. The batch
    sampler stays in the training process, but goes through the same round trip so that the
    batch is drawn exactly as the run would draw it.

    Neither starts worker processes nor iterates the DataLoader: only its parts are touched.
    """
    name = "loader"
    fix = "keep what workers receive picklable: module-level functions, no lambdas, open files or locks"
    try:
        loader = _first_rank_loader(t, data, location)
    except (DataMismatchError, RecipeError):
        return CheckResult(name, "skip", "needs valid prepared data and batch settings (see `data` and `batch`)")
    except StoreError as exc:  # a data cache too small for one step's blocks names its key; the store its fault
        return CheckResult(name, "fail", str(exc).rpartition(": set ")[0] or str(exc), _fix_of(str(exc)))
    parts = (loader.dataset, loader.batch_sampler, loader.collate_fn, loader.worker_init_fn)
    try:
        dataset, batch_sampler, collate_fn, _worker_init_fn = pickle.loads(pickle.dumps(parts))
    except Exception as exc:  # pickling raises many types (PicklingError, TypeError, AttributeError)
        return CheckResult(
            name, "fail", f"the loader does not survive pickling for worker processes: {type(exc).__name__}: {exc}", fix
        )
    try:
        batch = collate_fn([dataset[i] for i in next(iter(batch_sampler))])
    except StoreError as exc:  # data_dir's store: a damaged shard, an outage; its own fix, not pickling's
        reason, _, fix = str(exc).rpartition("; ")
        return CheckResult(name, "fail", reason or fix, fix if reason else "")
    except Exception as exc:  # whatever a worker would die of
        return CheckResult(
            name, "fail", f"the unpickled loader cannot produce a batch: {type(exc).__name__}: {exc}", fix
        )
    expected = (t.micro_batch_size, data.seq_len + 1)
    if not isinstance(batch, torch.Tensor) or tuple(batch.shape) != expected or batch.dtype != torch.long:
        found = f"{tuple(batch.shape)} {batch.dtype}" if isinstance(batch, torch.Tensor) else type(batch).__name__
        return CheckResult(name, "fail", f"the loader yields {found}, expected {expected} torch.int64", fix)
    return CheckResult(
        name,
        "pass",
        f"dataset, sampler, collate_fn and worker_init_fn pickle for workers and "
        f"yield [{expected[0]}, {expected[1]}] batches",
    )


def _first_rank_loader(t: TrainConfig, data: DataConfig, location: Location) -> DataLoader:
    """The training batches of one process alone, from step 0, as training builds them (`TrainData`), the
    data at `location` (the door's); a missing meta.json: the row skips, and `data` names the fix."""
    grad_accum = grad_accum_steps(t, 1, seq_len=data.seq_len)
    return sections_data(data, location, t, rank=0, world_size=1, grad_accum=grad_accum).loader(0, (0, 0), None)


def _fix_of(message: str) -> str:
    return "set " + message.rpartition(": set ")[2] if ": set " in message else ""


def check_data_cache(data: DataConfig, location: Location, prepared: Prepared) -> CheckResult | list[CheckResult]:
    """data_dir as a URL (`location`): the data's size against the cache bound (data_cache_gb) and the free
    disk under its local copy (in the cache folder the door named). No row for a local data_dir (read in place)."""
    if not location.in_store:
        return []
    from hf_pretrain.data.prepared import data_folder
    from hf_pretrain.preflight.disk import nearest_existing

    try:
        meta = prepared()
        folder = data_folder(location)  # synced by the check: no fix is printed
    except (DataMismatchError, StoreError):
        return CheckResult("data cache", "skip", "needs valid prepared data (see `data`)")
    itemsize = 2 if meta["dtype"] == "uint16" else 4
    data_bytes = sum(meta["splits"][split]["tokens"] for split in ("train", "validation")) * itemsize
    bound = int(data.data_cache_gb * 1e9)
    free = shutil.disk_usage(nearest_existing(folder)).free
    needed = min(bound, data_bytes)
    # the cache's folder is named only where the user must act on it (a full disk), not on a passing row
    where = f"{human_bytes(data_bytes)} of data in {data.data_dir}, cached on this machine (data_cache_gb={data.data_cache_gb:g})"
    if free < needed:
        return CheckResult(
            "data cache",
            "fail",
            f"{where}: the cache may take {human_bytes(needed)}, the disk under {folder} has {human_bytes(free)} free",
            f"--data_cache_gb {max(free * 0.8 / 1e9, 0.001):.3g}, or free space on that disk",
        )
    if data_bytes <= bound:
        return CheckResult("data cache", "pass", f"{where}: all of it fits; no block is fetched twice")
    share = bound / data_bytes
    return CheckResult(
        "data cache",
        "pass",
        f"{where}: the cache holds {share:.0%} of it; blocks not needed soon are evicted and fetched again later",
    )
