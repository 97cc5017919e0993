"""Checkpoints that are either whole or absent: save, verify, find the newest good one, prune.

A checkpoint is written into `step_XXXXXXXX.tmp/`, gets a manifest (every file with its size
and SHA-256) and the `train_state.json` sidecar, is flushed to disk, and only then renamed to
`step_XXXXXXXX/`. A folder without the `.tmp` suffix and with a manifest that matches its files
is complete; anything else is skipped on resume with the reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from transformers import PretrainedConfig, PreTrainedTokenizerBase

MANIFEST = "manifest.json"
TRAIN_STATE = "train_state.json"
PREFIX = "step_"
TMP_SUFFIX = ".tmp"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from, with the reason."""


@dataclass
class CheckpointCandidate:
    path: Path
    step: int


def checkpoints_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def checkpoint_path(output_dir: str | Path, step: int) -> Path:
    return checkpoints_root(output_dir) / f"{PREFIX}{step:08d}"


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(folder: Path) -> None:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    for p in files:
        _fsync(p)
    (folder / MANIFEST).write_text(json.dumps({"format_version": 1, "files": entries}, indent=1))
    _fsync(folder / MANIFEST)
    _fsync(folder)


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
            raise CheckpointError(f"{folder}: {name} has {path.stat().st_size} bytes, the manifest says {entry['bytes']}")
        if checksums and _sha256(path) != entry["sha256"]:
            raise CheckpointError(f"{folder}: {name} fails its SHA-256 check")
    if TRAIN_STATE not in files:
        raise CheckpointError(f"{folder} has no {TRAIN_STATE}")
    try:
        return json.loads((folder / TRAIN_STATE).read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{folder}/{TRAIN_STATE} is unreadable: {exc}") from exc


def list_checkpoints(output_dir: str | Path) -> list[CheckpointCandidate]:
    """Complete-looking checkpoint folders, newest first (`.tmp` leftovers are not listed)."""
    root = checkpoints_root(output_dir)
    found = []
    for path in root.glob(f"{PREFIX}*") if root.is_dir() else []:
        suffix = path.name[len(PREFIX):]
        if path.is_dir() and suffix.isdigit():
            found.append(CheckpointCandidate(path, int(suffix)))
    return sorted(found, key=lambda c: c.step, reverse=True)


def find_resume_checkpoint(output_dir: str | Path, resume: str, log=print) -> Path | None:
    """The checkpoint to resume from: `none` -> None, a path -> that one (must be good),
    `auto` -> the newest good one in output_dir, skipping broken ones with the reason."""
    if resume == "none":
        return None
    if resume != "auto":
        path = Path(resume)
        if not path.is_dir():
            raise CheckpointError(f"--resume {resume}: no such checkpoint folder")
        verify_checkpoint(path)
        return path
    for candidate in list_checkpoints(output_dir):
        try:
            verify_checkpoint(candidate.path)
            return candidate.path
        except CheckpointError as exc:
            log(f"resume: skipping {candidate.path.name}: {exc}")
    log(f"resume: no complete checkpoint in {checkpoints_root(output_dir)}, starting from step 0")
    return None


def save_checkpoint(accelerator: Accelerator, output_dir: str | Path, train_state: dict[str, Any],
                    keep: int, model_config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase) -> Path:
    """Write the full training state for `train_state["step"]`, atomically, then prune old ones.

    Beside Accelerate's state the folder holds `config.json` and the tokenizer, so a checkpoint
    describes itself: export, eval and the demo need nothing else from the run.
    """
    final = checkpoint_path(output_dir, train_state["step"])
    tmp = final.with_name(final.name + TMP_SUFFIX)
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / TRAIN_STATE).write_text(json.dumps(train_state, indent=1))
        model_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_manifest(tmp)
        if final.exists():  # a re-save of the same step (e.g. after a resume): replace it whole
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync(final.parent)
        prune_checkpoints(output_dir, keep)
    accelerator.wait_for_everyone()
    return final


def prune_checkpoints(output_dir: str | Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints; only ever called after a save completed."""
    for old in list_checkpoints(output_dir)[keep:]:
        shutil.rmtree(old.path, ignore_errors=True)


def load_checkpoint(accelerator: Accelerator, folder: Path) -> dict[str, Any]:
    """Restore model, optimizer and RNG states from `folder`; returns its train state."""
    train_state = json.loads((folder / TRAIN_STATE).read_text())
    accelerator.load_state(str(folder))
    return train_state
