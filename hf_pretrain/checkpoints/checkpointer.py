"""When a run saves: every `save_interval` steps, at the branch point before a decay, and on its way
out, whatever the reason; and with what (the model config and tokenizer that make each checkpoint
describe itself). How one save is written is checkpoints/saving.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from accelerate import Accelerator
from transformers import PretrainedConfig, PreTrainedTokenizerBase

from hf_pretrain.checkpoints.async_save import HostStage, can_stage
from hf_pretrain.checkpoints.layout import BRANCH_POINT
from hf_pretrain.checkpoints.progress import Activity
from hf_pretrain.checkpoints.saving import CheckpointSaveError, Sealing, save_checkpoint
from hf_pretrain.config.checkpoints_section import CheckpointConfig
from hf_pretrain.run_folder.run_dir import RunDir

__all__ = ["CheckpointSaveError", "Checkpointer", "save_checkpoint"]


class Progress(Protocol):
    """What the checkpointer reads of a run's state (training/state.py's `TrainState`)."""

    step: int
    decay_start: int | None


class Checkpointer:
    """When the run saves (every `save_interval` steps, and on its way out, whatever the reason) and
    what with: the model config and tokenizer that make each checkpoint describe itself."""

    def __init__(
        self,
        checkpoints: CheckpointConfig,
        *,
        accelerator: Accelerator,
        output_dir: str | Path,
        model_config: PretrainedConfig,
        tokenizer: PreTrainedTokenizerBase,
        log: Callable[[str], None],
        expected_bytes: int = 0,
        activity: Activity = None,
    ):
        """Built from the recipe's `checkpoints` section, with what the run has made by keyword."""
        self.expected_bytes = expected_bytes  # about one checkpoint of this model: tells a full disk from a crash
        self.accelerator, self.model_config, self.tokenizer, self.log = accelerator, model_config, tokenizer, log
        self.output_dir, self.checkpoints = output_dir, checkpoints
        # the live line of a wait for a save, and status.json's `activity`: the main process's
        self.say, self.activity = (log, activity) if accelerator.is_main_process else (None, None)
        self._sealing: Sealing | None = None  # the last save, perhaps still sealing in the background
        # host memory for one training state, where a periodic save can stage it (not under FSDP)
        self._stage = HostStage() if checkpoints.async_save and can_stage(accelerator) else None

    def due(self, state: Progress) -> bool:
        """Every `save_interval` steps, and at the last step before a decay (the run's branch point)."""
        return state.step % self.checkpoints.save_interval == 0 or state.step == state.decay_start

    def save(
        self, train_state: dict[str, Any], last: bool = False, then: Callable[[Path, int], None] | None = None
    ) -> Path:
        """Save `train_state`; `then(path, step)` runs on the main process once the checkpoint is complete.

        A periodic save returns once every process has written its state (or, outside FSDP, copied
        the model and optimizer states to host memory), and the main process writes what was copied
        and seals it (manifest, flush, rename, pruning) on a thread: the next save waits for that,
        and raises its failure. The `last` save of a session (a SIGTERM's included) writes on this
        thread, alongside the previous save if it is still being written, and returns complete,
        showing its progress when it takes more than a few seconds. Raises `CheckpointSaveError`.
        """
        if train_state["step"] == train_state.get("decay_start"):
            train_state = {**train_state, BRANCH_POINT: True}
        step = train_state["step"]

        def sealed(path: Path) -> None:
            run = RunDir(self.output_dir)
            if run.shown_as() != str(run.path):  # a run URL: saved here, in the store once uploaded (said then)
                self.log(f"step {step}: saved, on its way to {run.show(path)}")
            else:
                self.log(f"step {step}: saved {path}")
            if then is not None:
                try:
                    then(path, step)
                except Exception as exc:  # a side job is never a reason to lose the run
                    self.log(f"warning: the side jobs of step {step} did not start: {type(exc).__name__}: {exc}")

        self._sealing = save_checkpoint(
            self.accelerator,
            self.output_dir,
            train_state,
            self.checkpoints.keep_checkpoints,
            self.model_config,
            self.tokenizer,
            self.checkpoints.milestone_interval,
            background=not last,
            previous=self._sealing,
            on_sealed=sealed,
            milestone_full_state=self.checkpoints.milestone_full_state,
            expected_bytes=self.expected_bytes,
            stage=self._stage,
            say=self.say,
            activity=self.activity,
        )
        return self._sealing.path
