"""The run's ledger of sessions (run_folder/sessions.py) between a machine's copy and the store.

`sessions.jsonl` travels as the other records do (store/run/pull.py's SMALL_FILES: up at every heartbeat
and at the end, down with the records), but it is never simply replaced: at a start, the store's copy
and this machine's are merged, record by record. A machine whose copy is behind (the sessions other
machines ran since, each killed before a new checkpoint) keeps them, so a relaunch storm is counted
whichever machines it ran on; and what this machine recorded and never uploaded (killed before its
heartbeat) is not lost to the store's older copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hf_pretrain.run_folder.sessions import ledger_path, merge

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from hf_pretrain.store.urls import StoreURL


def sessions_here(local: Path) -> bytes:
    """This machine's copy of the ledger, as it is before a pull (empty when none)."""
    try:
        return ledger_path(local).read_bytes()
    except OSError:
        return b""


def merge_sessions(fs: AbstractFileSystem, url: StoreURL, local: Path, before: bytes) -> None:
    """After the pull: the records of `before` (this copy's, before the pull) and of the store's ledger
    that the copy lacks, appended."""
    local.mkdir(parents=True, exist_ok=True)
    merge(local, before)
    try:
        theirs = fs.cat_file(url.join(ledger_path(".").name).path)
    except FileNotFoundError:
        return
    merge(local, theirs)
