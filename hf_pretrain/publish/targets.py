"""Whether a file or folder can be written where a command was told to write it, asked before any
work: a folder under a file, a read-only or pseudo filesystem (/proc, /sys) is one line, not a
traceback after minutes of loading a model. And whose files are in it: a command that writes a few
files into a folder (`space`) writes only into an empty one or one it wrote itself, proved by the
record it leaves there (`WRITTEN_RECORD`: each file's name and SHA-256), never over a user's file."""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterable
from pathlib import Path

WRITTEN_RECORD = ".hf-pretrain-written.json"  # what a command wrote into a folder, kept there (never pushed)


def nearest_existing(path: Path) -> Path:
    """`path` itself or its closest ancestor that exists (where it would be created)."""
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


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


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def not_ours(out: Path, names: Iterable[str], command: str) -> list[str]:
    """What in `out` `command` would write over without proof it wrote it: nothing when `out` is absent
    or empty; in a folder with the record of `command`, each of `names` there that it did not write or
    that changed since (the folder's other files it never touches); in any other folder, everything in
    it (it may be a user's project: the caller refuses, naming them)."""
    if not out.is_dir() or not any(out.iterdir()):
        return []
    try:
        record = json.loads((out / WRITTEN_RECORD).read_text())
        written = record["files"] if record.get("command") == command else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        written = None
    if not isinstance(written, dict):
        return sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir())
    clashes = []
    for name in names:
        path = out / name
        if path.exists() and (not path.is_file() or written.get(name) != _sha256(path)):
            clashes.append(f"{name} ({'changed since' if name in written else 'not written by'} {command})")
    return clashes


def record_written(out: Path, names: Iterable[str], command: str) -> None:
    """Leave in `out` the record that `command` wrote `names` there, as they are now (`not_ours` reads it)."""
    files = {name: _sha256(out / name) for name in names}
    (out / WRITTEN_RECORD).write_text(json.dumps({"command": command, "files": files}, indent=1) + "\n")
