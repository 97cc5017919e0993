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
from hf_pretrain.exit_codes import EXIT_CONFIG, EXIT_OK, EXIT_PREEMPTED, EXIT_USAGE

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


def config_file(argv: list[str]) -> Path | None:
    """The launch config `--config_file` names, when it is a file (`missing_config` says when it is not)."""
    for i, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        if name in ("--config_file", "--config-file"):
            value = value or (argv[i + 1] if i + 1 < len(argv) else "")
            return Path(value) if Path(value).is_file() else None
        if arg.endswith(".py") or arg in ("-m", "--module"):
            return None
    return None


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


def launcher_flags(argv: list[str]) -> dict[str, str]:
    """The launcher's own `--flag value` / `--flag=value` pairs (snake case), those before the training script."""
    flags: dict[str, str] = {}
    for i, arg in enumerate(argv):
        if arg.endswith(".py") or arg in ("-m", "--module"):  # the training script: what follows is its own
            break
        if arg.startswith("--"):
            name, has_value, value = arg.partition("=")
            if not has_value and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value = argv[i + 1]
            flags[name[2:].replace("-", "_")] = value
    return flags


def bad_launch_input(argv: list[str], config: Path | None) -> str | None:
    """What accelerate would answer with a traceback and exit 1 (issue 57), said in one line: a launch config
    that is no YAML mapping, and process counts that leave a machine no process (a multi-node task's
    `$((SKYPILOT_NUM_NODES*SKYPILOT_NUM_GPUS_PER_NODE))` with one of them empty is 0: torch's AssertionError).
    None when neither is wrong; the values accelerate checks itself are caught in its process
    (accelerate_quietly.py)."""
    import yaml

    settings: dict = {}
    if config is not None:
        try:
            settings = yaml.safe_load(config.read_text()) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}: {getattr(exc, 'problem', None) or 'unreadable'})" if mark else ""
            return f"the launch config {config} is not YAML{where}; fix it, or name one of accelerate_configs/"
        except (OSError, UnicodeDecodeError) as exc:
            return f"the launch config {config} cannot be read ({exc}); name one of accelerate_configs/"
        if not isinstance(settings, dict):
            return f"the launch config {config} is no `key: value` mapping; name one of accelerate_configs/"
    flags = launcher_flags(argv)
    counts = {}
    for key in ("num_processes", "num_machines"):
        value = flags.get(key, settings.get(key))
        if value is None:
            continue
        try:
            counts[key] = int(str(value).strip())
        except ValueError:
            counts[key] = None
        if counts[key] is None or counts[key] < 1:
            source = f"--{key} {value!r}" if key in flags else f"{key}: {value!r} in {config}"
            return (
                f"{source}: a process count of at least 1 is needed (--num_processes counts every process of "
                f"every machine); under a multi-node task, check that the variables it is computed from are set "
                f"(SKYPILOT_NUM_NODES, SKYPILOT_NUM_GPUS_PER_NODE)"
            )
    processes, machines = counts.get("num_processes"), counts.get("num_machines")
    if processes and machines and processes % machines:
        return (
            f"--num_processes {processes} does not split over --num_machines {machines}: give the total across "
            f"machines, a multiple of num_machines (each machine runs num_processes / num_machines)"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    # A SIGTERM from here on is a preemption, whenever it comes: before the launcher starts, or while it starts
    # and has not yet set its own handlers (it dies of it, 143), the job ends 75, nothing trained, nothing lost
    # (it was 143, which no engine's task reruns on). Set first: the checks below take no time, the launch does.
    received: list[int] = []
    early = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in FORWARDED}
    try:
        return _main(argv, received)
    finally:
        for sig, handler in early.items():
            signal.signal(sig, handler)


def _main(argv: list[str] | None, received: list[int]) -> int:
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
    if (problem := bad_launch_input(argv, config_file(argv))) is not None:
        print(f"hf-pretrain launch: error: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    subreaper = become_subreaper()
    if received:  # stopped before anything started
        return _stopped_early(received[0])
    with tempfile.TemporaryDirectory(prefix="hf_pretrain_launch_") as folder:
        command = [sys.executable, "-m", "hf_pretrain.engines.accelerate_quietly", *argv]
        # its own process group: a signal to this job's group (a terminal's Ctrl-C, a shutdown of the run
        # block) reaches the trainers once, through the launcher, never twice (a second one exits at once)
        launcher = subprocess.Popen(command, env={**os.environ, ENV_VAR: folder}, process_group=0)

        def forward(signum: int, frame) -> None:
            received.append(signum)
            if launcher.poll() is None:
                launcher.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
        if received:  # it came while the launcher was being started: it gets it too
            forward(received[0], None)
        try:
            launcher_code = launcher.wait()
            launcher_code = 128 - launcher_code if launcher_code < 0 else launcher_code
            reaped = reap_the_trainers(Path(folder)) if subreaper else {}
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        code = job_exit_code(Path(folder), launcher_code, reaped)
        if received and code == 128 + received[0] and not codes_left(Path(folder)):
            return _stopped_early(received[0])  # the launcher died of it before any trainer began
        return code


def _stopped_early(signum: int) -> int:
    """A stop before any trainer began: SIGTERM and SIGHUP are a preemption (75: rerun, nothing was
    trained), SIGINT a person's (130, as a shell reports it)."""
    name = signal.Signals(signum).name
    code = 128 + signum if signum == signal.SIGINT else EXIT_PREEMPTED
    print(
        f"hf-pretrain launch: stopped by {name} before training began; nothing to lose (exit {code})", file=sys.stderr
    )
    return code
