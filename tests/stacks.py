"""Where a test's processes wait when one does not end: a run past its timeout is dumped, then ended.

A hang is diagnosed, not guessed: `py-spy dump` (the dev extra) of the run and every process under it (a
worker of torch's launcher lives in a session of its own) goes into the failure's message, so a hang on CI
says where each thread waited. Then all of them are ended, as a lost machine ends them."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil


class Hung(subprocess.TimeoutExpired):
    """A `subprocess.TimeoutExpired` whose message (what pytest prints) holds where each process waited; its
    `output` and `stderr` are what the run printed, as `subprocess.run` gives them."""

    def __init__(self, cmd, timeout: float, stacks: str, output=None, stderr=None):
        super().__init__(cmd, timeout, output=output, stderr=stderr)
        self.stacks = stacks

    def __str__(self) -> str:
        said = "".join(part for part in (self.output, self.stderr) if isinstance(part, str))
        command = " ".join(map(str, self.cmd))[:400]
        return (
            f"{command} ... did not end within {self.timeout:.0f} s; where its processes waited:\n{self.stacks}\n"
            f"--- what it printed last ---\n{said[-4000:]}"
        )


def communicate_or_diagnose(process: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """`process.communicate(timeout=timeout)`; past `timeout`, `Hung`, every process under it dumped and ended (and
    ended, undumped, on any other way out)."""
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        stacks = process_stacks(process.pid)
        lose_processes(process)
        out, err = process.communicate()
        raise Hung(expired.cmd, timeout, stacks, output=out, stderr=err) from None
    except BaseException:  # an interrupt, say: as `subprocess.run`, nothing left running
        lose_processes(process)
        raise


def process_stacks(pid: int) -> str:
    """`py-spy dump --native` of `pid` and every process under it, else (no py-spy) their command lines alone."""
    members = process_tree(pid)
    if not members:
        return f"(process {pid} is gone)"
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    said = []
    for member in members:
        try:
            said.append(f"--- process {member.pid}: {' '.join(member.cmdline())[:300]}")
        except psutil.Error:
            continue
        if spy:
            # --native: the frames below Python too (a C++ destructor's join waiting on the interpreter lock, say)
            dumped = subprocess.run(
                [spy, "dump", "--native", "--pid", str(member.pid)], capture_output=True, text=True, timeout=60
            )
            said.append(dumped.stdout + dumped.stderr)
    return "\n".join(said)


def lose_processes(process) -> None:
    """End `process` and every process under it at once, as a lost machine ends them. A process group is
    not enough: torch's elastic agent (under `accelerate launch` of several processes) starts each worker in
    a session of its own, and a worker whose launcher died stops gracefully, with a checkpoint. All are
    frozen first, so none acts on another's death before its own."""
    everyone = process_tree(process.pid)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for member in everyone:
            try:
                member.send_signal(sig)
            except psutil.NoSuchProcess:
                pass


def process_tree(pid: int) -> list[psutil.Process]:
    """`pid` and every process under it, whatever session each is in; none when `pid` is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
