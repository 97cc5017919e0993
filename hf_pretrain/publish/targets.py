"""Whether a file or folder can be written where a command was told to write it, asked before any
work: a folder under a file, a read-only or pseudo filesystem (/proc, /sys) is one line, not a
traceback after minutes of loading a model."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hf_pretrain.checkpoints.disk_space import nearest_existing


def unwritable_reason(folder: Path) -> str | None:
    """Why nothing can be created in `folder` (made with its parents if missing), None if it can."""
    existing = nearest_existing(folder)
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        with tempfile.TemporaryDirectory(dir=existing, prefix=".hf-pretrain-probe-"):
            pass
    except OSError as exc:
        return f"{existing} cannot be written ({exc.strerror or exc})"
    return None
