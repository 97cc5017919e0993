"""The prepared data in a store, cut in fixed blocks, each with its own checksum.

Training draws samples in a global shuffle (mixing.py: every source reads its samples in a fresh
random permutation per epoch), so the first steps already touch nearly every shard: fetching whole
shards would mean fetching most of the data before step 1. A sample is a few KB (seq_len + 1 tokens),
so the loader reads the blocks that hold the samples it needs, by byte range. meta.json's SHA-256 is
per whole shard and cannot check a range, and sample bounds move with seq_len, so `prepare` records a
checksum per BLOCK_BYTES of each shard (fixed in bytes, whatever seq_len a run uses): a sidecar
`<shard>.blocks` of BLAKE2b-128 digests beside it, and `blocks.json` (the block size and each
sidecar's SHA-256) at the top, uploaded just before meta.json.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

BLOCK_BYTES = 1 << 16  # 64 KiB: 16 samples of the 1b (2049 uint16 tokens); 6 MB of sidecars per 24 GB
DIGEST_BYTES = 16
DIGEST = "blake2b-128"
BLOCKS_FILE = "blocks.json"
SIDECAR_SUFFIX = ".blocks"


def block_digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def block_count(size: int) -> int:
    return -(-size // BLOCK_BYTES)


def sidecar(path: Path) -> bytes:
    """The digests of `path`'s blocks, one after the other (one read of the file)."""
    out = bytearray()
    with path.open("rb") as f:
        while chunk := f.read(BLOCK_BYTES):
            out += block_digest(chunk)
    return bytes(out)


def shard_files(meta: dict[str, Any]) -> list[str]:
    """Every token file meta.json lists (both splits, every source), relative to the data folder."""
    return [entry["file"] for s in meta["sources"] for split in s["splits"].values() for entry in split["files"]]


def blocks_manifest(data_dir: Path, meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(blocks.json's content, each shard's sidecar) of a prepared local folder."""
    files, sidecars = {}, {}
    for name in shard_files(meta):
        path = data_dir / name
        sidecars[name] = sidecar(path)
        files[name] = {"bytes": path.stat().st_size, "sidecar_sha256": hashlib.sha256(sidecars[name]).hexdigest()}
    return {"block_bytes": BLOCK_BYTES, "digest": DIGEST, "files": files}, sidecars
