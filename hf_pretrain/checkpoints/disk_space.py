"""Whether a failed write failed for want of room.

A full disk is named as one: ENOSPC/EDQUOT say so themselves, but torch's zip writer hides the errno
("unexpected pos 5188928 vs 5188816", "PytorchStreamWriter failed writing file") and safetensors wraps
it, so a failed write is judged by the volume at the moment it failed (`out_of_space`), never by its
words alone: a bug that raises the same words on a roomy disk is still a crash, with its traceback.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
PROBE_BYTES = 1 << 20  # a write this small refused for space: the volume (or the quota) is full


def out_of_space(folder: Path, needed: int) -> bool:
    """Whether a write into `folder` that just failed failed for want of room: less free on its volume
    than a checkpoint needs, or a small probe write refused with ENOSPC/EDQUOT (a quota that statvfs
    does not show). Call it before the unfinished folder is removed: that is the state that failed."""
    where = nearest_existing(folder)
    if free_bytes(where) < needed:
        return True
    probe = where / f".hf-pretrain-space-probe-{os.getpid()}"
    try:
        with probe.open("wb") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return exc.errno in FULL_DISK_ERRNOS
    finally:
        probe.unlink(missing_ok=True)
    return False


def nearest_existing(path: Path) -> Path:
    """`path`, or its closest ancestor that exists: where it would be created (the disk a run, an export
    or a checkpoint that failed to be made writes on). The one copy: the doctor and `publish/targets.py` ask here."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(nearest_existing(path)).free


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
