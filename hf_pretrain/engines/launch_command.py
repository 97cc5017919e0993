"""`hf-pretrain launch [accelerate launch arguments]`: the training launch for a scheduler.

`accelerate launch ... hf_pretrain/train.py --recipe 1b` as typed, but the command ends with the
trainer's own exit code (exit_codes.py: 0 done, 75 rerun, 73 another machine holds the run, 78 refused:
never rerun) where accelerate says 1, and a one-line refusal is the whole output, without the
launcher's traceback. One process or many (torchrun's agent) alike.

How: the launcher runs in a child process (accelerate_quietly.py: accelerate's own launch, its errors
caught); every trainer process leaves its pid and its code in a folder this command names
(exit_file.py). This process is the job's subreaper (Linux): a trainer still saving after its
launcher exited (on SIGTERM accelerate exits at once; the trainer checkpoints and ends 75) becomes its
child, and this command returns only when every trainer of the job has ended, so the scheduler's
next start never meets a trainer of this one. SIGTERM, SIGINT and SIGHUP sent here go to the launcher,
which passes them on as it does when started by hand (accelerate's exits, and the trainer follows it with
a checkpoint; torchrun's agent forwards them); the launcher runs in a process group of its own, so a
signal to this command's group reaches the trainers by that one path.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from hf_pretrain.engines.exit_file import ENV_VAR, codes_left, pids_left
from hf_pretrain.exit_codes import EXIT_CONFIG, EXIT_OK, EXIT_USAGE

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
USAGE = (
    "usage: hf-pretrain launch [accelerate launch flags] hf_pretrain/train.py --recipe NAME [--key value ...]\n"
    "  `accelerate launch` that exits with the trainer's own code (0 done, 75 rerun, 73 another machine\n"
    "  holds the run, 78 refused: never rerun), for schedulers (docs/engines.md)"
)


def become_subreaper() -> bool:
    """Orphaned descendants of this process become its children (Linux); False where that cannot be."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_the_trainers(folder: Path) -> dict[int, int]:
    """Wait until every trainer that left its pid has ended (as subreaper, those the launcher left are
    ours to reap): pid -> exit status of each process reaped. Any other process of the job still alive
    then (none should be) is not waited for: it belongs to init once this command exits."""
    statuses: dict[int, int] = {}
    while any(alive(pid) for pid in pids_left(folder) if pid not in statuses):
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # alive, yet not ours: a trainer whose launcher still holds it
            break
        statuses[pid] = os.waitstatus_to_exitcode(status)
    return statuses


def job_exit_code(folder: Path, launcher_code: int, reaped: dict[int, int]) -> int:
    """The job's code: the first non-zero code a trainer left (the cause: a launcher ends the others
    after it); else a trainer that left none but was reaped here (it ended before it could write);
    else the launcher's own code, or 0 when every trainer that started said 0."""
    codes = codes_left(folder)
    failed = [code for _, _, code in codes if code != EXIT_OK]
    if failed:
        return failed[0]
    ranks_with_codes = {rank for _, rank, _ in codes}
    for pid, rank in sorted(pids_left(folder).items(), key=lambda item: item[1]):
        if rank not in ranks_with_codes and reaped.get(pid, 0) != 0:
            status = reaped[pid]
            return 128 - status if status < 0 else status
    if codes and len(ranks_with_codes) == len(pids_left(folder)):
        return EXIT_OK
    return launcher_code


def missing_config(argv: list[str]) -> str | None:
    """The launch config named by `--config_file` (or `--config-file`) when it is no file: accelerate would
    answer with a traceback."""
    for i, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        if name in ("--config_file", "--config-file"):
            value = value or (argv[i + 1] if i + 1 < len(argv) else "")
            return None if Path(value).is_file() else value
        if arg.endswith(".py") or arg in ("-m", "--module"):  # the training script: what follows is its own
            return None
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return EXIT_OK if argv else EXIT_USAGE
    if (config := missing_config(argv)) is not None:
        print(
            f"hf-pretrain launch: no launch config `{config}`; name one of accelerate_configs/ "
            "(`--config_file accelerate_configs/single_gpu.yaml`)",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    subreaper = become_subreaper()
    with tempfile.TemporaryDirectory(prefix="hf_pretrain_launch_") as folder:
        command = [sys.executable, "-m", "hf_pretrain.engines.accelerate_quietly", *argv]
        # its own process group: a signal to this job's group (a terminal's Ctrl-C, a shutdown of the run
        # block) reaches the trainers once, through the launcher, never twice (a second one exits at once)
        launcher = subprocess.Popen(command, env={**os.environ, ENV_VAR: folder}, process_group=0)

        def forward(signum: int, frame) -> None:
            if launcher.poll() is None:
                launcher.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
        try:
            launcher_code = launcher.wait()
            launcher_code = 128 - launcher_code if launcher_code < 0 else launcher_code
            reaped = reap_the_trainers(Path(folder)) if subreaper else {}
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return job_exit_code(Path(folder), launcher_code, reaped)
