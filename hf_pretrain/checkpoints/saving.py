"""How the processes of a run write one checkpoint together.

A checkpoint is written into `step_N.tmp/` by every process (Accelerate's state), described by the
main process (train state, config, tokenizer), then sealed: its manifest written, the folder flushed
and renamed to `step_N/` (checkpoints/manifest.py), and older ones pruned (checkpoints/store.py).
The processes agree after each part, so a failure on one ends the save on all of them, none left
waiting; a failure on the seal's thread is said by the next save, on every process.

Every byte goes to the disk once: the model and optimizer states are written by
`StagedState.write` (checkpoints/async_save.py), checksummed and flushed as they are written, so
the seal reads back only the small files. Where the state is whole on each process (not FSDP):
- a periodic save (`background`) copies the states into host memory on the training thread and
  writes them, then seals, on a thread while training goes on; the next save waits for it;
- the last save of a session writes the states where they are, on the calling thread, while the
  previous save may still be finishing on its own (training is over: nothing changes them); it waits
  for that one only before its own seal, so a stop costs the disk's time for the bytes, not the sum
  of two saves one after the other.
Under FSDP, DeepSpeed or XLA, `save_state` writes on the training thread and the seal checksums
its files by reading them once.

A wait longer than a few seconds shows one live line (checkpoints/progress.py) through `say`, and
`activity` (status.json) says `saving` while it lasts.
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
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import gather_object
from transformers import PretrainedConfig, PreTrainedTokenizerBase

from hf_pretrain.checkpoints import disk_space
from hf_pretrain.checkpoints.async_save import HostStage, StagedState, can_stage
from hf_pretrain.checkpoints.layout import TMP_SUFFIX, TRAIN_STATE, checkpoint_path, checkpoints_root
from hf_pretrain.checkpoints.manifest import fsync, write_manifest
from hf_pretrain.checkpoints.progress import Activity, ByteCount, LiveLine, Say
from hf_pretrain.checkpoints.store import list_checkpoints, prune_checkpoints
from hf_pretrain.faults import fault_active
from hf_pretrain.formatting import human_bytes


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


class Sealing:
    """The write and seal of a save that may still be running on a thread of the main process, and
    its bytes written so far (`count`). The thread is not a daemon: a process that ends while it runs
    finishes it first."""

    def __init__(
        self,
        path: Path,
        seal: Callable[[], None] | None = None,
        failure: Callable[[BaseException], str | None] | None = None,
        count: ByteCount | None = None,
    ):
        self.path, self.count, self._error, self._crash = path, count or ByteCount(), None, None
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

    def wait(self, say: Say = None, activity: Activity = None) -> str | None:
        """None once the checkpoint is complete, else why it is not (the previous one is intact). A
        wait that lasts shows the bytes this save has written, through `say`."""
        if self._thread is not None:
            with LiveLine(f"saving {self.path.name} (under way)", self.count, say, activity):
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
    say: Say = None,
    activity: Activity = None,
) -> Sealing:
    """Write the full training state for `train_state["step"]`, atomically, then prune old ones.

    Beside Accelerate's state the folder holds `config.json` and the tokenizer, so a checkpoint
    describes itself: export, eval and the demo need nothing else from the run. Nothing older is
    touched until the new folder is complete, so a failure at any point leaves the last good one.
    A failure on any process raises the same `CheckpointSaveError` on every process.

    With `background` and a `stage` (host buffers, reused by every save), where `can_stage` allows
    it, the model and optimizer states are only copied on the calling thread; the main process
    writes them and seals (manifest, flush, rename, prune, then `on_sealed(path)`) on a thread, and
    this returns. `previous` (the last save's `Sealing`) is waited for first, and its failure raised
    here, on every process. Without `background` the checkpoint is complete when this returns; the
    previous save is waited for only before the seal. `expected_bytes` (about what a checkpoint of
    this model takes) tells a full disk from a crash when the run has no checkpoint yet to measure.
    """
    write = _CheckpointWrite(
        accelerator, output_dir, train_state, model_config, tokenizer, previous, expected_bytes, say, activity
    )
    write.background = background
    if can_stage(accelerator):  # else Accelerate's `save_state` writes (FSDP, DeepSpeed, XLA)
        # a periodic save copies into the run's buffers; the last one (or one without buffers) writes directly
        write.stage, write.in_buffers = (stage, True) if background and stage is not None else (HostStage(), False)

    def seal() -> None:
        write.seal()
        prune_checkpoints(output_dir, keep, milestone_interval, weights_only=not milestone_full_state)
        if on_sealed is not None:
            on_sealed(write.final)

    # Each part ends with the processes telling each other whether theirs failed; that exchange is
    # also the barrier, so a failure on one process ends the save on all of them, none left waiting.
    shows = LiveLine(f"saving {write.final.name}", write.count, say, activity) if not background else nullcontext()
    with shows:
        for part in (write.fresh_folder, write.accelerate_state, write.describe):
            write.together(part)
        if not background:
            write.together(seal if write.main else lambda: None)
            return Sealing(write.final, count=write.count)
    # every process has written (or staged) its part: the main process writes what was staged and seals
    # on its own while training goes on
    job = write.staged_then(seal)
    if not write.main:
        return Sealing(write.final)
    return Sealing(write.final, write.cleaned_on_failure(job), write.failure, write.count)


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
        say: Say = None,
        activity: Activity = None,
    ):
        self.accelerator, self.output_dir, self.train_state = accelerator, output_dir, train_state
        self.expected_bytes, self.say, self.activity = expected_bytes, say, activity
        self.model_config, self.tokenizer, self.previous = model_config, tokenizer, previous
        self.step = train_state["step"]
        self.final = checkpoint_path(output_dir, self.step)
        self.tmp = self.final.with_name(self.final.name + TMP_SUFFIX)
        self.main, self.process = accelerator.is_main_process, accelerator.process_index
        self.stage: HostStage | None = None  # None: Accelerate's `save_state` writes (FSDP, DeepSpeed, XLA)
        self.in_buffers = False  # the states copied into the stage's buffers, written by the seal's thread
        self.staged = StagedState()  # what is left to write in the background
        self.count = self.staged.count  # bytes written of the states, for the live line
        self.checksums: dict[str, str] = {}  # computed as the states were written
        self.background = False  # sealed on a thread: this save waits for the previous one first

    def wait_for_previous(self) -> None:
        """The previous save complete, or its failure raised (main process; the others have no thread)."""
        earlier = self.previous.wait(self.say, self.activity) if self.main and self.previous is not None else None
        self.previous = None
        if earlier is not None:
            raise _EarlierSaveFailed(earlier)

    def fresh_folder(self) -> None:
        if self.background:  # the stage's buffers may still be being written from; one seal thread at a time
            self.wait_for_previous()
        if self.main:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp.mkdir(parents=True)

    def accelerate_state(self) -> None:  # every process writes its part (its RNG state at least)
        with quiet_about_the_tied_embedding():
            if self.stage is None:
                self.accelerator.save_state(str(self.tmp), safe_serialization=True)
            else:  # the model and optimizer states: copied for the seal's thread, or written now
                self.staged = self.stage.stage(self.accelerator, self.tmp, in_buffers=self.in_buffers)
                self.count.grow(self.staged.count.total)
                self.staged.count = self.count
                if not self.in_buffers:
                    self.checksums = self.staged.write()
                    self.staged = StagedState(count=self.count)
        if not self.staged.files:  # a process that writes in the background meets its faults there
            self.full_disk_fault()

    def staged_then(self, seal: Callable[[], None]) -> Callable[[], None]:
        """`seal`, after the staged states (if any) are written: the background job of the main process."""
        if not self.staged.files:
            return seal

        def write_then_seal() -> None:
            self.checksums = self.staged.write()
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

    def seal(self) -> None:  # the manifest (the states' checksums known), the flush, the rename that completes it
        self.wait_for_previous()  # the last save waits here, its own bytes written: the checkpoints complete in order
        write_manifest(self.tmp, self.checksums, self.count)
        if self.final.exists():  # a re-save of the same step (e.g. after a resume): replace it whole
            shutil.rmtree(self.final)
        os.replace(self.tmp, self.final)
        fsync(self.final.parent)

    def needed_bytes(self) -> int:
        """About what this checkpoint takes: the largest complete one of the run, else the model's estimate."""
        sizes = [disk_space.folder_bytes(c.path) for c in list_checkpoints(self.output_dir)]
        return max(sizes, default=self.expected_bytes)

    def failure(self, exc: BaseException) -> str | None:
        """What to tell the user of a failed part (what, where, the space left, what is intact), or None
        when `exc` is no failure to write (a bug: the caller raises it, traceback and all)."""
        if isinstance(exc, _EarlierSaveFailed):
            return str(exc)
        needed = self.needed_bytes()
        full = disk_space.out_of_space(self.tmp, needed)
        if isinstance(exc, OSError):
            what = f"{exc.strerror or exc} ({exc.filename or self.tmp})"
            full = full or exc.errno in disk_space.FULL_DISK_ERRNOS
        elif full:  # torch's and safetensors' writers hide the errno: the volume said it was full
            said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            what = f"No space left on device (the writer said: {said[:160]})"
        else:
            return None
        free = disk_space.free_bytes(checkpoints_root(self.output_dir))
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
