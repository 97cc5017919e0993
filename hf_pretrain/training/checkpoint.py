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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import gather_object
from transformers import PretrainedConfig, PreTrainedTokenizerBase

from hf_pretrain.config import TrainConfig
from hf_pretrain.run_dir import RunDir
from hf_pretrain.training.faults import fault_active

MANIFEST = "manifest.json"
TRAIN_STATE = "train_state.json"
PREFIX = "step_"
TMP_SUFFIX = ".tmp"
PIN_SUFFIX = ".pin"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from, with the reason."""


@dataclass
class CheckpointCandidate:
    path: Path
    step: int


def checkpoints_root(output_dir: str | Path) -> Path:
    return RunDir(output_dir).checkpoints


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


def newest_good_checkpoint(output_dir: str | Path, checksums: bool = True, log=print,
                           load: Callable[[Path], Any] | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint of `output_dir` that verifies against its manifest (and, given `load`,
    loads without a `CheckpointError`), with its train state; None when none is good. Each newer one
    is skipped with `log("skipping step_X: reason")`. The one walk resume, export and eval share."""
    for candidate in list_checkpoints(output_dir, include_unfinished=True):
        try:
            train_state = verify_checkpoint(candidate.path, checksums)
            if load is not None:
                load(candidate.path)
        except CheckpointError as exc:
            log(f"skipping {candidate.path.name}: {exc}")
            continue
        return candidate.path, train_state
    return None


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
        train_state = verify_checkpoint(path)
        _load_state(accelerator, path)
        return path, train_state
    found = newest_good_checkpoint(output_dir, log=lambda reason: log(f"resume: {reason}"),
                                   load=lambda folder: _load_state(accelerator, folder))
    if found is None:
        log(f"resume: no complete checkpoint in {checkpoints_root(output_dir)}, starting from step 0")
    return found


def _load_state(accelerator: Accelerator, folder: Path) -> None:
    try:
        # model weights from safetensors; optimizer and RNG through torch.load(weights_only=True)
        accelerator.load_state(str(folder))
    except Exception as exc:  # any unreadable piece makes the whole checkpoint unusable
        raise CheckpointError(f"{folder} could not be loaded: {type(exc).__name__}: {exc}") from exc


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (disk full, quota, I/O error); the previous one is intact."""


def save_checkpoint(accelerator: Accelerator, output_dir: str | Path, train_state: dict[str, Any], keep: int,
                    model_config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase,
                    milestone_interval: int = 0) -> Path:
    """Write the full training state for `train_state["step"]`, atomically, then prune old ones.

    Beside Accelerate's state the folder holds `config.json` and the tokenizer, so a checkpoint
    describes itself: export, eval and the demo need nothing else from the run. Nothing older is
    touched until the new folder is complete, so a failure at any point leaves the last good one.
    A failure on any process raises the same `CheckpointSaveError` on every process.
    """
    step = train_state["step"]
    final = checkpoint_path(output_dir, step)
    tmp = final.with_name(final.name + TMP_SUFFIX)
    main, process = accelerator.is_main_process, accelerator.process_index

    def fresh_folder() -> None:
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)

    def accelerate_state() -> None:  # every process writes its part (its RNG state at least)
        accelerator.save_state(str(tmp), safe_serialization=True)
        if fault_active("disk-full", step, process):
            cut = tmp / ("optimizer.bin" if main else f"random_states_{process}.pkl")
            cut.write_bytes(b"\0" * 64)  # a write cut short ...
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(cut))

    def seal() -> None:  # the sidecar, the self-description, the manifest, then the rename
        if not main:
            return
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

    def failure(exc: OSError) -> str:
        previous = next((c.path for c in list_checkpoints(output_dir) if c.step < step), None)
        free = shutil.disk_usage(checkpoints_root(output_dir)).free / 1e9
        on = f" on process {process}" if accelerator.num_processes > 1 else ""
        return (f"saving the step {step} checkpoint into {tmp} failed{on}: {exc.strerror or exc} "
                f"({exc.filename or tmp}); {free:.2f} GB free on that volume. "
                + (f"The previous checkpoint {previous} is intact: free some space and rerun the same command to "
                   f"resume from it." if previous else "There is no earlier checkpoint: the run starts over when rerun."))

    # Each part ends with the processes telling each other whether theirs failed; that exchange is
    # also the barrier, so a failure on one process ends the save on all of them, none left waiting.
    for part in (fresh_folder, accelerate_state, seal):
        error = _together(accelerator, part, failure)
        if error is not None:
            if main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointSaveError(error)
    if main:
        prune_checkpoints(output_dir, keep, milestone_interval)
    accelerator.wait_for_everyone()
    return final


def _together(accelerator: Accelerator, part: Callable[[], None], failure: Callable[[OSError], str]) -> str | None:
    """Run `part` on this process; the first failure message of any process, the same on all of them."""
    try:
        part()
        error = None
    except OSError as exc:
        error = failure(exc)
    if accelerator.num_processes == 1:
        return error
    return next((e for e in gather_object([error]) if e is not None), None)


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


def pin_checkpoint(path: Path) -> Path:
    """A copy of the complete checkpoint `path` made of hard links (no data copied on one volume),
    `step_N.pin/` beside it, which pruning and resume leave alone: for readers that may outlast
    the original (the side jobs of a run). Delete it with `shutil.rmtree` when done."""
    pinned = path.with_name(path.name + PIN_SUFFIX)
    shutil.rmtree(pinned, ignore_errors=True)
    shutil.copytree(path, pinned, copy_function=_link_or_copy)
    return pinned


def remove_pins(output_dir: str | Path) -> None:
    """Pins left by a run that was killed before its side jobs finished."""
    for pinned in checkpoints_root(output_dir).glob(f"{PREFIX}*{PIN_SUFFIX}"):
        shutil.rmtree(pinned, ignore_errors=True)


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another volume, or a filesystem without hard links
        shutil.copy2(source, target)


class Checkpointer:
    """When the run saves (every `save_interval` steps, and on its way out, whatever the reason) and
    what with: the model config and tokenizer that make each checkpoint describe itself."""

    def __init__(self, accelerator: Accelerator, train: TrainConfig, model_config: PretrainedConfig,
                 tokenizer: PreTrainedTokenizerBase, log: Callable[[str], None]):
        self.accelerator, self.train, self.model_config, self.tokenizer, self.log = (
            accelerator, train, model_config, tokenizer, log)

    def due(self, step: int) -> bool:
        return step % self.train.save_interval == 0

    def save(self, train_state: dict[str, Any]) -> Path:
        path = save_checkpoint(self.accelerator, self.train.output_dir, train_state, self.train.keep_checkpoints,
                               self.model_config, self.tokenizer, self.train.milestone_interval)
        self.log(f"step {train_state['step']}: saved {path}")
        return path
