"""Checkpoints that are either whole or absent: save, verify, find the newest good one, prune.

A checkpoint is written into `step_XXXXXXXX.tmp/`, gets a manifest (every file with its size
and SHA-256) and the `train_state.json` sidecar, is flushed to disk, and only then renamed to
`step_XXXXXXXX/`. A folder without the `.tmp` suffix and with a manifest that matches its files
is complete; anything else is skipped on resume with the reason.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from transformers import PretrainedConfig, PreTrainedTokenizerBase

from hf_pretrain.training.faults import fault_active

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


def list_checkpoints(output_dir: str | Path, include_unfinished: bool = False) -> list[CheckpointCandidate]:
    """Checkpoint folders, newest first; `.tmp` leftovers of interrupted saves only when asked."""
    root = checkpoints_root(output_dir)
    found = []
    for path in root.glob(f"{PREFIX}*") if root.is_dir() else []:
        suffix = path.name[len(PREFIX):]
        if include_unfinished and suffix.endswith(TMP_SUFFIX):
            suffix = suffix[:-len(TMP_SUFFIX)]
        if path.is_dir() and suffix.isdigit():
            found.append(CheckpointCandidate(path, int(suffix)))
    return sorted(found, key=lambda c: (c.step, not c.path.name.endswith(TMP_SUFFIX)), reverse=True)


def resume_training_state(accelerator: Accelerator, output_dir: str | Path, resume: str,
                          log=print) -> tuple[Path, dict[str, Any]] | None:
    """Restore model, optimizer and RNG from the checkpoint `resume` asks for; returns (folder, train state).

    `none` -> None. A path -> that checkpoint, which must be good. `auto` -> the newest good one in
    output_dir: incomplete or corrupt ones (missing files, checksum mismatch, unreadable state)
    are skipped with the reason; with none left it says so and returns None (a fresh start).
    """
    if resume == "none":
        return None
    if resume != "auto":
        path = Path(resume)
        if not path.is_dir():
            raise CheckpointError(f"--resume {resume}: no such checkpoint folder")
        return path, _load(accelerator, path)
    for candidate in list_checkpoints(output_dir, include_unfinished=True):
        try:
            return candidate.path, _load(accelerator, candidate.path)
        except CheckpointError as exc:
            log(f"resume: skipping {candidate.path.name}: {exc}")
    log(f"resume: no complete checkpoint in {checkpoints_root(output_dir)}, starting from step 0")
    return None


def _load(accelerator: Accelerator, folder: Path) -> dict[str, Any]:
    train_state = verify_checkpoint(folder)
    try:
        # model weights from safetensors; optimizer and RNG through torch.load(weights_only=True)
        accelerator.load_state(str(folder))
    except Exception as exc:  # any unreadable piece makes the whole checkpoint unusable
        raise CheckpointError(f"{folder} could not be loaded: {type(exc).__name__}: {exc}") from exc
    return train_state


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (disk full, quota, I/O error); the previous one is intact."""


def save_checkpoint(accelerator: Accelerator, output_dir: str | Path, train_state: dict[str, Any], keep: int,
                    model_config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase,
                    milestone_interval: int = 0) -> Path:
    """Write the full training state for `train_state["step"]`, atomically, then prune old ones.

    Beside Accelerate's state the folder holds `config.json` and the tokenizer, so a checkpoint
    describes itself: export, eval and the demo need nothing else from the run. Nothing older is
    touched until the new folder is complete, so a failure at any point leaves the last good one.
    """
    step = train_state["step"]
    final = checkpoint_path(output_dir, step)
    tmp = final.with_name(final.name + TMP_SUFFIX)
    try:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(tmp), safe_serialization=True)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            if fault_active("disk-full", step):
                (tmp / "optimizer.bin").write_bytes(b"\0" * 64)  # a write cut short ...
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / "optimizer.bin"))
            if fault_active("kill-during-save", step):
                os.kill(os.getpid(), signal.SIGKILL)  # state written, no manifest: a torn checkpoint
            (tmp / TRAIN_STATE).write_text(json.dumps(train_state, indent=1))
            model_config.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            write_manifest(tmp)
            if final.exists():  # a re-save of the same step (e.g. after a resume): replace it whole
                shutil.rmtree(final)
            os.replace(tmp, final)
            _fsync(final.parent)
    except OSError as exc:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        previous = next((c.path for c in list_checkpoints(output_dir) if c.step < step), None)
        free = shutil.disk_usage(checkpoints_root(output_dir)).free / 1e9
        raise CheckpointSaveError(
            f"saving the step {step} checkpoint into {tmp} failed: {exc.strerror or exc} "
            f"({exc.filename or tmp}); {free:.2f} GB free on that volume. "
            + (f"The previous checkpoint {previous} is intact: free some space and rerun the same command to "
               f"resume from it." if previous else "There is no earlier checkpoint: the run starts over when rerun.")
        ) from exc
    if accelerator.is_main_process:
        prune_checkpoints(output_dir, keep, milestone_interval)
    accelerator.wait_for_everyone()
    return final


def prune_checkpoints(output_dir: str | Path, keep: int, milestone_interval: int = 0) -> None:
    """Delete all but the newest `keep` checkpoints and the milestones (every `milestone_interval`
    steps); only ever called after a save completed. Leftover `.tmp` folders of older steps go too."""
    for old in list_checkpoints(output_dir)[keep:]:
        if not (milestone_interval and old.step % milestone_interval == 0):
            shutil.rmtree(old.path, ignore_errors=True)
    newest = max((c.step for c in list_checkpoints(output_dir)), default=0)
    for leftover in checkpoints_root(output_dir).glob(f"{PREFIX}*{TMP_SUFFIX}"):
        if int(leftover.name[len(PREFIX):-len(TMP_SUFFIX)]) <= newest:
            shutil.rmtree(leftover, ignore_errors=True)
