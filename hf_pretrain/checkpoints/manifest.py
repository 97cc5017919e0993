"""The manifest that makes a checkpoint whole or absent: every file with its size and checksum.

A checkpoint is written as `step_N.tmp/`, gets its manifest, is flushed, and only then renamed to
`step_N/`. A folder without the suffix whose files match its manifest is complete; anything else
is refused with the reason (`CheckpointError`). The manifest names its checksum (`checksum`:
xxh3_128, checkpoints/checksum.py); one without that key is of format 1, SHA-256, and verifies as such.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hf_pretrain.checkpoints.checksum import ALGORITHM, CHECKSUM_OF_OLD_MANIFESTS, file_checksum
from hf_pretrain.checkpoints.layout import MANIFEST, TMP_SUFFIX, TRAIN_STATE
from hf_pretrain.checkpoints.progress import ByteCount, LiveLine

FORMAT_VERSION = 2  # 1: SHA-256, implied; 2: the algorithm named in `checksum`


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (unfinished, torn, corrupt, or not of this kind), with the reason."""


class CheckpointMismatch(CheckpointError):
    """A complete checkpoint that does not fit this run (another model shape, optimizer or setup): the
    run stops, naming what differs, rather than skip it (older ones would not fit either) or start
    over in a folder that holds a run."""


def fsync(path: Path) -> None:
    """Flush a file or a folder (its entries: a rename inside it) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(folder: Path, known: dict[str, str] | None = None, count: ByteCount | None = None) -> None:
    """List every file of `folder` with its size and checksum, then flush them all to the disk.
    `known` holds the checksums computed as files were written (name relative to `folder` ->
    checksum, those files flushed already): only the others are read here (small ones, but for a
    `save_state` under FSDP), counted into `count`."""
    known = known or {}
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {}
    for p in files:
        name = str(p.relative_to(folder))
        if name not in known and count is not None:
            count.grow(p.stat().st_size)
        entries[name] = {"bytes": p.stat().st_size, ALGORITHM: known.get(name) or file_checksum(p, count=count)}
        if name not in known:
            fsync(p)
    manifest = {"format_version": FORMAT_VERSION, "checksum": ALGORITHM, "files": entries}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
    fsync(folder / MANIFEST)
    fsync(folder)


def verify_checkpoint(folder: Path, checksums: bool = True, count: ByteCount | None = None) -> dict[str, Any]:
    """The checkpoint's train state if every file the manifest lists is there and intact; `count`
    gets the bytes checked as they are read (a `LiveLine` shows them: checkpoints/store.py)."""
    if folder.name.endswith(TMP_SUFFIX):
        raise CheckpointError(f"{folder} is an unfinished write (.tmp)")
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{folder} has no {MANIFEST}: the save did not finish")
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
        algorithm = manifest.get("checksum", CHECKSUM_OF_OLD_MANIFESTS)
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{manifest_path} is unreadable: {exc}") from exc
    if checksums and count is not None:
        count.grow(sum(entry.get("bytes", 0) for entry in files.values()))
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{folder}: {name} is missing")
        if path.stat().st_size != entry["bytes"]:
            raise CheckpointError(
                f"{folder}: {name} has {path.stat().st_size} bytes, the manifest says {entry['bytes']}"
            )
        if checksums and _checksum(path, algorithm, count) != entry.get(algorithm):
            raise CheckpointError(
                f"{folder}: {name} fails its checksum ({algorithm}): its bytes changed since the save"
            )
    if TRAIN_STATE not in files:
        raise CheckpointError(f"{folder} has no {TRAIN_STATE}")
    try:
        return json.loads((folder / TRAIN_STATE).read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{folder}/{TRAIN_STATE} is unreadable: {exc}") from exc


def verify_showing(
    folder: Path,
    checksums: bool = True,
    say: Callable[[str], None] | None = None,
    activity: Callable[[str | None], None] | None = None,
) -> dict[str, Any]:
    """`verify_checkpoint`, with a live line through `say` (bytes checked of the total, the rate) and
    status.json's `activity` set to `verifying` when it lasts more than a few seconds."""
    count = ByteCount()
    with LiveLine(f"verifying {folder.name}", count, say if checksums else None, activity):
        return verify_checkpoint(folder, checksums, count)


def _checksum(path: Path, algorithm: str, count: ByteCount | None) -> str:
    try:
        return file_checksum(path, algorithm, count)
    except ValueError as exc:  # a manifest naming a checksum this version does not know
        raise CheckpointError(f"{path.parent}/{MANIFEST}: {exc}") from exc


def train_state_flag(folder: Path, key: str) -> bool:
    """A true/false key of the folder's train state, false when it cannot be read (no verification)."""
    try:
        return bool(json.loads((folder / TRAIN_STATE).read_text()).get(key))
    except (OSError, ValueError, AttributeError):
        return False
