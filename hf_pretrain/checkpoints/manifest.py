"""The manifest that makes a checkpoint whole or absent: every file with its size and SHA-256.

A checkpoint is written as `step_N.tmp/`, gets its manifest, is flushed, and only then renamed to
`step_N/`. A folder without the suffix whose files match its manifest is complete; anything else
is refused with the reason (`CheckpointError`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from hf_pretrain.checkpoints.layout import MANIFEST, TMP_SUFFIX, TRAIN_STATE


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (unfinished, torn, corrupt, or not of this kind), with the reason."""


class CheckpointMismatch(CheckpointError):
    """A complete checkpoint that does not fit this run (another model shape, optimizer or setup): the
    run stops, naming what differs, rather than skip it (older ones would not fit either) or start
    over in a folder that holds a run."""


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fsync(path: Path) -> None:
    """Flush a file or a folder (its entries: a rename inside it) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(folder: Path) -> None:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": sha256(p)} for p in files}
    for p in files:
        fsync(p)
    (folder / MANIFEST).write_text(json.dumps({"format_version": 1, "files": entries}, indent=1))
    fsync(folder / MANIFEST)
    fsync(folder)


def verify_checkpoint(folder: Path, checksums: bool = True) -> dict[str, Any]:
    """The checkpoint's train state if every file the manifest lists is there and intact."""
    if folder.name.endswith(TMP_SUFFIX):
        raise CheckpointError(f"{folder} is an unfinished write (.tmp)")
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{folder} has no {MANIFEST}: the save did not finish")
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{manifest_path} is unreadable: {exc}") from exc
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{folder}: {name} is missing")
        if path.stat().st_size != entry["bytes"]:
            raise CheckpointError(
                f"{folder}: {name} has {path.stat().st_size} bytes, the manifest says {entry['bytes']}"
            )
        if checksums and sha256(path) != entry["sha256"]:
            raise CheckpointError(f"{folder}: {name} fails its SHA-256 check")
    if TRAIN_STATE not in files:
        raise CheckpointError(f"{folder} has no {TRAIN_STATE}")
    try:
        return json.loads((folder / TRAIN_STATE).read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{folder}/{TRAIN_STATE} is unreadable: {exc}") from exc


def train_state_flag(folder: Path, key: str) -> bool:
    """A true/false key of the folder's train state, false when it cannot be read (no verification)."""
    try:
        return bool(json.loads((folder / TRAIN_STATE).read_text()).get(key))
    except (OSError, ValueError, AttributeError):
        return False
