"""One training at a time in a run folder: an exclusive lock that dies with its process.

`RunLock` holds an exclusive `flock` on `run.lock` for as long as the process lives: the kernel drops
it when the process ends, however it ends (SIGKILL and the OOM killer included), on local disks and
on NFS. The file names the holder (host, pid, start, command), so a second training is refused with
who holds the folder, and touches nothing in it; the doctor says the same (`holder_of`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Any

from hf_pretrain.run_folder.run_dir import RunDir


class RunLocked(RuntimeError):
    """Another session holds the run folder."""


class RunDirUnusable(RuntimeError):
    """The run folder cannot be created or written (read-only disk, no permission, a file in the way)."""


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class RunLock:
    """An exclusive lock on a run folder for the life of this process (`acquire` / `release`). `kind`
    names what holds such folders in the refusal (a training, a bench) and `flag` the option that
    chooses another one: `hf-pretrain bench` locks its --output the same way."""

    def __init__(self, run_dir: RunDir, kind: str = "training", flag: str = "--output_dir"):
        self.run_dir, self.kind, self.flag = run_dir, kind, flag
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise `RunLocked` naming its holder (`RunDirUnusable` when the folder cannot be
        written). On a filesystem without locks, warn and go on."""
        try:
            self.run_dir.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.run_dir.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            where = exc.filename or self.run_dir.path
            raise RunDirUnusable(
                f"cannot use {self.run_dir.path} as the {'run' if self.kind == 'training' else self.kind} folder: "
                f"{exc.strerror or exc} ({where}); "
                f"choose a {self.flag} on a writable disk (`hf-pretrain doctor` checks it)"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunLocked(self._refusal(holder)) from None
            print(
                f"warning: {self.run_dir.lock} cannot be locked ({exc.strerror}): nothing keeps a second "
                f"{self.kind} out of {self.run_dir.path}",
                file=sys.stderr,
            )
            return
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": now(), "command": command_line()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        self._fd = fd

    @property
    def held(self) -> bool:
        """Whether this process holds the lock (not on a filesystem without locks, where it only warned)."""
        return self._fd is not None

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)  # no holder named once nobody holds it
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def _refusal(self, holder: dict[str, Any]) -> str:
        who = (
            f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')} ({holder.get('command')})"
            if holder
            else "a session that is just starting"
        )
        stop = f"`kill -TERM {holder['pid']}` on {holder.get('host')}" if holder.get("pid") else "SIGTERM"
        return (
            f"{self.run_dir.path} is in use by another {self.kind}: {who}. {WHY_ONE_AT_A_TIME[self.kind]}; "
            f"wait for it to end, stop it ({stop}{SIGTERM_DOES[self.kind]}), or choose another {self.flag}"
        )


# why two of a kind must not share a folder, and what SIGTERM makes the holder do
WHY_ONE_AT_A_TIME = {
    "training": "Two trainings in one folder would interleave their metrics and overwrite each other's checkpoints",
    "bench": "Two benches in one folder would write over each other's runs, logs and results",
}
SIGTERM_DOES = {"training": ": it saves a checkpoint and exits", "bench": ""}


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}


def holder_of(run_dir: str | Path) -> dict[str, Any] | None:
    """Who holds the run folder's lock now (host, pid, since, command), if anyone: for the doctor."""
    path = RunDir(run_dir).lock
    if not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return _read_holder(fd) if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else None
    else:
        return None  # free (closing this descriptor drops the shared lock again)
    finally:
        os.close(fd)


# flags whose value is a secret: never written into status.json, the lock or a log. A flag is one when its
# name ends in one of these words (`--hub_token`, `--aws-secret`), not when it merely contains one
# (`--global_batch_tokens` is a number a reader needs).
_SECRET_FLAG = re.compile(r"(?:^|[_-])(?:token|secret|password|api[_-]key|access[_-]key)$")


def _is_secret_flag(arg: str) -> bool:
    return arg.startswith("--") and bool(_SECRET_FLAG.search(arg[2:].split("=")[0].lower()))


def _script_as_typed(first: Path) -> str:
    """How another machine runs the script `first`: a script of a clone of this project as
    `hf_pretrain/train.py` (run from the clone's root, as the README does), the installed package's as
    `-m hf_pretrain.train`, any other relative to here when it lies below, else by name."""
    if first.suffix == ".py" and first.parent.name == "hf_pretrain":
        clone = first.resolve().parent.parent
        return f"hf_pretrain/{first.name}" if (clone / "pyproject.toml").is_file() else f"-m hf_pretrain.{first.stem}"
    try:
        return str(first.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return first.name


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed, in a form another machine can run: the console script as `hf-pretrain`, a
    script of this project relative to the project (`hf_pretrain/train.py`, after the launcher's own
    name), never an absolute path of this clone; a secret flag's value masked, the store's keys too."""
    from hf_pretrain.processes import launcher
    from hf_pretrain.redaction import MASK, redact

    argv = list(sys.argv if argv is None else argv)
    first = Path(argv[0]) if argv else Path("python")
    if first.name == "hf-pretrain":
        head = ["hf-pretrain"]
    else:
        head = [*(launcher() or "python").split(), *_script_as_typed(first).split()]
    rest, masked = [], False
    for arg in argv[1:]:
        if masked:
            rest.append(MASK)
        elif "=" in arg and _is_secret_flag(arg):
            rest.append(arg.split("=")[0] + "=" + MASK)
        else:
            rest.append(arg)
        masked = "=" not in arg and _is_secret_flag(arg)
    return redact(shlex.join([*head, *rest]))
