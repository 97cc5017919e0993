"""Shards checked against meta.json before anything trains on them: SHA-256 and token ids in range.

A flipped byte in a shard otherwise trains silently, and a flipped high bit makes a token id past
the vocabulary that crashes the embedding lookup hours into a run. Hashing 24 GB takes minutes, so
a verification is recorded beside the data (`verified.json`: size, mtime and hash per shard) and
training trusts a record that still matches the file; `hf-pretrain doctor` always hashes everything.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from hf_pretrain.run_folder.json_files import write_json_atomically

VERIFIED_FILE = "verified.json"
CHUNK_BYTES = 16 * 2**20  # a multiple of every token dtype's size, so chunks split between tokens


class ShardCorruptError(RuntimeError):
    """A shard whose bytes are not what `prepare` wrote."""


def _record_matches(record: dict[str, Any] | None, path: Path, sha256: str) -> bool:
    if not record:
        return False
    stat = path.stat()
    return record == {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256}


def _hash_and_range_check(path: Path, dtype: np.dtype, vocab_size: int, bar: tqdm | None) -> str:
    """SHA-256 of the file, failing at the first token id >= vocab_size with its position."""
    digest = hashlib.sha256()
    offset = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
            tokens = np.frombuffer(chunk, dtype=dtype, count=len(chunk) // dtype.itemsize)
            if tokens.size and int(tokens.max()) >= vocab_size:
                index = int(np.argmax(tokens >= vocab_size))
                position = offset // dtype.itemsize + index
                raise ShardCorruptError(
                    f"{path}: token id {int(tokens[index])} at token {position:,} (byte offset "
                    f"{offset + index * dtype.itemsize:,}) is past the vocabulary of {vocab_size:,} tokens: the "
                    f"shard is damaged or was written with another tokenizer; prepare the data again"
                )
            offset += len(chunk)
            if bar is not None:
                bar.update(len(chunk))
    return digest.hexdigest()


def verify_shards(
    data_dir: str | Path,
    meta: dict[str, Any],
    *,
    trust_recorded: bool = True,
    progress: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, int]:
    """Check every shard meta.json lists; returns {"hashed": bytes, "trusted": bytes}.

    With `trust_recorded`, a shard whose recorded verification still matches its size and mtime
    is not read again. Raises `ShardCorruptError` naming the shard and what is wrong.
    """
    data_dir = Path(data_dir)
    dtype, vocab_size = np.dtype(meta["dtype"]), int(meta["vocab_size"])
    shards = [shard for split in meta["splits"].values() for shard in split["shards"]]
    record_file = data_dir / VERIFIED_FILE
    try:
        records = json.loads(record_file.read_text()).get("shards", {}) if record_file.is_file() else {}
    except (OSError, json.JSONDecodeError):
        records = {}  # an unreadable record only costs a new verification
    todo = [
        s
        for s in shards
        if not (trust_recorded and _record_matches(records.get(s["file"]), data_dir / s["file"], s["sha256"]))
    ]
    sizes = {s["file"]: (data_dir / s["file"]).stat().st_size for s in shards}
    hashed = sum(sizes[s["file"]] for s in todo)
    bar = tqdm(total=hashed, unit="B", unit_scale=True, desc="verifying shards", disable=not progress or not todo)
    try:
        for shard in todo:
            path = data_dir / shard["file"]
            found = _hash_and_range_check(path, dtype, vocab_size, bar)
            if found != shard["sha256"]:
                raise ShardCorruptError(
                    f"{path}: SHA-256 {found[:16]}... differs from {shard['sha256'][:16]}... in meta.json: the file "
                    f"changed after `prepare` wrote it (a flipped byte, a partial copy); restore it or prepare again"
                )
            stat = path.stat()
            records[shard["file"]] = {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": found}
    finally:
        bar.close()
    if todo:
        _write_records(record_file, records, log)
    return {"hashed": hashed, "trusted": sum(sizes.values()) - hashed}


def _write_records(path: Path, records: dict[str, Any], log: Callable[[str], None]) -> None:
    payload = {"verified_at": datetime.now(UTC).isoformat(timespec="seconds"), "shards": records}
    try:
        write_json_atomically(path, payload)  # several processes may verify at once
    except OSError as exc:  # read-only data: verification still happened, it is just not remembered
        log(f"note: could not record the shard verification in {path} ({exc.strerror}); it will run again")
