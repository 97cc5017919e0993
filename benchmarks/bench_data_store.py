"""The loader's tokens/s with data_dir in a store (moto's S3 server on localhost, an empty cache) against the
same data in a local folder, in one run: the ratio, the GETs and the bytes fetched per sample.

    python benchmarks/bench_data_store.py [--data_dir PREPARED] [--batches 60] [--seq_len 2048]

Without --data_dir it prepares the smoke corpus first (about a minute). The samples are the 1b's shape
(seq_len 2048, micro-batches of 8) unless told otherwise; moto serves from this process, so its threads
compete with the prefetcher's for the CPU: a real store is slower per request (20-50 ms) but not busier here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/object_store_server.py


def tokens_per_second(recipe, batches: int) -> tuple[float, float, float]:
    """(tokens/s over `batches` micro-batches, seconds to the first batch, tokens/s after it) of a fresh loader."""
    from tests.helpers import build_train_loader

    started = time.perf_counter()
    loader = iter(build_train_loader(recipe, 0, 1, recipe.grad_accum_steps(1), 0))
    first = next(loader)
    first_at = time.perf_counter() - started
    tokens = first[:, 1:].numel()
    for _ in range(batches - 1):
        tokens += next(loader)[:, 1:].numel()
    seconds = time.perf_counter() - started
    del loader
    return tokens / seconds, first_at, (tokens - first[:, 1:].numel()) / (seconds - first_at)


class LatencyStore:
    """A stand-in for the store's file system: `cat_file` of a byte range after `latency` seconds, from the local
    folder that was uploaded (the same bytes), in any number of threads at once, as S3 serves them."""

    def __init__(self, local: Path, url: str, latency: float) -> None:
        self.local, self.prefix, self.latency = local, url.removeprefix("s3://") + "/", latency

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        time.sleep(self.latency)
        with (self.local / path.removeprefix(self.prefix)).open("rb") as f:
            f.seek(start or 0)
            return f.read((end - (start or 0)) if end is not None else -1)


def synthetic_data(data_dir: Path, megabytes: float) -> None:
    """A prepared folder of random uint16 tokens in the smoke recipe's two sources (10% / 90%), one document
    per shard: what the loader reads (meta.json, shards and their index), not a real corpus."""
    import json

    import numpy as np

    rng, sources = np.random.default_rng(0), []
    for index, (name, share) in enumerate((("python-docs", 0.1), ("python-stdlib", 0.9))):
        folder, splits = f"sources/{index:02d}-{name}", {}
        for split, tokens in (("train", int(megabytes * 1e6 * share / 2)), ("validation", 10_000)):
            path = data_dir / folder / split / "00000.ds"
            path.parent.mkdir(parents=True, exist_ok=True)
            rng.integers(0, 4096, tokens, dtype=np.uint16).tofile(path)
            np.array([tokens], dtype="<u8").tofile(f"{path}.index")
            files = [{"file": f"{folder}/{split}/00000.ds", "tokens": tokens, "documents": 1, "sha256": ""}]
            splits[split] = {"tokens": tokens, "documents": 1, "files": files}
        (data_dir / folder / "source.json").write_text(json.dumps({"name": name, "splits": splits}))
        sources.append({"name": f"{index:02d}-{name}", "folder": folder, "splits": splits})
    (data_dir / "tokenizer").mkdir()
    (data_dir / "tokenizer" / "tokenizer.json").write_text("{}")
    totals = {
        split: {"tokens": sum(s["splits"][split]["tokens"] for s in sources), "shards": []}
        for split in ("train", "validation")
    }
    meta = {"dtype": "uint16", "vocab_size": 4096, "splits": totals, "sources": sources}
    (data_dir / "meta.json").write_text(json.dumps(meta))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data_dir", help="a prepared smoke folder (default: prepare one in a scratch folder)")
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--seq_len", type=int, default=2048)
    parser.add_argument("--micro_batch_size", type=int, default=8)
    parser.add_argument("--num_workers", type=int, default=1)
    parser.add_argument(
        "--latency_ms",
        type=float,
        default=0,
        help="instead of moto: each block GET reads the uploaded bytes from local disk after sleeping this long "
        "(a real store's 20-50 ms, without moto's cost of copying the whole object per range GET)",
    )
    parser.add_argument(
        "--synthetic_mb",
        type=float,
        default=0,
        help="instead of the smoke corpus (42 blocks: cached after its first reads), random tokens of this size in "
        "the smoke recipe's two sources, so that nearly every sample is a cache miss",
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from hf_pretrain.config import load_recipe
    from hf_pretrain.data.prepare_run import prepare
    from hf_pretrain.store.data import data_cache
    from hf_pretrain.store.data.data_cache import StoreData
    from hf_pretrain.store.data.data_upload import upload_prepared
    from hf_pretrain.store.urls import StoreURL, filesystem
    from tests.object_store_server import running_s3_server

    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as scratch, running_s3_server() as server:
        os.environ.update(server.env)
        os.environ["HF_PRETRAIN_HOME"] = str(Path(scratch) / "home")
        data_dir = Path(scratch) / "smoke"
        if args.synthetic_mb:
            synthetic_data(data_dir, args.synthetic_mb)
        elif args.data_dir:  # a copy: the upload writes the block sidecars beside the shards
            shutil.copytree(args.data_dir, data_dir, ignore=shutil.ignore_patterns("logs", "*.blocks", "blocks.json"))
        else:
            prepare(load_recipe("smoke", {"data_dir": str(data_dir)}), log=lambda _: None)
        url = server.make_bucket("bench") + "/smoke"
        started = time.perf_counter()
        upload_prepared(data_dir, StoreURL.parse(url), filesystem(StoreURL.parse(url)), log=lambda _: None)
        upload_s = time.perf_counter() - started
        shape = {
            "seq_len": args.seq_len,
            "micro_batch_size": args.micro_batch_size,
            "global_batch_tokens": args.seq_len * args.micro_batch_size,
            "num_workers": args.num_workers,
            "max_position_embeddings": args.seq_len,
        }
        fetched = []
        real_fetch = StoreData.fetch
        StoreData.fetch = lambda self, f, b: fetched.append(b) or real_fetch(self, f, b)  # counted in this process
        local_rate, local_first, local_steady = tokens_per_second(
            load_recipe("smoke", {"data_dir": str(data_dir), **shape}), args.batches
        )
        data_cache._SYNCED.clear()
        started = time.perf_counter()
        data_cache.synced_copy(url)
        sync_s = time.perf_counter() - started
        data_cache._SYNCED.clear()
        shutil.rmtree(Path(scratch) / "home")  # cold again: the loader below syncs and fetches everything
        if args.latency_ms:
            StoreData._filesystem = lambda self: LatencyStore(data_dir, url, args.latency_ms / 1000)
        store_rate, store_first, store_steady = tokens_per_second(
            load_recipe("smoke", {"data_dir": url, **shape}), args.batches
        )
        samples = args.batches * args.micro_batch_size
        print(f"upload of the prepared folder: {upload_s:.1f} s")
        print(f"metadata sync alone (meta, blocks.json, tokenizer, source.json, sidecars): {sync_s:.2f} s")
        print(
            f"local data_dir : {local_rate:12,.0f} tokens/s, first batch after {local_first:.2f} s, "
            f"{local_steady:12,.0f} tokens/s after it"
        )
        print(
            f"s3:// (cold)   : {store_rate:12,.0f} tokens/s, first batch after {store_first:.2f} s, "
            f"{store_steady:12,.0f} tokens/s after it"
        )
        where = f"a {args.latency_ms:g} ms stand-in" if args.latency_ms else "moto on localhost"
        print(f"store: {where}; {args.batches} micro-batches of {args.micro_batch_size} x {args.seq_len}")
        print(
            f"ratio store/local: {store_rate / local_rate:.3f} overall, "
            f"{store_steady / local_steady:.3f} after the first batch"
        )
        print(
            f"blocks fetched by the prefetcher: {len(fetched)} GETs of <= 64 KiB for {samples} samples "
            f"({len(fetched) / samples:.2f} per sample; the workers' own fetches, if any, are not counted)"
        )


if __name__ == "__main__":
    main()
