"""Shard verification speed: `verify_shards` (SHA-256 + token-id range check) against a bare
`hashlib.file_digest` of the same bytes, and what that means for a 24 GB prepared corpus.

    python benchmarks/bench_verify.py [--gib 1]
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from pathlib import Path

import numpy as np

from hf_pretrain.data.verify import verify_shards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the synthetic shard (default: 1 GiB)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        data_dir = Path(scratch)
        tokens = np.random.default_rng(0).integers(0, 32000, int(args.gib * 2**30) // 2, dtype=np.uint16)
        tokens.tofile(data_dir / "train_00000.bin")
        sha = hashlib.sha256(tokens.data).hexdigest()
        del tokens
        meta = {
            "dtype": "uint16",
            "vocab_size": 32005,
            "splits": {"train": {"shards": [{"file": "train_00000.bin", "sha256": sha}]}, "validation": {"shards": []}},
        }
        path = data_dir / "train_00000.bin"
        size = path.stat().st_size
        path.read_bytes()  # warm the page cache for both, so both measure the CPU side
        start = time.perf_counter()
        with path.open("rb") as f:
            hashlib.file_digest(f, "sha256")
        bare = time.perf_counter() - start
        start = time.perf_counter()
        verify_shards(data_dir, meta, trust_recorded=False, log=lambda _: None)
        ours = time.perf_counter() - start
        start = time.perf_counter()
        verify_shards(data_dir, meta, trust_recorded=True, log=lambda _: None)
        trusted = time.perf_counter() - start
    print(f"shard: {size / 2**30:.2f} GiB")
    print(f"bare hashlib.file_digest: {size / bare / 1e9:.2f} GB/s")
    print(f"verify_shards (hash + range check): {size / ours / 1e9:.2f} GB/s  ratio {bare / ours:.2f}x of bare hashing")
    print(f"verify_shards with a matching record: {trusted * 1e3:.1f} ms")
    print(f"a 24 GB corpus: {24e9 / (size / ours) / 60:.1f} min to verify in full (doctor), from a warm cache")


if __name__ == "__main__":
    main()
