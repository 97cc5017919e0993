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
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/object_store_server.py


def tokens_per_second(recipe, batches: int) -> tuple[float, float]:
    """(tokens/s over `batches` micro-batches, seconds to the first batch) of a fresh loader."""
    from hf_pretrain.data import build_train_loader

    started = time.perf_counter()
    loader = iter(build_train_loader(recipe, 0, 1, recipe.grad_accum_steps(1), 0))
    first = next(loader)
    first_at = time.perf_counter() - started
    tokens = first[:, 1:].numel()
    for _ in range(batches - 1):
        tokens += next(loader)[:, 1:].numel()
    seconds = time.perf_counter() - started
    del loader
    return tokens / seconds, first_at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data_dir", help="a prepared smoke folder (default: prepare one in a scratch folder)")
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--seq_len", type=int, default=2048)
    parser.add_argument("--micro_batch_size", type=int, default=8)
    parser.add_argument("--num_workers", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from hf_pretrain.config import load_recipe
    from hf_pretrain.data import prepare
    from hf_pretrain.object_store import data_cache
    from hf_pretrain.object_store.data_cache import StoreData
    from hf_pretrain.object_store.data_upload import upload_prepared
    from hf_pretrain.object_store.urls import StoreURL, filesystem
    from tests.object_store_server import running_s3_server

    with tempfile.TemporaryDirectory() as scratch, running_s3_server() as server:
        os.environ.update(server.env)
        os.environ["HF_PRETRAIN_HOME"] = str(Path(scratch) / "home")
        data_dir = Path(args.data_dir) if args.data_dir else Path(scratch) / "smoke"
        if not args.data_dir:
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
        }
        fetched = []
        real_fetch = StoreData.fetch
        StoreData.fetch = lambda self, f, b: fetched.append(b) or real_fetch(self, f, b)  # counted in this process
        local_rate, local_first = tokens_per_second(
            load_recipe("smoke", {"data_dir": str(data_dir), **shape}), args.batches
        )
        started = time.perf_counter()
        data_cache._SYNCED.clear()
        store_rate, store_first = tokens_per_second(load_recipe("smoke", {"data_dir": url, **shape}), args.batches)
        samples = args.batches * args.micro_batch_size
        print(f"upload of the prepared folder: {upload_s:.1f} s")
        print(f"local data_dir : {local_rate:12,.0f} tokens/s, first batch after {local_first:.2f} s")
        print(
            f"s3:// (cold)   : {store_rate:12,.0f} tokens/s, first batch after {store_first:.2f} s (metadata sync included)"
        )
        print(f"ratio store/local: {store_rate / local_rate:.3f}")
        print(
            f"blocks fetched by the prefetcher: {len(fetched)} GETs of <= 64 KiB for {samples} samples "
            f"({len(fetched) / samples:.2f} per sample; the workers' own fetches, if any, are not counted)"
        )


if __name__ == "__main__":
    main()
