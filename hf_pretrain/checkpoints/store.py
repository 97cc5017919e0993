"""A run's checkpoints: listing them, the newest good one, what a path names, pins and retention.

A checkpoint that fails its verification is never counted as kept and never makes retention remove a
good one: the session that holds the run folder sets it aside as `step_N.corrupt/` (`set_aside`), with
a note saying why, which no reader lists. This process remembers each failure it saw (`failed`), so
that retention and status.json pass over one it has not yet set aside.

Retention keeps the newest `keep_checkpoints`, every milestone (`milestone_interval`) and every
branch point (the last checkpoint before a decay, which a run goes further from). A milestone past
the newest ones keeps, unless `milestone_full_state`, what export, evaluation and the demo read:
the weights in bf16, config, tokenizer and a train state marked `weights_only`, with a new manifest.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_pretrain.checkpoints.layout import (
    BRANCH_POINT,
    CORRUPT_SUFFIX,
    FULL_SUFFIX,
    MANIFEST,
    PIN_SUFFIX,
    PREFIX,
    SET_ASIDE_NOTE,
    SLIM_SUFFIX,
    TMP_SUFFIX,
    TRAIN_STATE,
    TRAINING_ONLY_PREFIXES,
    WEIGHTS_ONLY,
    checkpoints_root,
    is_checkpoint,
)
from hf_pretrain.checkpoints.manifest import (
    CheckpointError,
    CheckpointMismatch,
    fsync,
    train_state_flag,
    verify_checkpoint,
    verify_showing,
    write_manifest,
)
from hf_pretrain.run_folder.run_dir import RunDir

# checkpoints this process saw fail their verification: (folder, its inode) -> the reason. The inode
# tells a folder written again at the same path (a re-save of the step) from the one that failed.
_FAILED: dict[tuple[Path, int], str] = {}


@dataclass
class CheckpointCandidate:
    path: Path
    step: int


@dataclass
class Checkpoint:
    """A verified checkpoint folder and its train state."""

    path: Path
    train_state: dict

    @property
    def run_dir(self) -> Path | None:
        """The run folder a `RUN/checkpoints/step_X` checkpoint belongs to, for its metrics and samples."""
        run = RunDir(self.path.parent.parent)
        return run.path if self.path.parent == run.checkpoints else None


def list_checkpoints(output_dir: str | Path, include_unfinished: bool = False) -> list[CheckpointCandidate]:
    """Checkpoint folders, newest first; `.tmp` leftovers of interrupted saves only when asked."""
    root = checkpoints_root(output_dir)
    found = []
    for path in root.glob(f"{PREFIX}*") if root.is_dir() else []:
        suffix = path.name[len(PREFIX) :]
        if include_unfinished and suffix.endswith(TMP_SUFFIX):
            suffix = suffix[: -len(TMP_SUFFIX)]
        if path.is_dir() and suffix.isdigit():
            found.append(CheckpointCandidate(path, int(suffix)))
    return sorted(found, key=lambda c: (c.step, not c.path.name.endswith(TMP_SUFFIX)), reverse=True)


def newest_good_checkpoint(
    output_dir: str | Path,
    checksums: bool = True,
    log: Callable[[str], None] = print,
    usable: Callable[[Path, dict[str, Any]], None] | None = None,
    say: Callable[[str], None] | None = None,
    activity: Callable[[str | None], None] | None = None,
    broken: list[tuple[Path, str]] | None = None,
) -> Checkpoint | None:
    """The newest checkpoint of `output_dir` that verifies against its manifest (and that `usable`
    accepts: it raises `CheckpointError` to skip one), with its train state; None when none is good.
    Each newer one is skipped with `log("step_X: reason")`; those that failed their verification (not
    an unfinished `.tmp`, not one `usable` refused) are remembered (`failed`) and added to `broken`.
    The one walk resume, export, evaluation and the demo share; `say` and `activity` show a
    verification that lasts (`verify_showing`)."""
    for candidate in list_checkpoints(output_dir, include_unfinished=True):
        try:
            train_state = verify_showing(candidate.path, checksums, say, activity)
        except CheckpointError as exc:
            log(f"{candidate.path.name}: {exc}")
            if not candidate.path.name.endswith(TMP_SUFFIX):
                _remember_failure(candidate.path, str(exc))
                if broken is not None:
                    broken.append((candidate.path, str(exc)))
            continue
        try:
            if usable is not None:
                usable(candidate.path, train_state)
        except CheckpointMismatch:
            raise  # an older checkpoint would not fit either
        except CheckpointError as exc:
            log(f"{candidate.path.name}: {exc}")
            continue
        return Checkpoint(candidate.path, train_state)
    return None


def _remember_failure(folder: Path, reason: str) -> None:
    try:
        _FAILED[(folder, folder.stat().st_ino)] = reason
    except OSError:  # gone meanwhile: nothing left to pass over
        pass


def failed(folder: Path) -> str | None:
    """Why `folder` cannot be counted as a checkpoint: it failed a verification in this process, or its
    files do not match its manifest by name and size (a check without checksums: a read of the manifest
    and a stat per file); None for one that is sound as far as that shows."""
    try:
        known = _FAILED.get((folder, folder.stat().st_ino))
    except OSError:
        return f"{folder} is gone"
    if known is not None:
        return known
    try:
        verify_checkpoint(folder, checksums=False)
    except CheckpointError as exc:
        return str(exc)
    return None


def newest_sound_checkpoint(output_dir: str | Path) -> CheckpointCandidate | None:
    """The newest complete checkpoint that nothing showed to be broken (`failed`): the one status.json names."""
    return next((c for c in list_checkpoints(output_dir) if failed(c.path) is None), None)


def set_aside(folder: Path, reason: str) -> Path:
    """Rename a checkpoint that failed its verification to `step_N.corrupt/` (`.corrupt.2`, ... when one is
    there already), with `SET_ASIDE.txt` inside saying why: never deleted (it is evidence of what
    damaged it), never listed as a checkpoint, never counted by retention. Only the process that holds
    the run folder (the session's first) calls this."""
    target, n = folder.with_name(folder.name + CORRUPT_SUFFIX), 2
    while target.exists():
        target, n = folder.with_name(f"{folder.name}{CORRUPT_SUFFIX}.{n}"), n + 1
    try:
        _FAILED.pop((folder, folder.stat().st_ino), None)
    except OSError:
        pass
    folder.rename(target)
    when = time.strftime("%Y-%m-%d %H:%M:%S %z")
    (target / SET_ASIDE_NOTE).write_text(
        f"{folder.name} was set aside by hf-pretrain on {when}: it failed its verification: {reason}\n"
        f"It is kept as evidence and is never resumed from, exported or counted as a kept checkpoint; "
        f"delete this folder when you no longer need it.\n"
    )
    fsync(folder.parent)
    return target


def is_training_output(path: str | Path) -> bool:
    """A checkpoint or a run folder (what `resolve_checkpoint` takes), rather than a model folder."""
    return is_checkpoint(Path(path)) or checkpoints_root(path).is_dir()


def resolve_checkpoint(path: str | Path, checksums: bool = True, log: Callable[[str], None] = print) -> Checkpoint:
    """The checkpoint `path` names: itself when it is one (checked against its manifest), or the
    newest complete checkpoint of a run folder (broken ones are skipped, with the reason)."""
    path = Path(path)
    if is_checkpoint(path):
        return Checkpoint(path, verify_checkpoint(path, checksums))
    if not checkpoints_root(path).is_dir():
        raise CheckpointError(f"{path} is neither a checkpoint (no {TRAIN_STATE}) nor a run folder (no checkpoints/)")
    skipped: list[str] = []
    found = newest_good_checkpoint(path, checksums, log=lambda reason: skipped.append(f"skipping {reason}"))
    if found is None:
        raise CheckpointError(
            f"no complete checkpoint in {checkpoints_root(path)}" + "".join(f"; {s}" for s in skipped)
        )
    for reason in skipped:  # said only once a good one is found; without one they go into the error
        log(reason)
    return found


def is_branch_point(folder: Path) -> bool:
    """Whether `folder` is the last checkpoint before a decay: a run goes further from it, so it is kept."""
    return train_state_flag(folder, BRANCH_POINT)


def is_weights_only(folder: Path) -> bool:
    return train_state_flag(folder, WEIGHTS_ONLY)


def prune_checkpoints(
    output_dir: str | Path, keep: int, milestone_interval: int = 0, weights_only: bool = False
) -> None:
    """Delete all but the newest `keep` checkpoints, the milestones (every `milestone_interval`
    steps) and the branch points; only ever called after a save completed, by the process that holds
    the run folder. A broken checkpoint (`failed`) is set aside, never counted among the `keep`, so it
    never makes a good one go. With `weights_only` a milestone past the newest `keep` keeps its
    weights only (`keep_weights_only`). Leftover `.tmp` folders of older steps go too."""
    _finish_slimming(output_dir)
    sound = []
    for candidate in list_checkpoints(output_dir):
        reason = failed(candidate.path)
        if reason is None:
            sound.append(candidate)
        elif candidate.path.exists():
            set_aside(candidate.path, reason)
    for old in sound[keep:]:
        if is_branch_point(old.path):
            continue
        if not (milestone_interval and old.step % milestone_interval == 0):
            shutil.rmtree(old.path, ignore_errors=True)
        elif weights_only:
            keep_weights_only(old.path)
    newest = max((c.step for c in list_checkpoints(output_dir)), default=0)
    for leftover in checkpoints_root(output_dir).glob(f"{PREFIX}*{TMP_SUFFIX}"):
        if int(leftover.name[len(PREFIX) : -len(TMP_SUFFIX)]) <= newest:
            shutil.rmtree(leftover, ignore_errors=True)


# What a save writes into `step_N.tmp/` (checkpoints/layout.py, Accelerate's names): a `.tmp` holding only
# these is provably a save's own partial write
SAVE_WRITES = (
    "model",
    "pytorch_model",
    *TRAINING_ONLY_PREFIXES,
    "config.json",
    "generation_config.json",
    "tokenizer",
    "special_tokens_map.json",
    "chat_template",
    TRAIN_STATE,
    MANIFEST,
)


def remove_unfinished_writes(output_dir: str | Path) -> tuple[list[Path], list[Path]]:
    """Remove the `step_N.tmp/` folders a session left when it was killed while saving (a second SIGTERM,
    SIGKILL), which no save of a later step cleaned: (removed, left). Only one whose every entry is a file a
    save writes goes; anything else is left for a person. Call only while holding the run folder's lock:
    then no live process writes into them (a save is written by the session that holds it)."""
    removed, left = [], []
    root = checkpoints_root(output_dir)
    for tmp in sorted(root.glob(f"{PREFIX}*{TMP_SUFFIX}")) if root.is_dir() else []:
        if not tmp.name[len(PREFIX) : -len(TMP_SUFFIX)].isdigit() or not tmp.is_dir():
            continue
        if all(entry.name.startswith(SAVE_WRITES) for entry in tmp.iterdir()):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
        else:
            left.append(tmp)
    return removed, left


def keep_weights_only(folder: Path) -> None:
    """Reduce the complete checkpoint `folder` to what export, evaluation and the demo read: the model
    weights in bf16 (FSDP's sharded weights as they are), config.json, the tokenizer and train_state.json
    marked `weights_only`, with a new manifest; about a sixth of the full state (fp32 weights + AdamW),
    and no longer resumable. Built beside it as `step_N.slim/` and swapped in by two renames; a kill
    between them is finished by the next prune. An incomplete folder, or one already slim, is left alone."""
    try:
        train_state = verify_checkpoint(folder, checksums=False)
    except CheckpointError:
        return
    if train_state.get(WEIGHTS_ONLY):
        return
    slim, full = folder.with_name(folder.name + SLIM_SUFFIX), folder.with_name(folder.name + FULL_SUFFIX)
    shutil.rmtree(slim, ignore_errors=True)
    slim.mkdir()
    for item in folder.iterdir():
        if item.name in (MANIFEST, TRAIN_STATE) or item.name.startswith(TRAINING_ONLY_PREFIXES):
            continue
        if item.is_dir():
            shutil.copytree(item, slim / item.name, copy_function=_link_or_copy)
        elif item.suffix == ".safetensors" and item.name.startswith("model"):
            import torch  # here: listing checkpoints (`stop`, the doctor) must not pay for importing torch
            from safetensors.torch import load_file, save_file

            tensors = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in load_file(item).items()}
            save_file(tensors, slim / item.name, metadata={"format": "pt"})
        else:
            _link_or_copy(str(item), str(slim / item.name))
    (slim / TRAIN_STATE).write_text(json.dumps({**train_state, WEIGHTS_ONLY: True, "weights_dtype": "bf16"}, indent=1))
    write_manifest(slim)
    os.replace(folder, full)
    os.replace(slim, folder)
    fsync(folder.parent)
    shutil.rmtree(full, ignore_errors=True)


def _finish_slimming(output_dir: str | Path) -> None:
    """What a kill during `keep_weights_only` left: a complete slim folder goes in (or back out)."""
    root = checkpoints_root(output_dir)
    for slim in root.glob(f"{PREFIX}*{SLIM_SUFFIX}") if root.is_dir() else []:
        folder = slim.with_name(slim.name[: -len(SLIM_SUFFIX)])
        full = folder.with_name(folder.name + FULL_SUFFIX)
        if not folder.exists() and (slim / MANIFEST).is_file():
            os.replace(slim, folder)
        elif not folder.exists() and full.exists():
            os.replace(full, folder)
        shutil.rmtree(slim, ignore_errors=True)
        if folder.exists():
            shutil.rmtree(full, ignore_errors=True)


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
