"""What a checkpoint folder holds, by name: one place knows the file layout, Accelerate's included.

RUN/checkpoints/step_00001000/    a complete checkpoint (step_N.tmp/ while it is written; step_N.corrupt/
                                  once it failed its verification, set aside with SET_ASIDE.txt saying why)
    manifest.json                 every other file with its size and checksum (manifest.py)
    train_state.json              the sidecar: step, tokens, data position, schedule, lineage
    config.json, tokenizer*       the model's shape and tokenizer: the folder describes itself
    model.safetensors             Accelerate's weights (or pytorch_model_fsdp_0/ under FSDP)
    optimizer.bin, random_states_R.pkl, ...   the rest of Accelerate's training state
"""

from __future__ import annotations

from pathlib import Path

from hf_pretrain.run_folder.run_dir import RunDir

# Accelerate's name for its RNG states (accelerate.utils.RNG_STATE_NAME, held equal by a test): written
# here so that reading a layout does not import Accelerate and torch (`stop`, `report`: a second each)
RNG_STATE_NAME = "random_states"

MANIFEST = "manifest.json"
TRAIN_STATE = "train_state.json"
PREFIX = "step_"
TMP_SUFFIX = ".tmp"  # being written; never resumed from
PIN_SUFFIX = ".pin"  # hard-linked copy held by a reader that may outlast the original (store.pin_checkpoint)
SLIM_SUFFIX, FULL_SUFFIX = ".slim", ".full"  # a milestone being reduced to its weights, and its old self
SUPERSEDED_SUFFIX = ".superseded"  # checkpoints of an ending a run went further from; ignored by resume
# a checkpoint that failed its verification, set aside (renamed, never deleted: it is evidence) so that no
# reader takes it for one and retention never counts it; `SET_ASIDE_NOTE` inside it says why and when
CORRUPT_SUFFIX = ".corrupt"
SET_ASIDE_NOTE = "SET_ASIDE.txt"

# Accelerate's names for the model weights: one safetensors file, or a torch.distributed.checkpoint
# (DCP) folder from FSDP's SHARDED_STATE_DICT save.
WEIGHTS = "model.safetensors"
FSDP_SHARDED_WEIGHTS = "pytorch_model_fsdp_0"
OPTIMIZER_STATE = "optimizer.bin"  # Accelerate's name (accelerate.utils.OPTIMIZER_NAME + ".bin")
# What only a resume reads: optimizer, RNG, scheduler, scaler and sampler states (by file or folder name)
TRAINING_ONLY_PREFIXES = ("optimizer", "random_states", "scheduler", "scaler", "sampler", "custom_checkpoint")
# Prefixes wrappers put in front of parameter names: torch.compile, DDP.
WRAPPER_PREFIXES = ("_orig_mod.", "module.")

# train_state.json keys the room itself reads
WEIGHTS_ONLY = "weights_only"  # a milestone that kept its weights only: export reads it, a resume cannot
BRANCH_POINT = "branch_point"  # the last checkpoint before a decay, never pruned: a run goes further from it


def checkpoints_root(output_dir: str | Path) -> Path:
    return RunDir(output_dir).checkpoints


def checkpoint_path(output_dir: str | Path, step: int) -> Path:
    return checkpoints_root(output_dir) / f"{PREFIX}{step:08d}"


def is_checkpoint(path: Path) -> bool:
    """Whether `path` is a checkpoint folder (whole or not), rather than a run or model folder."""
    return (path / MANIFEST).is_file() or (path / TRAIN_STATE).is_file()


def rng_state_file(folder: Path, process_index: int) -> Path:
    return folder / f"{RNG_STATE_NAME}_{process_index}.pkl"


def weights_file(model_index: int) -> str:
    """The file Accelerate's `save_state` writes the `model_index`-th prepared model's weights into."""
    return WEIGHTS if model_index == 0 else WEIGHTS.replace(".", f"_{model_index}.")


def optimizer_file(optimizer_index: int) -> str:
    """The file Accelerate's `save_state` writes the `optimizer_index`-th optimizer's state into."""
    return OPTIMIZER_STATE if optimizer_index == 0 else OPTIMIZER_STATE.replace(".", f"_{optimizer_index}.")


def parameter_name(saved_name: str) -> str:
    """A parameter's name as the bare model knows it, whatever wrapper saved it."""
    for prefix in WRAPPER_PREFIXES:
        if saved_name.startswith(prefix):
            saved_name = saved_name[len(prefix) :]
            break
    # regional compilation (`compile_regions`) wraps each block: model.layers.0._orig_mod.mlp...
    return saved_name.replace("._orig_mod.", ".")
