"""The recipe's `publish:` section."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import key


@dataclass
class PublishConfig:
    """What a run pushes to the Hub while and after it trains (`publish/` owns it)."""

    push_to_hub: str = key(
        "",
        "Hub repo to publish to (empty = none): final/ goes to `main` at the end and, with "
        "push_checkpoints, every checkpoint to a `step-N` branch as it is saved",
        math=False,
    )
    push_checkpoints: bool = key(False, "push every checkpoint to a `step-N` branch of push_to_hub", math=False)
    push_private: bool = key(False, "create the push_to_hub repo private", math=False)
