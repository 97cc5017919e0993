"""Checkpoints that are either whole or absent: save, verify, find the newest good one, prune.

A checkpoint is written into `step_XXXXXXXX.tmp/`, gets a manifest (every file with its size
and SHA-256) and the `train_state.json` sidecar, is flushed to disk, and only then renamed to
`step_XXXXXXXX/`. A folder without the `.tmp` suffix and with a manifest that matches its files
is complete; anything else is skipped on resume with the reason. The hashing, flushing and rename
(the seal) of a periodic save run on a thread while training goes on; the next save waits for it.

A milestone (every `milestone_interval` steps), once pruning would delete it, keeps what export,
evaluation and the demo read: the weights in bf16, config, tokenizer, train state (marked
`weights_only`) and a new manifest; `milestone_full_state` keeps the whole resumable state instead.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate import Accelerator
from accelerate.utils import RNG_STATE_NAME, gather_object
from accelerate.utils import load as load_torch_file
from safetensors.torch import load_file, save_file
from transformers import PretrainedConfig, PreTrainedTokenizerBase

from hf_pretrain.config import TrainConfig
from hf_pretrain.model import shape_differences
from hf_pretrain.run_dir import RunDir
from hf_pretrain.training.faults import fault_active

if TYPE_CHECKING:
    from hf_pretrain.training.state import TrainState

MANIFEST = "manifest.json"
TRAIN_STATE = "train_state.json"
PREFIX = "step_"
TMP_SUFFIX = ".tmp"
PIN_SUFFIX = ".pin"
SLIM_SUFFIX, FULL_SUFFIX = ".slim", ".full"  # a milestone being reduced to its weights, and its old self
WEIGHTS_ONLY = "weights_only"  # train-state key of a milestone that kept its weights only
# What a weights-only milestone drops: the optimizer, RNG, scheduler and sampler states (by file or folder name)
TRAINING_ONLY_PREFIXES = ("optimizer", "random_states", "scheduler", "scaler", "sampler", "custom_checkpoint")
BRANCH_POINT = "branch_point"  # train-state key: the last checkpoint before a decay, never pruned


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from, with the reason."""


class CheckpointMismatch(CheckpointError):
    """A complete checkpoint that does not fit this run (another model shape, optimizer or setup): the
    run stops, naming what differs, rather than skip it (older ones would not fit either) or start
    over in a folder that holds a run."""


# How to go on when the run folder's checkpoints do not fit the recipe; nothing in the folder is touched.
START_OVER = (
    "go back to the recipe the checkpoints were saved with, or start a new run in a new folder "
    "(--resume none --output_dir NEW); this folder is left as it is"
)


def shape_mismatch(folder: Path, differences: dict[str, tuple[Any, Any]]) -> str:
    what = ", ".join(f"{key} {saved} -> {wanted}" for key, (saved, wanted) in differences.items())
    return f"{folder} holds a model of another shape than this recipe's: {what}"


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
            raise CheckpointError(
                f"{folder}: {name} has {path.stat().st_size} bytes, the manifest says {entry['bytes']}"
            )
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
        suffix = path.name[len(PREFIX) :]
        if include_unfinished and suffix.endswith(TMP_SUFFIX):
            suffix = suffix[: -len(TMP_SUFFIX)]
        if path.is_dir() and suffix.isdigit():
            found.append(CheckpointCandidate(path, int(suffix)))
    return sorted(found, key=lambda c: (c.step, not c.path.name.endswith(TMP_SUFFIX)), reverse=True)


def newest_good_checkpoint(
    output_dir: str | Path, checksums: bool = True, log=print, load: Callable[[Path], Any] | None = None
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint of `output_dir` that verifies against its manifest (and, given `load`,
    loads without a `CheckpointError`), with its train state; None when none is good. Each newer one
    is skipped with `log("skipping step_X: reason")`. The one walk resume, export and eval share."""
    for candidate in list_checkpoints(output_dir, include_unfinished=True):
        try:
            train_state = verify_checkpoint(candidate.path, checksums)
            if load is not None:
                load(candidate.path)
        except CheckpointMismatch:
            raise
        except CheckpointError as exc:
            log(f"skipping {candidate.path.name}: {exc}")
            continue
        return candidate.path, train_state
    return None


def resume_training_state(
    accelerator: Accelerator,
    output_dir: str | Path,
    resume: str,
    log=print,
    model_config: PretrainedConfig | None = None,
) -> tuple[Path, dict[str, Any]] | None:
    """Restore model, optimizer and RNG from the checkpoint `resume` asks for; returns (folder, train state).

    `none` -> None. A path -> that checkpoint, which must be good. `auto` -> the newest good one in
    output_dir: incomplete or corrupt ones (missing files, checksum mismatch, unreadable state)
    are skipped with the reason; with no checkpoint at all it says so and returns None (a fresh
    start). A complete checkpoint that does not fit `model_config` (or cannot be loaded into this
    run) raises `CheckpointMismatch`, and so does a folder whose checkpoints are all unusable: a run
    that was not resumed must not start over on top of them.
    """
    if resume == "none":
        return None
    if resume != "auto":
        path = Path(resume)
        if not path.is_dir():
            raise CheckpointError(f"--resume {resume}: no such checkpoint folder")
        train_state = verify_checkpoint(path)
        _load_state(accelerator, path, model_config, log)
        return path, train_state
    found = newest_good_checkpoint(
        output_dir,
        log=lambda reason: log(f"resume: {reason}"),
        load=lambda folder: _load_state(accelerator, folder, model_config, log),
    )
    if found is None and list_checkpoints(output_dir):
        raise CheckpointMismatch(
            f"none of the checkpoints in {checkpoints_root(output_dir)} can be resumed from "
            f"(the reasons are above); {START_OVER}"
        )
    if found is None:
        log(f"resume: no complete checkpoint in {checkpoints_root(output_dir)}, starting from step 0")
    return found


def _load_state(
    accelerator: Accelerator, folder: Path, model_config: PretrainedConfig | None = None, log=print
) -> None:
    if is_weights_only(folder):
        raise CheckpointError(
            f"{folder} is a milestone that kept its weights only: export, eval and the demo read "
            f"it, a resume cannot (milestone_full_state keeps whole milestones)"
        )
    saved_config = folder / "config.json"
    if model_config is not None and saved_config.is_file():
        differences = shape_differences(json.loads(saved_config.read_text()), model_config.to_dict())
        if differences:
            raise CheckpointMismatch(f"{shape_mismatch(folder, differences)}; {START_OVER}")
    try:
        # model weights from safetensors; optimizer and RNG through torch.load(weights_only=True)
        accelerator.load_state(str(folder))
    except Exception as exc:  # its files verified: what fails is this run (its model, optimizer or setup)
        raise CheckpointMismatch(
            f"{folder} is complete but does not load into this run: {type(exc).__name__}: {exc}; {START_OVER}"
        ) from exc
    dropped = rng_not_restored(folder, accelerator.process_index)
    if dropped:  # Accelerate goes on without it, saying nothing above its info log level
        say = log if accelerator.is_main_process else print
        say(
            f"resume: warning: process {accelerator.process_index} goes on with fresh random state: {dropped}. "
            f"The data order does not depend on it, but the run is no longer bitwise the run it would have been"
        )


def rng_not_restored(folder: Path, process_index: int) -> str | None:
    """Why this process's random state was not restored from `folder`, or None when it was."""
    path = folder / f"{RNG_STATE_NAME}_{process_index}.pkl"
    if not path.is_file():
        return f"{path.name} is missing (the checkpoint was saved by fewer processes?)"
    try:
        states = load_torch_file(path)
        restored = torch.equal(torch.get_rng_state(), states["torch_manual_seed"])
        if torch.cuda.is_available():
            restored = restored and all(
                torch.equal(now, saved)
                for now, saved in zip(torch.cuda.get_rng_state_all(), states["torch_cuda_manual_seed"], strict=True)
            )
    except Exception as exc:  # whatever Accelerate tripped over, said the way it was met
        return f"{path.name} is unreadable ({type(exc).__name__}: {exc})"
    return None if restored else f"{path.name} could not be applied"


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (disk full, quota, I/O error); the previous one is intact."""


class Sealing:
    """The seal of a save (manifest, flush, rename, pruning) that may still be running on a thread of
    the main process. The thread is not a daemon: a process that ends while it runs finishes it first."""

    def __init__(
        self, path: Path, seal: Callable[[], None] | None = None, failure: Callable[[OSError], str] | None = None
    ):
        self.path, self._error = path, None
        self._thread = None
        if seal is not None:
            self._thread = threading.Thread(target=self._run, args=(seal, failure), name="hf-pretrain-seal")
            self._thread.start()

    def _run(self, seal: Callable[[], None], failure: Callable[[OSError], str]) -> None:
        try:
            seal()
        except OSError as exc:  # said to every process at the next save
            self._error = failure(exc)

    def wait(self) -> str | None:
        """None once the checkpoint is complete, else why it is not (the previous one is intact)."""
        if self._thread is not None:
            self._thread.join()
        return self._error


class _EarlierSaveFailed(OSError):
    """The background seal of the previous save failed: its message, reported by this save."""


def save_checkpoint(
    accelerator: Accelerator,
    output_dir: str | Path,
    train_state: dict[str, Any],
    keep: int,
    model_config: PretrainedConfig,
    tokenizer: PreTrainedTokenizerBase,
    milestone_interval: int = 0,
    *,
    background: bool = False,
    previous: Sealing | None = None,
    on_sealed: Callable[[Path], None] | None = None,
    milestone_full_state: bool = False,
) -> Sealing:
    """Write the full training state for `train_state["step"]`, atomically, then prune old ones.

    Beside Accelerate's state the folder holds `config.json` and the tokenizer, so a checkpoint
    describes itself: export, eval and the demo need nothing else from the run. Nothing older is
    touched until the new folder is complete, so a failure at any point leaves the last good one.
    A failure on any process raises the same `CheckpointSaveError` on every process.

    With `background`, the main process seals (hashes every file into the manifest, flushes, renames,
    prunes, then calls `on_sealed(path)`) on a thread and this returns once the state is written: the
    training thread never hashes. `previous` (the last save's `Sealing`) is waited for first, and its
    failure raised here, on every process. Without `background` the seal is done before returning.
    """
    step = train_state["step"]
    final = checkpoint_path(output_dir, step)
    tmp = final.with_name(final.name + TMP_SUFFIX)
    main, process = accelerator.is_main_process, accelerator.process_index

    def fresh_folder() -> None:
        earlier = previous.wait() if main and previous is not None else None
        if earlier is not None:
            raise _EarlierSaveFailed(earlier)
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)

    def accelerate_state() -> None:  # every process writes its part (its RNG state at least)
        accelerator.save_state(str(tmp), safe_serialization=True)
        if fault_active("disk-full", step, process):
            cut = tmp / ("optimizer.bin" if main else f"random_states_{process}.pkl")
            cut.write_bytes(b"\0" * 64)  # a write cut short ...
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(cut))

    def describe() -> None:  # the sidecar and the self-description: small files
        if not main:
            return
        if fault_active("kill-during-save", step):
            os.kill(os.getpid(), signal.SIGKILL)  # state written, no manifest: a torn checkpoint
        (tmp / TRAIN_STATE).write_text(json.dumps(train_state, indent=1))
        model_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    def seal() -> None:  # the manifest (every file hashed), the flush, then the rename that completes it
        write_manifest(tmp)
        if final.exists():  # a re-save of the same step (e.g. after a resume): replace it whole
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync(final.parent)
        prune_checkpoints(output_dir, keep, milestone_interval, weights_only=not milestone_full_state)
        if on_sealed is not None:
            on_sealed(final)

    def failure(exc: OSError) -> str:
        if isinstance(exc, _EarlierSaveFailed):
            return str(exc)
        previous_good = next((c.path for c in list_checkpoints(output_dir) if c.step < step), None)
        free = shutil.disk_usage(checkpoints_root(output_dir)).free / 1e9
        on = f" on process {process}" if accelerator.num_processes > 1 else ""
        return (
            f"saving the step {step} checkpoint into {tmp} failed{on}: {exc.strerror or exc} "
            f"({exc.filename or tmp}); {free:.2f} GB free on that volume. "
            + (
                f"The previous checkpoint {previous_good} is intact: free some space and rerun the same command "
                f"to resume from it."
                if previous_good
                else "There is no earlier checkpoint: the run starts over when rerun."
            )
        )

    def cleaned(error: str) -> str:
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
        return error

    # Each part ends with the processes telling each other whether theirs failed; that exchange is
    # also the barrier, so a failure on one process ends the save on all of them, none left waiting.
    for part in (fresh_folder, accelerate_state, describe):
        error = _together(accelerator, part, failure)
        if error is not None:
            raise CheckpointSaveError(cleaned(error))
    if not background:
        error = _together(accelerator, seal if main else lambda: None, failure)
        if error is not None:
            raise CheckpointSaveError(cleaned(error))
        return Sealing(final)
    # every process has written its part: the main process seals on its own while training goes on
    return Sealing(final, lambda: _cleaned_on_failure(seal, tmp), failure) if main else Sealing(final)


def _cleaned_on_failure(seal: Callable[[], None], tmp: Path) -> None:
    try:
        seal()
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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


def is_branch_point(folder: Path) -> bool:
    """Whether `folder` is the last checkpoint before a decay: a run goes further from it, so it is kept."""
    try:
        return bool(json.loads((folder / TRAIN_STATE).read_text()).get(BRANCH_POINT))
    except (OSError, ValueError, AttributeError):
        return False


def prune_checkpoints(
    output_dir: str | Path, keep: int, milestone_interval: int = 0, weights_only: bool = False
) -> None:
    """Delete all but the newest `keep` checkpoints, the milestones (every `milestone_interval`
    steps) and the branch points (the last checkpoint before each decay); only ever called after a
    save completed. With `weights_only` a milestone past the newest `keep` keeps its weights only
    (`keep_weights_only`). Leftover `.tmp` folders of older steps go too."""
    _finish_slimming(output_dir)
    for old in list_checkpoints(output_dir)[keep:]:
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


def is_weights_only(folder: Path) -> bool:
    try:
        return bool(json.loads((folder / TRAIN_STATE).read_text()).get(WEIGHTS_ONLY))
    except (OSError, ValueError, AttributeError):
        return False


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
            tensors = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in load_file(item).items()}
            save_file(tensors, slim / item.name, metadata={"format": "pt"})
        else:
            _link_or_copy(str(item), str(slim / item.name))
    (slim / TRAIN_STATE).write_text(json.dumps({**train_state, WEIGHTS_ONLY: True, "weights_dtype": "bf16"}, indent=1))
    write_manifest(slim)
    os.replace(folder, full)
    os.replace(slim, folder)
    _fsync(folder.parent)
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


class Checkpointer:
    """When the run saves (every `save_interval` steps, and on its way out, whatever the reason) and
    what with: the model config and tokenizer that make each checkpoint describe itself."""

    def __init__(
        self,
        accelerator: Accelerator,
        train: TrainConfig,
        model_config: PretrainedConfig,
        tokenizer: PreTrainedTokenizerBase,
        log: Callable[[str], None],
    ):
        self.accelerator, self.train, self.model_config, self.tokenizer, self.log = (
            accelerator,
            train,
            model_config,
            tokenizer,
            log,
        )
        self._sealing: Sealing | None = None  # the last save, perhaps still sealing in the background

    def due(self, state: TrainState) -> bool:
        """Every `save_interval` steps, and at the last step before a decay (the run's branch point)."""
        return state.step % self.train.save_interval == 0 or state.step == state.decay_start

    def save(
        self, train_state: dict[str, Any], last: bool = False, then: Callable[[Path, int], None] | None = None
    ) -> Path:
        """Save `train_state`; `then(path, step)` runs on the main process once the checkpoint is complete.

        A periodic save returns once every process has written its state, and the main process seals
        it (hashing, manifest, rename, pruning) on a thread: the next save waits for that, and raises
        its failure. The `last` save of a session returns complete. Raises `CheckpointSaveError`.
        """
        if train_state["step"] == train_state.get("decay_start"):
            train_state = {**train_state, BRANCH_POINT: True}
        step = train_state["step"]

        def sealed(path: Path) -> None:
            self.log(f"step {step}: saved {path}")
            if then is not None:
                try:
                    then(path, step)
                except Exception as exc:  # a side job is never a reason to lose the run
                    self.log(f"warning: the side jobs of step {step} did not start: {type(exc).__name__}: {exc}")

        self._sealing = save_checkpoint(
            self.accelerator,
            self.train.output_dir,
            train_state,
            self.train.keep_checkpoints,
            self.model_config,
            self.tokenizer,
            self.train.milestone_interval,
            background=not last,
            previous=self._sealing,
            on_sealed=sealed,
            milestone_full_state=self.train.milestone_full_state,
        )
        return self._sealing.path
