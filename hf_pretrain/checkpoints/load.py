"""Reading a checkpoint into memory: its weights into a bare model (FSDP shards merged), or the whole
training state (weights, optimizer, random state) into a run's Accelerator."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import load as load_torch_file
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from hf_pretrain.checkpoints.layout import FSDP_SHARDED_WEIGHTS, WEIGHTS, parameter_name, rng_state_file
from hf_pretrain.checkpoints.manifest import CheckpointError, CheckpointMismatch, verify_checkpoint
from hf_pretrain.config.model_section import shape_differences

# How to go on when the run folder's checkpoints do not fit the recipe; nothing in the folder is touched.
START_OVER = (
    "go back to the recipe the checkpoints were saved with, or start a new run in a new folder "
    "(--resume none --output_dir NEW); this folder is left as it is"
)


def shape_mismatch(folder: Path, wanted: dict[str, Any]) -> str | None:
    """Why the model saved in `folder` (its config.json) cannot take the shape `wanted`, naming each
    key that differs; None when they agree or the folder has no readable config to compare with."""
    try:
        saved = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    differences = shape_differences(saved, wanted)
    if not differences:
        return None
    what = ", ".join(f"{key} {old} -> {new}" for key, (old, new) in differences.items())
    return f"{folder} holds a model of another shape than this recipe's: {what}"


def model_state_dict(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint, whichever way Accelerate saved them, under the bare model's names."""
    if (checkpoint / FSDP_SHARDED_WEIGHTS).is_dir():
        # The routine accelerate's `merge_fsdp_weights` wraps, called directly: that helper also
        # waits for every process, which would hang when only the main process exports mid-run.
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as scratch:
            merged = Path(scratch) / "merged.pt"
            dcp_to_torch_save(checkpoint / FSDP_SHARDED_WEIGHTS, merged)
            state = torch.load(merged, weights_only=True)
        state = state["model"] if set(state) == {"model"} else state  # accelerate saves {"model": weights}
    elif (checkpoint / WEIGHTS).is_file():
        state = load_file(checkpoint / WEIGHTS)
    else:
        raise CheckpointError(
            f"{checkpoint} has neither {WEIGHTS} nor {FSDP_SHARDED_WEIGHTS}/: no model weights to read"
        )
    return {parameter_name(name): tensor for name, tensor in state.items()}


def load_checkpoint_model(checkpoint: Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The trained model of a checkpoint folder, every weight accounted for, ready for generation."""
    config = AutoConfig.from_pretrained(checkpoint, local_files_only=True)
    config.use_cache = True  # training turns the KV cache off; inference wants it
    model = AutoModelForCausalLM.from_config(config)
    state = model_state_dict(checkpoint)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # A tied output projection is saved once, under the input embedding's name; it counts as loaded.
    own = model.state_dict()
    loaded = {own[name].data_ptr() for name in state if name in own}
    missing = [name for name in missing if own[name].data_ptr() not in loaded]
    if missing or unexpected:
        raise CheckpointMismatch(
            f"{checkpoint}: the weights do not match config.json (missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    return model.to(dtype).eval()


def restore_continuation(accelerator: Accelerator, folder: Path | None, log: Callable[[str], None] = print) -> dict:
    """The prepared run of `accelerator` restored from the checkpoint the resume decision chose
    (checkpoints/resume_decision.py), with its train state; {} for a run that starts (`folder` None).
    Its files were checked against the manifest by the decision: read again here, not verified."""
    if folder is None:
        return {}
    restore_training_state(accelerator, folder, log)
    return verify_checkpoint(folder, checksums=False)


def restore_training_state(accelerator: Accelerator, folder: Path, log: Callable[[str], None] = print) -> None:
    """Load weights, optimizer and random state from `folder` into the prepared run of `accelerator`.

    The folder was chosen, verified and found resumable before (checkpoints/resume_decision.py: not a
    weights-only milestone, the recipe's shape); what fails here is this run (its model, optimizer or setup), raised
    as `CheckpointMismatch` naming the checkpoint.
    """
    try:
        # model weights from safetensors; optimizer and RNG through torch.load(weights_only=True)
        accelerator.load_state(str(folder))
    except Exception as exc:
        raise CheckpointMismatch(
            f"{folder} is complete but does not load into this run: {type(exc).__name__}: {exc}; {START_OVER}"
        ) from exc
    dropped = rng_not_restored(folder, accelerator.process_index, on_gpu=accelerator.device.type == "cuda")
    if dropped:  # Accelerate goes on without it, saying nothing above its info log level
        say = log if accelerator.is_main_process else print
        say(
            f"resume: warning: process {accelerator.process_index} goes on with fresh random state: {dropped}. "
            f"The data order does not depend on it, but the run is no longer bitwise the run it would have been"
        )


def rng_not_restored(folder: Path, process_index: int, on_gpu: bool) -> str | None:
    """Why this process's random state was not restored from `folder`, or None when it was. `on_gpu`: the
    run's processes are on CUDA (the accelerator's device), whose random states are compared too."""
    path = rng_state_file(folder, process_index)
    if not path.is_file():
        return f"{path.name} is missing (the checkpoint was saved by fewer processes?)"
    try:
        states = load_torch_file(path)
        restored = torch.equal(torch.get_rng_state(), states["torch_manual_seed"])
        if on_gpu:
            restored = restored and all(
                torch.equal(now, saved)
                for now, saved in zip(torch.cuda.get_rng_state_all(), states["torch_cuda_manual_seed"], strict=True)
            )
    except Exception as exc:  # whatever Accelerate tripped over, said the way it was met
        return f"{path.name} is unreadable ({type(exc).__name__}: {exc})"
    return None if restored else f"{path.name} could not be applied"
