"""The recipe's `store:` section."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import key


@dataclass
class StoreConfig:
    """A run in object storage: where its local copy lives, how long the end waits for uploads, the lease's
    heartbeat (`store/run/` owns it).
    """

    cache_dir: str | None = key(
        None,
        "where the local copies of a URL output_dir and data_dir live (unset: $HF_PRETRAIN_HOME, else "
        "~/.cache/hf_pretrain)",
        math=False,
    )
    store_wait_s: float = key(
        300,
        "a URL output_dir: how long the end of a run, a stop or a SIGTERM waits for the uploads to finish",
        math=False,
        ge=0,
    )
    store_heartbeat_s: float = key(
        30,
        "a URL output_dir: the lease's heartbeat; another machine takes over after 3 missed heartbeats",
        math=False,
        gt=0,
    )
