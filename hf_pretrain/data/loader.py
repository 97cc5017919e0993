"""Packed, memory-mapped training and validation loaders over the prepared token folders.

The training order is a pure function of (seed, step, micro-step, rank), which is what makes
a resumed run, or the same run on another number of processes, see the same samples:
    step s, micro-step k, rank r -> positions s*G + k*W*B + r*B + j, j < B   (G = B*A*W)
    position p -> (source, sample of that source): the mixture (mixing.py), by the sources' weights,
    and from the first step of a wsd decay or a cooldown on by their decay weights
A run that changed its batch on a resume counts from an origin instead: P0 + (s - s0)*G + ..., where
step s0 starts at position P0 (the tokens read so far, in samples of the new length).
Each source is its own run of samples (a sample never spans two sources); the dataset is their
concatenation, so a batch is a list of plain indices.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import threading
from bisect import bisect_right
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Sampler

from hf_pretrain.config import DataConfig, SourceConfig, TrainConfig
from hf_pretrain.data.mixing import Mixture
from hf_pretrain.data.prepared import (
    PREPARE_ANY,
    DataMismatchError,
    read_meta,
    source_folder_name,
    source_paths,
)
from hf_pretrain.processes import die_with_parent
from hf_pretrain.store.location import Location

if TYPE_CHECKING:  # data in a store: imported only when data_dir is a URL
    from hf_pretrain.store.data.data_cache import StoreData

# Batches each worker keeps ready: training batches are tiny to produce, so a few cover any hiccup.
PREFETCH_FACTOR = 4


class PackedDataset(Dataset[torch.Tensor]):
    """Samples of `seq_len + 1` tokens from the virtual concatenation of the shards.

    Sample i starts at token i * seq_len, so consecutive samples share one token: the last
    target of one sample is the first input of the next, and no token is ever skipped.
    Shards are opened on first access in each process, so pickling the dataset into DataLoader
    workers copies only paths; `preload` reads them into RAM (per process) instead of mapping.
    """

    def __init__(
        self,
        shard_paths: list[Path],
        seq_len: int,
        dtype: npt.DTypeLike,
        preload: bool = False,
        store: StoreData | None = None,
    ) -> None:
        self.shard_paths = [Path(p) for p in shard_paths]
        self.seq_len = seq_len
        self.dtype = np.dtype(dtype)
        self.preload = preload
        # data_dir as a URL: `shard_paths` are relative to it and the store's block cache opens them
        self.store = store
        sizes = [(store.size(p) if store else p.stat().st_size) // self.dtype.itemsize for p in self.shard_paths]
        # _starts[k] is the global offset of shard k's first token; _starts[-1] is the total.
        self._starts = [0]
        for size in sizes:
            self._starts.append(self._starts[-1] + size)
        self.total_tokens = self._starts[-1]
        self._shards: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return max(0, (self.total_tokens - 1) // self.seq_len)

    def _open(self) -> list[np.ndarray]:
        if self.store is not None:
            return self.store.open_shards(self.shard_paths, self.dtype)
        if self.preload:
            return [np.fromfile(p, dtype=self.dtype) for p in self.shard_paths]
        # np.memmap refuses empty files; an empty shard contributes nothing anyway.
        return [
            np.memmap(p, dtype=self.dtype, mode="r") if p.stat().st_size else np.empty(0, self.dtype)
            for p in self.shard_paths
        ]

    def __getitem__(self, index: int) -> torch.Tensor:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for {len(self)} samples")
        if self._shards is None:
            self._shards = self._open()
        start = index * self.seq_len
        end = start + self.seq_len + 1
        shard = bisect_right(self._starts, start) - 1
        pieces = []
        while start < end:  # a sample may run across the end of a shard
            stop = min(end, self._starts[shard + 1])
            pieces.append(self._shards[shard][start - self._starts[shard] : stop - self._starts[shard]])
            start, shard = stop, shard + 1
        tokens = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return torch.from_numpy(tokens.astype(np.int64))

    def spans(self, index: int) -> list[tuple[str, int, int]]:
        """(shard, first byte, end byte) of what sample `index` reads: what a prefetcher fetches ahead."""
        start, itemsize = index * self.seq_len, self.dtype.itemsize
        end = start + self.seq_len + 1
        shard, out = bisect_right(self._starts, start) - 1, []
        while start < end:
            stop = min(end, self._starts[shard + 1])
            if stop > start:
                base = self._starts[shard]
                out.append((str(self.shard_paths[shard]), (start - base) * itemsize, (stop - base) * itemsize))
            start, shard = stop, shard + 1
        return out

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_shards"] = None  # never ship mapped or loaded arrays to another process
        return state


def stack_samples(samples: list[torch.Tensor]) -> torch.Tensor:
    """Collate: samples all have seq_len + 1 tokens. Module level so that workers can pickle it."""
    return torch.stack(samples)


class StepBatchSampler(Sampler[list[int]]):
    """One rank's micro-batches of sample indices, from optimizer step `start_step` on, forever.

    `num_samples` is one source's sample count, or a `Mixture` over several sources (the indices are
    then those of the sources' concatenation, `offsets[s] + sample`)."""

    def __init__(
        self,
        num_samples: int | Mixture,
        micro_batch_size: int,
        grad_accum: int,
        world_size: int,
        rank: int,
        seed: int,
        start_step: int = 0,
        origin: tuple[int, int] = (0, 0),
    ) -> None:
        super().__init__()
        mixture = num_samples if isinstance(num_samples, Mixture) else None
        samples = mixture.samples if mixture else [num_samples]
        if min(samples) <= 0:
            raise DataMismatchError("the training split holds no complete sample of seq_len + 1 tokens")
        if not 0 <= rank < world_size or grad_accum < 1 or micro_batch_size < 1 or start_step < 0:
            raise ValueError(
                f"need 0 <= rank < world_size, grad_accum >= 1, micro_batch_size >= 1 and "
                f"start_step >= 0; got rank={rank}, world_size={world_size}, grad_accum={grad_accum}, "
                f"micro_batch_size={micro_batch_size}, start_step={start_step}"
            )
        self.mixture = mixture or Mixture(samples, seed, [(0, [1.0])])
        self.offsets = np.concatenate([[0], np.cumsum(samples)[:-1]]).tolist()
        self.num_samples, self.micro_batch_size, self.grad_accum = sum(samples), micro_batch_size, grad_accum
        self.world_size, self.rank, self.seed, self.start_step = world_size, rank, seed, start_step
        self.origin = origin  # (step, position) the stream counts from

    @property
    def positions_per_step(self) -> int:
        return self.micro_batch_size * self.grad_accum * self.world_size

    def first_position(self, step: int) -> int:
        """The first stream position read by the step after `step` (those before it have been read)."""
        origin_step, origin_position = self.origin
        return origin_position + (step - origin_step) * self.positions_per_step

    def positions(self, step: int, micro_step: int) -> range:
        """Stream positions this rank reads at (step, micro_step)."""
        first = (
            self.first_position(step)
            + micro_step * self.world_size * self.micro_batch_size
            + self.rank * self.micro_batch_size
        )
        return range(first, first + self.micro_batch_size)

    def epochs_after(self, steps: int) -> int:
        """Whole passes completed once `steps` optimizer steps have run, over the source read most often."""
        return int(max(self.mixture.epochs_before(self.first_position(steps))))

    def sample_at(self, position: int) -> int:
        source, sample = self.mixture(position)
        return self.offsets[source] + sample

    def __iter__(self) -> Iterator[list[int]]:
        step = self.start_step
        while True:
            for micro_step in range(self.grad_accum):
                yield [self.sample_at(p) for p in self.positions(step, micro_step)]
            step += 1


def validation_batches(
    num_samples: int, micro_batch_size: int, world_size: int, rank: int, eval_samples: int
) -> list[tuple[list[int], int]]:
    """This rank's micro-batches of the first `eval_samples` validation samples (all of them when the
    split holds fewer), each with the number of samples it counts for.

    The samples are the same whatever the world size, so val_loss compares across runs: batch b of
    them goes to rank b % world_size. Every rank runs the same number of batches (under FSDP each
    forward is a collective): a rank short of one runs a one-sample filler that counts for nothing.
    """
    if num_samples <= 0:
        raise DataMismatchError(
            "the validation split holds no complete sample of seq_len + 1 tokens; lower val_every or add documents"
        )
    samples = min(eval_samples, num_samples)
    starts = range(0, samples, micro_batch_size)
    batches = []
    for b in range(rank, -(-len(starts) // world_size) * world_size, world_size):
        if b < len(starts):
            indices = list(range(starts[b], min(starts[b] + micro_batch_size, samples)))
            batches.append((indices, len(indices)))
        else:
            batches.append(([0], 0))
    return batches


class ValidationBatches:
    """(tokens [n, seq_len + 1], samples it counts for) for each of this rank's validation batches."""

    def __init__(self, dataset: PackedDataset, batches: list[tuple[list[int], int]]) -> None:
        self.dataset, self.batches = dataset, batches
        self.held: list[tuple[torch.Tensor, int]] | None = None

    def fetch_now(self) -> ValidationBatches:
        """Every batch read now and held in memory (a few MB: the 1b's 160 samples are 2.6 MB): data in a
        store is fetched at the start, so no evaluation (the final one included) waits on the store."""
        self.held = list(self._read())
        return self

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        return iter(self.held) if self.held is not None else self._read()

    def _read(self) -> Iterator[tuple[torch.Tensor, int]]:
        for indices, counted in self.batches:
            yield stack_samples([self.dataset[i] for i in indices]), counted


def _split(
    data: DataConfig, location: Location, meta: dict[str, Any], split: str
) -> tuple[list[list[Path]], StoreData | None]:
    """Per source, its token files of `split` (meta.json's), and for data in a store the block cache that
    reads them (in the cache folder the door named); local files are checked and mapped."""
    if location.in_store:
        return _store_paths(meta, split), _store(data, location)
    return source_paths(location.folder, meta, split), None


def _store_paths(meta: dict[str, Any], split: str) -> list[list[Path]]:
    """Per source, its token files of `split`, relative to a data_dir URL (read through the store's cache)."""
    return [[Path(entry["file"]) for entry in source["splits"][split]["files"]] for source in meta["sources"]]


def _store(data: DataConfig, location: Location) -> StoreData:
    """The block cache of this training process for the data's URL (store/data/data_cache.py)."""
    from hf_pretrain.store.data.data_cache import StoreData

    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # the bound is the machine's, shared
    capacity = int(data.data_cache_gb * 1e9 / max(local_processes, 1))
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    return StoreData(location.given, location.cache, capacity, rank)


def _prefetching(sampler: StepBatchSampler, datasets: list[PackedDataset], workers: int) -> Any:
    """`sampler`, with a thread that fetches its batches' blocks ahead of the loader, in their order of use."""
    from hf_pretrain.store.data.data_cache import PrefetchingSampler, blocks_of, check_capacity

    store, offsets = datasets[0].store, sampler.offsets

    def blocks_for(batch: list[int]) -> list[tuple[str, int]]:
        spans = []
        for index in batch:
            source = bisect_right(offsets, index) - 1
            spans += datasets[source].spans(index - offsets[source])
        return blocks_of(spans, store.block_bytes)

    held = PREFETCH_FACTOR * max(workers, 1) + 1  # micro-batches handed to the workers, and the one being read
    first = iter(sampler)
    needed = len({block for _ in range(held + 1) for block in blocks_for(next(first))}) * store.block_bytes
    check_capacity(store.capacity_bytes, needed, "data_cache_gb", held + 1)
    return PrefetchingSampler(sampler, store, blocks_for, held)


def mixture_segments(sources: list[SourceConfig], decay_position: int | None) -> list[tuple[int, list[float]]]:
    """The weights' segments: the main weights from position 0; the decay weights (where any differs)
    from `decay_position`, the first position of the wsd decay or cooldown, when the run has one."""
    main = [s.weight for s in sources]
    decay = [s.decay_weight if s.decay_weight is not None else s.weight for s in sources]
    segments = [(0, main)]
    if decay_position is not None and decay != main:
        segments.append((decay_position, decay))
    return segments


def build_mixture(sources: list[SourceConfig], samples: list[int], decay_position: int | None, *, seed: int) -> Mixture:
    """The mixture of `sources` holding `samples` samples each, drawn with the run's `seed`."""
    return Mixture(samples, seed, mixture_segments(sources, decay_position))


def ignore_stop_signals(worker_id: int) -> None:
    """Workers leave SIGINT/SIGTERM to the training process, which finishes its step and saves a
    checkpoint; a Ctrl-C reaching the whole process group would otherwise kill the workers first.
    They die with the training process instead, however it ends (see `end_workers_at_exit`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent(signal.SIGKILL)


def end_workers_at_exit() -> None:
    """Kill the workers still alive when the training process exits. Python's own exit handler
    terminates daemon processes with SIGTERM, which workers ignore, then waits for them: after an
    uncaught exception (the loader still referenced by the traceback) it would wait forever. Run
    before that handler (atexit runs the last registered first); registering twice is harmless.
    torch's DataLoader turns a worker's death into a RuntimeError on SIGCHLD (a crash detector for a
    running loader); killing them here is the intent, so that handler is set back to the default first,
    or the exit would print a traceback ("DataLoader worker ... is killed by signal")."""
    if threading.current_thread() is threading.main_thread():  # signal handlers are the main thread's
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for process in multiprocessing.active_children():
        if process.daemon:  # DataLoader workers are daemons; a process started for other reasons is not
            process.kill()
            process.join(timeout=5)


class TrainData:
    """One rank's training and validation batches, built from the `data:` section with what the run knows
    at start-up by keyword (meta.json as read, the batch's shape, the seed). `loader` builds the training
    batches for a decay that starts at `decay_position` (None: none planned); the loop builds them again
    when that moves (a stop request or early stopping begins a cooldown), so the decay weights apply from
    its first step."""

    def __init__(
        self,
        data: DataConfig,
        location: Location,
        *,
        meta: dict[str, Any],
        rank: int,
        world_size: int,
        grad_accum: int,
        micro_batch_size: int,
        seed: int,
        pin_memory: bool = False,
    ):
        self.data, self.location, self.meta = data, location, meta
        self.rank, self.world_size, self.grad_accum = rank, world_size, grad_accum
        self.micro_batch_size, self.seed, self.pin_memory = micro_batch_size, seed, pin_memory
        self.names = [source_folder_name(i, s) for i, s in enumerate(data.sources)]
        self.sampler: StepBatchSampler | None = None
        self.decay_position: int | None = None

    def loader(self, start_step: int, origin: tuple[int, int], decay_position: int | None) -> DataLoader:
        """Endless [micro_batch_size, seq_len + 1] LongTensor batches for this rank, from `start_step` on
        (`origin`: see StepBatchSampler; `decay_position`: the first stream position of the decay, whose
        mixture the decay weights give)."""
        paths, store = _split(self.data, self.location, self.meta, "train")
        datasets = [PackedDataset(p, self.data.seq_len, self.meta["dtype"], self.data.preload, store) for p in paths]
        mixture = Mixture([len(d) for d in datasets], self.seed, mixture_segments(self.data.sources, decay_position))
        sampler = StepBatchSampler(
            mixture, self.micro_batch_size, self.grad_accum, self.world_size, self.rank, self.seed, start_step, origin
        )
        self.sampler, self.decay_position = sampler, decay_position
        workers = self.data.num_workers
        if datasets[0].store is not None:
            sampler = _prefetching(sampler, datasets, workers)
        if workers:
            atexit.unregister(end_workers_at_exit)
            atexit.register(end_workers_at_exit)
        worker_options: dict[str, Any] = (
            {"persistent_workers": True, "prefetch_factor": PREFETCH_FACTOR, "worker_init_fn": ignore_stop_signals}
            if workers
            else {}
        )
        return DataLoader(
            datasets[0] if len(datasets) == 1 else ConcatDataset(datasets),
            batch_sampler=sampler,
            collate_fn=stack_samples,
            num_workers=workers,
            pin_memory=self.pin_memory,
            **worker_options,
        )

    def val_loader(self, eval_tokens: int) -> ValidationBatches:
        """This rank's share of the first `eval_tokens` validation tokens (rounded up to whole sequences),
        in sequential micro-batches: the sources one after the other, the same samples on any world size."""
        paths, store = _split(self.data, self.location, self.meta, "validation")
        joined = [path for source in paths for path in source]
        dataset = PackedDataset(joined, self.data.seq_len, self.meta["dtype"], self.data.preload, store)
        samples = -(-eval_tokens // self.data.seq_len)
        batches = ValidationBatches(
            dataset, validation_batches(len(dataset), self.micro_batch_size, self.world_size, self.rank, samples)
        )
        return batches.fetch_now() if store is not None else batches  # a store's: read now, never at an evaluation

    def mixture_changes(self, decay_position: int | None) -> bool:
        """Whether a decay starting at `decay_position` reads another mixture than the batches built."""
        return mixture_segments(self.data.sources, decay_position) != mixture_segments(
            self.data.sources, self.decay_position
        )

    def epochs_after(self, steps: int) -> int:
        return self.sampler.epochs_after(steps)

    def source_tokens(self, steps: int) -> dict[str, int]:
        """Tokens trained on from each source (seq_len targets per sample) once `steps` steps have run."""
        draws = self.sampler.mixture.draws_before(self.sampler.first_position(steps))
        return {name: n * self.data.seq_len for name, n in zip(self.names, draws, strict=True)}


def sections_data(
    data: DataConfig,
    location: Location,
    train: TrainConfig,
    *,
    rank: int,
    world_size: int,
    grad_accum: int,
    fix: str = PREPARE_ANY,
    pin_memory: bool = False,
) -> TrainData:
    """The `TrainData` of the data section at `location` (the door's: a local folder, or a URL and the cache
    folder of its copy), meta.json read from it (a missing one names `fix`), with the batch and seed of the
    train section."""
    return TrainData(
        data,
        location,
        meta=read_meta(location, fix=fix),
        rank=rank,
        world_size=world_size,
        grad_accum=grad_accum,
        micro_batch_size=train.micro_batch_size,
        seed=train.seed,
        pin_memory=pin_memory,
    )
