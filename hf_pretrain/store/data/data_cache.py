"""Training on data in a store: its small files in a local copy, its shards read through a bounded,
verified block cache, the blocks fetched ahead of use in the order the loader will read them.

- `synced_copy(url)`: meta.json, blocks.json, each source.json, the tokenizer and the block sidecars in
  the URL's local copy (`cache.local_copy(url, "data")`); meta.json written there last, so a copy with
  meta.json equal to the store's is complete and nothing is fetched again.
- `StoreData.read(file, start, end)`: bytes of a shard, assembled from BLOCK_BYTES blocks; a block is read
  from the cache or fetched by byte range, and checked against the digest `prepare` recorded. A mismatch
  is fetched once more, then `StoreDataCorrupt` names the shard: no step ever trains on wrong bytes.
- `PrefetchingSampler`: the batch sampler, followed by a thread that walks the same (deterministic) order
  ahead of the loader and fetches each block before its first use, in parallel; the cache holds at most
  `data_cache_gb`. What it evicts: never a block the loader still needs within the window it has planned
  (from the batches handed to the loader back a margin, to the furthest planned); among the others, the
  one used longest ago.

A sample is `seq_len + 1` tokens, a few KB, and the global shuffle touches every shard from the first step
(see data_blocks.py): whole shards would fetch most of the data before step 1, blocks fetch what is read.
"""

from __future__ import annotations

import copy
import hashlib
import heapq
import json
import os
import shutil
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from queue import Queue
from typing import Any

import numpy as np

from hf_pretrain.run_folder.sessions import start_up
from hf_pretrain.store.cache import local_copy
from hf_pretrain.store.data.data_blocks import BLOCKS_FILE, DIGEST, DIGEST_BYTES, SIDECAR_SUFFIX, block_digest
from hf_pretrain.store.store_calls import StoreError, read_bound_s, store_call
from hf_pretrain.store.urls import StoreUnavailable, StoreURL, filesystem

META_FILE = "meta.json"
BLOCKS_DIR = "blocks"  # in the local copy: the block cache (a folder per training process)
FETCH_THREADS = 16  # a GET costs 20-50 ms of latency: this many in flight keep ahead of any loader
LOOKAHEAD_BATCHES = 32  # micro-batches fetched ahead of those handed to the loader


class StoreDataCorrupt(StoreError):
    """A block of a shard that does not match its recorded checksum, fetched twice."""


class NotPrepared(StoreError):
    """The store holds no meta.json at the URL: not prepared, or its upload did not finish."""


# ---------------------------------------------------------------------- the small files
_SYNCED: dict[str, Path] = {}  # url -> its synced local copy, once per process


def synced_copy(url: str, cache_dir: str | Path | None = None) -> Path:
    """The local copy of the data at `url`, holding meta.json, blocks.json, the tokenizer, each
    source.json and the sidecars as the store has them (fetched once per process)."""
    if url in _SYNCED:
        return _SYNCED[url]
    with start_up.timed("data"):  # sessions.jsonl: what a session's start-up went to
        return _synced_copy(url, cache_dir)


def _synced_copy(url: str, cache_dir: str | Path | None) -> Path:
    try:
        store = StoreURL.parse(url)
        fs = filesystem(store)
    except StoreUnavailable as exc:  # its package not installed: the refusal names the pip extra
        raise StoreError(str(exc)) from None
    local = local_copy(store, "data", cache_dir)
    meta_bytes = _fetch(fs, store, META_FILE, missing_ok=True)
    if meta_bytes is None:
        raise NotPrepared(
            f"{store.join(META_FILE)} not found: the data is not prepared there (or its upload did not finish)"
        )
    mine = local / META_FILE
    if not (mine.is_file() and mine.read_bytes() == meta_bytes):
        _sync_small_files(fs, store, local, json.loads(meta_bytes))
        _write(mine, meta_bytes)  # last: the copy is complete
    _SYNCED[url] = local
    return local


def _sync_small_files(fs: Any, store: StoreURL, local: Path, meta: dict[str, Any]) -> None:
    (local / META_FILE).unlink(missing_ok=True)
    shutil.rmtree(local / BLOCKS_DIR, ignore_errors=True)  # blocks of other data under the same URL
    blocks = _fetch(fs, store, BLOCKS_FILE)
    manifest = json.loads(blocks)
    if manifest.get("digest") != DIGEST:
        raise StoreError(
            f"{store.join(BLOCKS_FILE)}: block checksums of kind {manifest.get('digest')}, this version checks "
            f"{DIGEST}: upload the data again with this version"
        )
    found = store_call(
        "listing",
        str(store.join("tokenizer")),
        lambda: fs.find(store.join("tokenizer").path),
        deadline_s=read_bound_s(),
    )
    names = [p.removeprefix(store.path + "/") for p in found]
    names += [f"{s['folder']}/source.json" for s in meta["sources"]]
    names += [f"{name}{SIDECAR_SUFFIX}" for name in manifest["files"]]
    with ThreadPoolExecutor(FETCH_THREADS) as pool:
        for name, data in zip(names, pool.map(lambda n: _fetch(fs, store, n), names), strict=True):
            if name.endswith(SIDECAR_SUFFIX):
                expected = manifest["files"][name.removesuffix(SIDECAR_SUFFIX)]["sidecar_sha256"]
                if hashlib.sha256(data).hexdigest() != expected:
                    raise StoreDataCorrupt(
                        f"{store.join(name)}: its SHA-256 differs from {BLOCKS_FILE}'s: the store's copy is damaged; "
                        f"upload it again (`hf-pretrain prepare` on the machine that prepared it) or prepare again"
                    )
            _write(local / name, data)
    _write(local / BLOCKS_FILE, blocks)


def _fetch(
    fs: Any, store: StoreURL, name: str, missing_ok: bool = False, start: int | None = None, end: int | None = None
) -> bytes | None:
    where = store.join(name)
    try:
        return store_call(
            "reading", str(where), lambda: fs.cat_file(where.path, start=start, end=end), deadline_s=read_bound_s()
        )
    except FileNotFoundError:
        if missing_ok:
            return None
        raise StoreError(f"{where} not found: the data in the store is incomplete; prepare it again") from None


def _write(path: Path, data: bytes) -> None:
    """Atomically: a reader (another process of the run) sees the whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# ---------------------------------------------------------------------- the shards, in blocks
class StoreData:
    """The shards of the data at `url`, read through the block cache of this training process.

    Pickles as its URL and folders: each DataLoader worker opens its own connection, reads the same
    cache, and fetches a block itself only when the prefetcher has not (yet) brought it.
    """

    def __init__(self, url: str, cache_dir: str | Path | None, capacity_bytes: int, rank: int = 0) -> None:
        self.url = url
        self.local = synced_copy(url, cache_dir)
        self.blocks_dir = self.local / BLOCKS_DIR / f"rank{rank}"
        self.capacity_bytes = capacity_bytes
        manifest = json.loads((self.local / BLOCKS_FILE).read_text())
        self.block_bytes = int(manifest["block_bytes"])  # what `prepare` cut the shards in (data_blocks.py)
        self.sizes = {k: v["bytes"] for k, v in manifest["files"].items()}
        self._fs: tuple[int, Any] | None = None
        self._digests: dict[str, bytes] = {}

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"_fs": None, "_digests": {}}

    def _filesystem(self) -> Any:
        if self._fs is None or self._fs[0] != os.getpid():  # a forked worker opens its own connections
            self._fs = (os.getpid(), filesystem(StoreURL.parse(self.url)))
        return self._fs[1]

    def size(self, file: str | Path) -> int:
        return self.sizes[str(file)]

    def open_shards(self, files: list[Path], dtype: np.dtype) -> list[StoreShard]:
        return [StoreShard(self, str(f), dtype) for f in files]

    def block_path(self, file: str, block: int) -> Path:
        return self.blocks_dir / file / f"{block:07d}"

    def read(self, file: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of `file`."""
        first, last = start // self.block_bytes, (end - 1) // self.block_bytes
        data = b"".join(self.block(file, b) for b in range(first, last + 1))
        offset = start - first * self.block_bytes
        return data[offset : offset + end - start]

    def block(self, file: str, block: int) -> bytes:
        """One block, verified: from the cache, else from the store (and then kept in the cache)."""
        path = self.block_path(file, block)
        try:
            data = path.read_bytes()
            if block_digest(data) == self._digest(file, block):
                return data
            path.unlink(missing_ok=True)  # a damaged cache file: fetched again
        except FileNotFoundError:
            pass
        data = self.fetch(file, block)
        _write(path, data)
        return data

    def fetch(self, file: str, block: int) -> bytes:
        start = block * self.block_bytes
        end = min(start + self.block_bytes, self.sizes[file])
        store = StoreURL.parse(self.url)
        for _ in range(2):  # a mismatch is fetched once more: a transfer can be torn, the store's bytes not
            data = _fetch(self._filesystem(), store, file, start=start, end=end)
            if len(data) == end - start and block_digest(data) == self._digest(file, block):
                return data
        raise StoreDataCorrupt(
            f"{store.join(file)}: bytes {start:,}-{end:,} (block {block}) do not match the checksum `prepare` recorded, "
            f"fetched twice: the store's copy of the shard is damaged; upload it again from the machine that prepared "
            f"it (the same `hf-pretrain prepare`), or prepare the data again into a new prefix"
        )

    def _digest(self, file: str, block: int) -> bytes:
        if file not in self._digests:
            self._digests[file] = (self.local / f"{file}{SIDECAR_SUFFIX}").read_bytes()
        return self._digests[file][block * DIGEST_BYTES : (block + 1) * DIGEST_BYTES]


class StoreShard:
    """A shard as the packed dataset slices it: `shard[a:b]` -> the tokens a..b, read through the cache."""

    def __init__(self, data: StoreData, file: str, dtype: np.dtype) -> None:
        self.data, self.file, self.dtype = data, file, np.dtype(dtype)

    def __getitem__(self, tokens: slice) -> np.ndarray:
        size = self.dtype.itemsize
        if tokens.start >= tokens.stop:
            return np.empty(0, self.dtype)
        return np.frombuffer(self.data.read(self.file, tokens.start * size, tokens.stop * size), dtype=self.dtype)


def blocks_of(spans: Iterable[tuple[str, int, int]], block_bytes: int) -> list[tuple[str, int]]:
    """The blocks that hold the byte spans (file, start, end), each once, in order of first use."""
    out: dict[tuple[str, int], None] = {}
    for file, start, end in spans:
        for block in range(start // block_bytes, (end - 1) // block_bytes + 1):
            out[(file, block)] = None
    return list(out)


# ---------------------------------------------------------------------- fetching ahead
class Prefetcher:
    """Fetches the blocks of the planned micro-batches ahead of the loader, within `capacity` bytes.

    `plan` yields each micro-batch's blocks in the order the loader will read them; `handed(k)` says the
    loader has been given micro-batch k. Uses of micro-batches older than `margin` before the handed one
    are released (a loader worker may still be reading those a little behind).
    """

    def __init__(self, data: StoreData, plan: Iterator[list[tuple[str, int]]], margin: int) -> None:
        self.data, self.plan, self.margin = data, plan, margin
        self.lock = threading.Condition()
        self.handed_upto = -1
        self.need: Counter[tuple[str, int]] = Counter()  # uses planned and not yet released
        self.cached: dict[tuple[str, int], int] = {}  # block -> bytes (fetched, or being fetched)
        self.last_use: dict[tuple[str, int], int] = {}
        self.evictable: list[tuple[int, tuple[str, int]]] = []  # heap of (last use, block), stale entries skipped
        self.window: deque[list[tuple[str, int]]] = deque()
        self.window_start = 0
        self.used = 0
        self.error: BaseException | None = None
        self.stopped = False
        self._adopt_cached()
        # daemon threads, not an executor: a process that ends (or a store that stopped answering) never
        # waits at exit for fetches nobody will read
        self.queue: Queue[tuple[str, int] | None] = Queue()
        for _ in range(FETCH_THREADS):
            threading.Thread(target=self._fetcher, name="store-fetch", daemon=True).start()
        self.thread = threading.Thread(target=self._run, name="store-prefetch", daemon=True)
        self.thread.start()

    def _adopt_cached(self) -> None:
        """Blocks a previous session left in this process's cache folder count, evictable first."""
        root = self.data.blocks_dir
        if not root.is_dir():
            return
        for path in root.rglob("*"):
            if path.is_file() and not path.name.endswith(".tmp"):
                key = (str(path.parent.relative_to(root)), int(path.name))
                self.cached[key] = path.stat().st_size
                self.used += self.cached[key]
                self.last_use[key] = -1
                heapq.heappush(self.evictable, (-1, key))

    def handed(self, batch: int) -> None:
        with self.lock:
            self.handed_upto = batch
            self.lock.notify_all()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            self.lock.notify_all()
        for _ in range(FETCH_THREADS):
            self.queue.put(None)

    def _run(self) -> None:
        try:
            for index, blocks in enumerate(self.plan):
                with self.lock:
                    while not self.stopped and index > self.handed_upto + LOOKAHEAD_BATCHES:
                        self.lock.wait(0.5)
                        self._release()
                    if self.stopped:
                        return
                    self._release()
                    self.window.append(blocks)
                    for key in blocks:
                        self.need[key] += 1
                        self.last_use[key] = index
                    todo = [key for key in blocks if key not in self.cached]
                for key in todo:
                    if not self._make_room(self.data.block_bytes):
                        return
                    with self.lock:
                        self.cached[key] = self.data.block_bytes
                        self.used += self.data.block_bytes
                    self.queue.put(key)
        except BaseException as exc:  # the loader reads the same blocks itself and reports the same error
            self.error = exc

    def _fetcher(self) -> None:
        while (key := self.queue.get()) is not None and not self.stopped:
            try:
                self.data.block(*key)
            except BaseException as exc:  # the loader fetches the block itself and reports the same error
                self.error = exc

    def _release(self) -> None:
        """Forget the uses of micro-batches the loader is done with; their blocks become evictable."""
        while self.window and self.window_start < self.handed_upto - self.margin:
            for key in self.window.popleft():
                self.need[key] -= 1
                if self.need[key] <= 0:
                    del self.need[key]
                    heapq.heappush(self.evictable, (self.last_use[key], key))
            self.window_start += 1

    def _make_room(self, size: int) -> bool:
        """Evict until `size` more bytes fit; waits while every cached block is still needed. False: stopped."""
        with self.lock:
            while self.used + size > self.data.capacity_bytes:
                while self.evictable:
                    last, key = heapq.heappop(self.evictable)
                    if key in self.cached and key not in self.need and self.last_use.get(key) == last:
                        self.used -= self.cached.pop(key)
                        self.data.block_path(*key).unlink(missing_ok=True)
                        break
                else:
                    if self.stopped:
                        return False
                    self.lock.wait(0.5)  # the loader moves on and releases uses
                    self._release()
            return not self.stopped


class PrefetchingSampler:
    """A batch sampler that hands out `inner`'s batches and has a `Prefetcher` fetch their blocks ahead.

    `blocks_for(batch)` maps a batch of sample indices to its blocks. Everything else (the mixture, the
    positions) is `inner`'s; a pickled copy (a worker's, the preflight's) is `inner` alone, fetching nothing.
    """

    def __init__(
        self, inner: Any, data: StoreData, blocks_for: Callable[[list[int]], list[tuple[str, int]]], margin: int
    ) -> None:
        self.inner, self.data, self.blocks_for, self.margin = inner, data, blocks_for, margin
        self.prefetcher: Prefetcher | None = None

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # before __init__ or __setstate__ set it
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __getstate__(self) -> dict[str, Any]:
        return {"inner": self.inner, "data": None, "blocks_for": None, "margin": 0, "prefetcher": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __iter__(self) -> Iterator[list[int]]:
        if self.data is None:
            yield from self.inner
            return
        if self.prefetcher is not None:
            self.prefetcher.stop()
        plan = copy.deepcopy(self.inner)  # its own mixture: the two walks never share a permutation cache
        self.prefetcher = Prefetcher(self.data, (self.blocks_for(batch) for batch in plan), self.margin)
        try:
            for index, batch in enumerate(self.inner):
                self.prefetcher.handed(index)
                yield batch
        finally:
            self.prefetcher.stop()


def check_capacity(capacity_bytes: int, needed_bytes: int, key: str, batches: int) -> None:
    """A cache smaller than the blocks the loader holds at once: one line naming the key and the size needed."""
    if capacity_bytes < needed_bytes:
        gb = -(-needed_bytes * 1000 // 10**9) / 1000
        raise StoreError(
            f"{key}={capacity_bytes / 1e9:g} caches {capacity_bytes / 1e6:,.3f} MB of data blocks, fewer than the "
            f"{needed_bytes / 1e6:,.3f} MB of the {batches} micro-batches the loader and its workers hold at once: "
            f"set --{key} {gb:g} or more"
        )
