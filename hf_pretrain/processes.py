"""How the processes of a run end together: a child that learns its parent is gone.

`accelerate launch` runs the trainer as a child process and, on SIGTERM (what a scheduler or a
container runtime sends), exits at once without passing the signal on: the trainer would go on
as an orphan, and a restart would put two trainings in one folder. Linux sends a child a signal
of its choice when its parent exits (`prctl(PR_SET_PDEATHSIG)`): the trainer asks for SIGHUP and
stops as it does on SIGTERM, with a checkpoint (training/guards.py); the data loader's workers ask
for SIGKILL, so they never outlive the trainer. Elsewhere the trainer polls its parent's pid at
every step instead.

The parent-death signal follows the *parent*; a process can also end with one that is not its parent
(`die_with`): `prepare`'s datatrove workers are children of multiprocess's forkserver, which itself
lives for as long as any worker does (each holds its "alive" pipe), so they follow `prepare` itself.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# What the trainer receives when its launcher exits: not SIGTERM, so that a launcher that forwards
# SIGTERM first (torchrun) and then exits does not count as a second, immediate-exit signal.
LAUNCHER_GONE = signal.SIGHUP

_followed_parent: int | None = None  # the launcher this process stops with (`follow_launcher`)


def launcher() -> str | None:
    """The launcher this process runs under, from the environment it sets; None for a top process
    (`hf-pretrain train`, `python train.py`), whose own exit code reaches whoever started it."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return "torchrun"
    if "ACCELERATE_USE_CPU" in os.environ:  # set by every `accelerate launch`
        return "accelerate launch"
    return None


def die_with_parent(sig: int) -> bool:
    """Ask the kernel to send `sig` to this process when its parent exits (Linux); False where it cannot.
    A parent that is already gone by the time it is armed is treated as just gone: `sig` at once."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


# What a launcher's command line names (accelerate launch, torchrun, `python -m torch.distributed.run`).
LAUNCHER_COMMANDS = ("accelerate", "torchrun", "torch.distributed", "deepspeed")
_orphaned_before_following = False  # the parent was no launcher when we began to follow it: it had exited


def command_of(pid: int) -> str | None:
    """Process `pid`'s command line (Linux), None where it cannot be read."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def left_by_launcher(parent: int, parent_command: str | None) -> bool:
    """Whether this process's parent is what adopts an orphan rather than a launcher: init (pid 1) or a
    subreaper that is no Python program. A parent that names a launcher is one (a container may run
    `accelerate launch` as its pid 1); so is any other Python parent that is not pid 1 (a driver of
    its own that sets the launcher's environment, as the tests do)."""
    if parent_command is None or any(name in parent_command for name in LAUNCHER_COMMANDS):
        return False
    return parent == 1 or "python" not in parent_command


def follow_launcher() -> int | None:
    """Under a launcher, stop when it does: LAUNCHER_GONE on its exit, and `launcher_gone()` for the
    polls. Returns the launcher's pid (None for a top process, which must outlive a closed shell).
    A parent that is not a launcher (by its command line) is a launcher that exited before this
    process began to follow it, leaving it to init or a subreaper: `launcher_gone()` says so."""
    global _followed_parent, _orphaned_before_following
    if launcher() is None:
        return None
    if _followed_parent is None:  # the first call arms
        _followed_parent = os.getppid()
        die_with_parent(LAUNCHER_GONE)
        _orphaned_before_following = left_by_launcher(_followed_parent, command_of(_followed_parent))
    elif signal.getsignal(LAUNCHER_GONE) is _gone_while_starting:  # the session's call: its handlers take over
        signal.signal(LAUNCHER_GONE, signal.SIG_DFL)
    return _followed_parent


def followed_launcher() -> int | None:
    """The pid of the launcher this process follows, if any."""
    return _followed_parent


def launcher_gone() -> bool:
    """Whether the launcher this process follows has exited (its pid is no longer our parent, or it
    had exited before we began to follow it)."""
    return _followed_parent is not None and (_orphaned_before_following or os.getppid() != _followed_parent)


def end_with_launcher(exit_code: int) -> None:
    """The trainer's first action under a launcher, before its imports (seconds): until the session
    follows the launcher itself (`follow_launcher` again, then its own handlers: a checkpoint once
    training runs), the launcher's exit ends this process with `exit_code` and one line. A trainer
    left alone would train a whole run for a job its scheduler already counts as ended."""
    global _starting_exit_code
    if launcher() is None:
        return
    _starting_exit_code = exit_code
    signal.signal(LAUNCHER_GONE, _gone_while_starting)  # before arming: a launcher gone while arming signals at once
    follow_launcher()
    if launcher_gone():
        _gone_while_starting(LAUNCHER_GONE, None)


_starting_exit_code = 0


def _gone_while_starting(signum: int, frame) -> None:
    if not launcher_gone():
        return  # the kernel also sends it when the launcher's thread that started us ends
    parent = os.getppid()
    name = launcher()
    hint = ""
    if _orphaned_before_following:  # or no launcher at all: the environment says otherwise
        variable = "TORCHELASTIC_RUN_ID" if name == "torchrun" else "ACCELERATE_USE_CPU"
        hint = f"; started without a launcher? unset {variable}"
    os.write(
        2,
        f"train.py: its launcher ({name}, pid {_followed_parent}) exited before training began: ending too, with "
        f"nothing written (exit {_starting_exit_code}; its parent is now pid {parent}, "
        f"`{(command_of(parent) or '?')[:60]}`){hint}\n".encode(),
    )
    os._exit(_starting_exit_code)


# ---------------------------------------------------------------------- ending with a process not our parent
POLL_S = 0.5  # where a pidfd is not available (not Linux >= 5.3): how often the process is looked at


def start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, field 22 of /proc/PID/stat), None if it is
    gone or there is no /proc: with its pid, it names one process even after the pid is reused."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class ProcessIdentity:
    """One process, told apart from a later one that reuses its pid (picklable: it travels to workers)."""

    pid: int
    started: int | None

    @classmethod
    def this(cls) -> ProcessIdentity:
        return cls(os.getpid(), start_time(os.getpid()))

    def alive(self) -> bool:
        if self.started is not None:
            return start_time(self.pid) == self.started
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return True


def die_with(process: ProcessIdentity, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to this process as soon as `process` ends (exits, or is killed: SIGKILL included),
    from a daemon thread that waits on a pidfd (a poll every POLL_S where there is none). A process
    already gone when this is called: `sig` at once."""
    threading.Thread(target=_signal_when_gone, args=(process, sig), name="die-with", daemon=True).start()


def _signal_when_gone(process: ProcessIdentity, sig: int) -> None:
    try:
        pidfd: int | None = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # no pidfd (macOS, old kernel), or the process is gone already
        pidfd = None
    if pidfd is not None:
        if process.alive():  # checked after opening: the pidfd is of the process we meant, not a reuse
            select.select([pidfd], [], [])  # readable once it has exited
    else:
        while process.alive():
            time.sleep(POLL_S)
    os.kill(os.getpid(), sig)
