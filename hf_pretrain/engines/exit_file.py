"""The trainer's exit code, left where `hf-pretrain launch` reads it (launch_command.py).

A launcher between the trainer and the scheduler turns every code into its own (accelerate: 1, or
143 on a signal), so the wrapper names a folder in `HF_PRETRAIN_EXIT_DIR` and each trainer process
leaves two small files there: `pid.RANK` when it starts (whom the wrapper waits for) and `code.RANK`
when it ends. Unset (a plain `accelerate launch`), nothing is written. Imports nothing of the package.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "HF_PRETRAIN_EXIT_DIR"


def _folder() -> Path | None:
    folder = os.environ.get(ENV_VAR)
    return Path(folder) if folder else None


def _rank() -> str:
    return os.environ.get("RANK", "0")


def _write(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)  # whole or absent: the wrapper never reads half a number


def leave_pid() -> None:
    """At the trainer's start: this process's pid, under its rank."""
    folder = _folder()
    if folder is not None and folder.is_dir():
        _write(folder / f"pid.{_rank()}", str(os.getpid()))


def leave_exit_code(code: int) -> None:
    """At the trainer's end: its exit code, under its rank (a folder gone since: nothing to tell)."""
    folder = _folder()
    if folder is not None and folder.is_dir():
        _write(folder / f"code.{_rank()}", str(int(code)))


def codes_left(folder: Path) -> list[tuple[int, int, int]]:
    """(when written in ns, rank, code) of every trainer that left its code, the first written first."""
    found = []
    for path in folder.glob("code.*"):
        try:
            found.append((path.stat().st_mtime_ns, int(path.suffix[1:]), int(path.read_text())))
        except (OSError, ValueError):
            continue
    return sorted(found)


def pids_left(folder: Path) -> dict[int, int]:
    """pid -> rank of every trainer that started."""
    found = {}
    for path in folder.glob("pid.*"):
        try:
            found[int(path.read_text())] = int(path.suffix[1:])
        except (OSError, ValueError):
            continue
    return found
