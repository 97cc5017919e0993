"""The recipe's `checkpoints:` section."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import key


@dataclass
class CheckpointConfig:
    """When a run saves, what it keeps, and from where and under what changes it resumes (`checkpoints/`
    owns it).
    """

    resume: str = key(
        "auto", "`auto` (newest good checkpoint in output_dir, if any), `none`, or a checkpoint folder", math=False
    )
    allow_schedule_change: bool = key(
        False,
        "resume a cosine run under another max_steps or schedule although every "
        "later step's learning rate changes (the log says how)",
        math=False,
    )
    allow_recipe_change: bool = key(
        False,
        "resume under another global_batch_tokens or seq_len: the data position is recomputed in tokens",
        math=False,
    )
    allow_data_change: bool = key(
        False,
        "resume on training shards other than the checkpoint's (same tokenizer): the card records the step "
        "where the data changed. Another tokenizer is always refused",
        math=False,
    )
    save_interval: int = key(100, "checkpoint every this many steps", math=False, ge=1)
    keep_checkpoints: int = key(
        2, "checkpoints kept; older ones are deleted once a newer one is complete", math=False, ge=1
    )
    milestone_interval: int = key(
        0, "also keep every checkpoint at a multiple of this step, never pruned (0 = none)", math=False, ge=0
    )
    milestone_full_state: bool = key(
        False,
        "keep milestones whole (resumable: optimizer and RNG too, ~6x the bytes) "
        "rather than their bf16 weights, which export, eval and the demo read",
        math=False,
    )
    async_save: bool = key(
        True,
        "a periodic save copies the model and optimizer states to host memory and writes them in the "
        "background (one training state of host memory); false writes them while training waits. "
        "FSDP always writes while training waits",
        math=False,
    )
