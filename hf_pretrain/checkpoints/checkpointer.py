"""When a run saves, and how its processes write one checkpoint together.

A checkpoint is written into `step_N.tmp/` by every process (Accelerate's state), described by the
main process (train state, config, tokenizer), then sealed: hashed into its manifest, flushed and
renamed to `step_N/` (checkpoints/manifest.py), and older ones pruned (checkpoints/store.py). The
seal of a periodic save runs on a thread while training goes on; the next save waits for it. Where
the state lives whole on each process (one process, DDP; not FSDP), a periodic save does not even
write the model and optimizer states on the training thread: it copies them to host memory and the
same thread writes them before sealing (checkpoints/async_save.py), so the loop stalls only for a copy.
The processes agree after each part, so a failure on one ends the save on all of them, none left
waiting; a failure on the thread is said by the next save, on every process.

A full disk is named as one: ENOSPC/EDQUOT say so themselves, but torch's zip writer hides the errno
("unexpected pos 5188928 vs 5188816", "PytorchStreamWriter failed writing file") and safetensors wraps
it, so a failed write is judged by the volume at the moment it failed (`out_of_space`), never by its
words alone: a bug that raises the same words on a roomy disk is still a crash, with its traceback.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from accelerate import Accelerator
from accelerate.utils import gather_object
from transformers import PretrainedConfig, PreTrainedTokenizerBase

from hf_pretrain.checkpoints.async_save import HostStage, StagedState, can_stage
from hf_pretrain.checkpoints.layout import BRANCH_POINT, TMP_SUFFIX, TRAIN_STATE, checkpoint_path, checkpoints_root
from hf_pretrain.checkpoints.manifest import fsync, write_manifest
from hf_pretrain.checkpoints.store import list_checkpoints, prune_checkpoints
from hf_pretrain.config import TrainConfig
from hf_pretrain.faults import fault_active
from hf_pretrain.formatting import human_bytes


class Progress(Protocol):
    """What the checkpointer reads of a run's state (training/state.py's `TrainState`)."""

    step: int
    decay_start: int | None


class _TiedEmbeddingNote(logging.Filter):
    """Accelerate's "Removed shared tensor {'lm_head.weight'} while saving ... check" on every save is the
    tied embedding (one tensor, two names): the config's tie_word_embeddings restores it on load, as the
    resume tests check. Only that message is dropped; any other shared tensor is still reported."""

    def filter(self, record: logging.LogRecord) -> bool:
        # Accelerate's logger prefixes "[RANK n] "
        return "Removed shared tensor {'lm_head.weight'} while saving" not in record.getMessage()


@contextmanager
def quiet_about_the_tied_embedding() -> Iterator[None]:
    logger, note = logging.getLogger("accelerate.utils.other"), _TiedEmbeddingNote()
    logger.addFilter(note)
    try:
        yield
    finally:
        logger.removeFilter(note)


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (disk full, quota, I/O error); the previous one is intact."""


FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
PROBE_BYTES = 1 << 20  # a write this small refused for space: the volume (or the quota) is full


def out_of_space(folder: Path, needed: int) -> bool:
    """Whether a write into `folder` that just failed failed for want of room: less free on its volume
    than a checkpoint needs, or a small probe write refused with ENOSPC/EDQUOT (a quota that statvfs
    does not show). Call it before the unfinished folder is removed: that is the state that failed."""
    where = existing(folder)
    if free_bytes(where) < needed:
        return True
    probe = where / f".hf-pretrain-space-probe-{os.getpid()}"
    try:
        with probe.open("wb") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return exc.errno in FULL_DISK_ERRNOS
    finally:
        probe.unlink(missing_ok=True)
    return False


def existing(path: Path) -> Path:
    """`path`, or its closest ancestor that exists (a folder that failed to be made has none of its own)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(existing(path)).free


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


class Sealing:
    """The seal of a save (manifest, flush, rename, pruning) that may still be running on a thread of
    the main process. The thread is not a daemon: a process that ends while it runs finishes it first."""

    def __init__(
        self,
        path: Path,
        seal: Callable[[], None] | None = None,
        failure: Callable[[BaseException], str | None] | None = None,
    ):
        self.path, self._error, self._crash = path, None, None
        self._thread = None
        if seal is not None:
            self._thread = threading.Thread(target=self._run, args=(seal, failure), name="hf-pretrain-seal")
            self._thread.start()

    def _run(self, seal: Callable[[], None], failure: Callable[[BaseException], str | None]) -> None:
        try:
            seal()
        except Exception as exc:  # said to every process at the next save
            self._error = failure(exc)
            if self._error is None:  # no failure to write: a bug, raised with its traceback by `wait`
                self._crash = exc

    def done(self) -> bool:
        """Whether nothing of this save is left running."""
        return self._thread is None or not self._thread.is_alive()

    def wait(self) -> str | None:
        """None once the checkpoint is complete, else why it is not (the previous one is intact)."""
        if self._thread is not None:
            self._thread.join()
        if self._crash is not None:
            raise self._crash
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
    expected_bytes: int = 0,
    stage: HostStage | None = None,
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
    `expected_bytes` (about what a checkpoint of this model takes) tells a full disk from a crash when
    the run has no checkpoint yet to measure.

    With `background` and a `stage` (host buffers, reused by every save), where `can_stage` allows it,
    the model and optimizer states are only copied on the training thread, and written by the seal's
    thread before it seals: a failure to write them (a full disk) is raised by the next save. Under
    FSDP, DeepSpeed or XLA the `stage` is ignored and `save_state` writes on the training thread.
    """
    staging = stage if background and stage is not None and can_stage(accelerator) else None
    write = _CheckpointWrite(
        accelerator, output_dir, train_state, model_config, tokenizer, previous, expected_bytes, staging
    )

    def seal() -> None:
        write.seal()
        prune_checkpoints(output_dir, keep, milestone_interval, weights_only=not milestone_full_state)
        if on_sealed is not None:
            on_sealed(write.final)

    # Each part ends with the processes telling each other whether theirs failed; that exchange is
    # also the barrier, so a failure on one process ends the save on all of them, none left waiting.
    for part in (write.fresh_folder, write.accelerate_state, write.describe):
        write.together(part)
    if not background:
        write.together(seal if write.main else lambda: None)
        return Sealing(write.final)
    # every process has written (or staged) its part: the main process writes what was staged and seals
    # on its own while training goes on
    job = write.staged_then(seal)
    return Sealing(write.final, write.cleaned_on_failure(job), write.failure) if write.main else Sealing(write.final)


class _CheckpointWrite:
    """The parts of one save, in the order every process takes them: a fresh `step_N.tmp/`, Accelerate's
    state (every process), the self-description (main), the seal (main: manifest, flush, rename)."""

    def __init__(
        self,
        accelerator: Accelerator,
        output_dir: str | Path,
        train_state: dict[str, Any],
        model_config: PretrainedConfig,
        tokenizer: PreTrainedTokenizerBase,
        previous: Sealing | None,
        expected_bytes: int = 0,
        stage: HostStage | None = None,
    ):
        self.accelerator, self.output_dir, self.train_state = accelerator, output_dir, train_state
        self.expected_bytes = expected_bytes
        self.model_config, self.tokenizer, self.previous = model_config, tokenizer, previous
        self.step = train_state["step"]
        self.final = checkpoint_path(output_dir, self.step)
        self.tmp = self.final.with_name(self.final.name + TMP_SUFFIX)
        self.main, self.process = accelerator.is_main_process, accelerator.process_index
        self.stage, self.staged = stage, StagedState()  # what is left to write in the background

    def fresh_folder(self) -> None:
        earlier = self.previous.wait() if self.main and self.previous is not None else None
        if earlier is not None:
            raise _EarlierSaveFailed(earlier)
        if self.main:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp.mkdir(parents=True)

    def accelerate_state(self) -> None:  # every process writes its part (its RNG state at least)
        with quiet_about_the_tied_embedding():
            if self.stage is None:
                self.accelerator.save_state(str(self.tmp), safe_serialization=True)
            else:  # the model and optimizer states copied, for the seal's thread to write
                self.staged = self.stage.stage(self.accelerator, self.tmp)
        if not self.staged.files:  # a process that writes in the background meets its faults there
            self.full_disk_fault()

    def staged_then(self, seal: Callable[[], None]) -> Callable[[], None]:
        """`seal`, after the staged states (if any) are written: the background job of the main process."""
        if not self.staged.files:
            return seal

        def write_then_seal() -> None:
            self.staged.write()
            self.full_disk_fault()
            seal()

        return write_then_seal

    def full_disk_fault(self) -> None:  # the `disk-full` fault of the tests (faults.py)
        if fault_active("disk-full", self.step, self.process):
            cut = self.tmp / ("optimizer.bin" if self.main else f"random_states_{self.process}.pkl")
            cut.write_bytes(b"\0" * 64)  # a write cut short ...
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(cut))

    def describe(self) -> None:  # the sidecar and the self-description: small files
        if not self.main:
            return
        if fault_active("kill-during-save", self.step):
            os.kill(os.getpid(), signal.SIGKILL)  # state written, no manifest: a torn checkpoint
        (self.tmp / TRAIN_STATE).write_text(json.dumps(self.train_state, indent=1))
        self.model_config.save_pretrained(self.tmp)
        self.tokenizer.save_pretrained(self.tmp)

    def seal(self) -> None:  # the manifest (every file hashed), the flush, then the rename that completes it
        write_manifest(self.tmp)
        if self.final.exists():  # a re-save of the same step (e.g. after a resume): replace it whole
            shutil.rmtree(self.final)
        os.replace(self.tmp, self.final)
        fsync(self.final.parent)

    def needed_bytes(self) -> int:
        """About what this checkpoint takes: the largest complete one of the run, else the model's estimate."""
        sizes = [folder_bytes(c.path) for c in list_checkpoints(self.output_dir)]
        return max(sizes, default=self.expected_bytes)

    def failure(self, exc: BaseException) -> str | None:
        """What to tell the user of a failed part (what, where, the space left, what is intact), or None
        when `exc` is no failure to write (a bug: the caller raises it, traceback and all)."""
        if isinstance(exc, _EarlierSaveFailed):
            return str(exc)
        needed = self.needed_bytes()
        full = out_of_space(self.tmp, needed)
        if isinstance(exc, OSError):
            what = f"{exc.strerror or exc} ({exc.filename or self.tmp})"
            full = full or exc.errno in FULL_DISK_ERRNOS
        elif full:  # torch's and safetensors' writers hide the errno: the volume said it was full
            said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            what = f"No space left on device (the writer said: {said[:160]})"
        else:
            return None
        free = free_bytes(checkpoints_root(self.output_dir))
        on = f" on process {self.process}" if self.accelerator.num_processes > 1 else ""
        room = f", and a checkpoint of this run takes about {human_bytes(needed)}" if full and needed else ""
        previous_good = next((c.path for c in list_checkpoints(self.output_dir) if c.step < self.step), None)
        return (
            f"saving the step {self.step} checkpoint into {self.tmp} failed{on}: {what}; "
            f"{human_bytes(free)} free on that volume when it failed{room}. "
            + (
                f"The previous checkpoint {previous_good} is intact: free some space and rerun the same command "
                f"to resume from it."
                if previous_good
                else "There is no earlier checkpoint: free some space; the run starts over when rerun."
            )
        )

    def together(self, part: Callable[[], None]) -> None:
        """Run `part` here; raise `CheckpointSaveError` on every process if it failed on any of them."""
        error = _together(self.accelerator, part, self.failure)
        if error is not None:
            if self.main:
                shutil.rmtree(self.tmp, ignore_errors=True)
            raise CheckpointSaveError(error)

    def cleaned_on_failure(self, seal: Callable[[], None]) -> Callable[[], None]:
        """`seal` for the background thread: a failure removes the unfinished folder, then is raised."""

        def sealed_or_cleaned() -> None:
            try:
                seal()
            except Exception as exc:
                said = self.failure(exc)  # judged before the unfinished folder is removed: the state that failed
                shutil.rmtree(self.tmp, ignore_errors=True)
                if said is None:
                    raise
                raise _EarlierSaveFailed(said) from exc

        return sealed_or_cleaned


def _together(
    accelerator: Accelerator, part: Callable[[], None], failure: Callable[[BaseException], str | None]
) -> str | None:
    """Run `part` on this process; the first failure message of any process, the same on all of them.
    An exception that is no failure to write (`failure` says None) is raised here, after the others
    were told, so that none of them is left waiting for this one."""
    crash = None
    try:
        part()
        error = None
    except Exception as exc:
        error = failure(exc)
        if error is None:
            crash = exc
            error = f"process {accelerator.process_index} crashed while saving: {type(exc).__name__}: {exc}"
    if accelerator.num_processes > 1:
        error = next((e for e in gather_object([error]) if e is not None), None)
    if crash is not None:
        raise crash
    return error


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
        expected_bytes: int = 0,
    ):
        self.expected_bytes = expected_bytes  # about one checkpoint of this model: tells a full disk from a crash
        self.accelerator, self.train, self.model_config, self.tokenizer, self.log = (
            accelerator,
            train,
            model_config,
            tokenizer,
            log,
        )
        self._sealing: Sealing | None = None  # the last save, perhaps still sealing in the background
        # host memory for one training state, where a periodic save can stage it (not under FSDP)
        self._stage = HostStage() if train.async_save and can_stage(accelerator) else None

    def due(self, state: Progress) -> bool:
        """Every `save_interval` steps, and at the last step before a decay (the run's branch point)."""
        return state.step % self.train.save_interval == 0 or state.step == state.decay_start

    def save(
        self, train_state: dict[str, Any], last: bool = False, then: Callable[[Path, int], None] | None = None
    ) -> Path:
        """Save `train_state`; `then(path, step)` runs on the main process once the checkpoint is complete.

        A periodic save returns once every process has written its state (or, outside FSDP, copied
        the model and optimizer states to host memory), and the main process writes what was copied
        and seals it (hashing, manifest, rename, pruning) on a thread: the next save waits for that,
        and raises its failure. The `last` save of a session (a SIGTERM's included) writes on this
        thread and returns complete. Raises `CheckpointSaveError`.
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
            expected_bytes=self.expected_bytes,
            stage=self._stage,
        )
        return self._sealing.path
