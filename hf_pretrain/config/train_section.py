"""The recipe's `train:` section."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import key


@dataclass
class TrainConfig:
    """The run itself: where it lives, its seed, how long it is and how big a step is; the loop owns it
    (`training/loop.py`).
    """

    output_dir: str = key(
        "runs/smoke",
        "checkpoints, metrics, samples and final/ go here: a local folder, or an object-store URL "
        "(s3://BUCKET/PREFIX, gs://, hf://) trained through a local copy and resumable from any machine",
        math=False,
    )
    seed: int = key(1234, "model init and data order", ge=0, lt=2**32)
    # A cosine spans max_steps, so it shapes every step's learning rate; a wsd only its final decay.
    max_steps: int = key(100, "optimizer steps", ge=1)
    global_batch_tokens: int = key(
        8192, "tokens per optimizer step across all processes; accumulation is derived from it", ge=1
    )
    micro_batch_size: int = key(8, "sequences per forward pass on each process", ge=1)
