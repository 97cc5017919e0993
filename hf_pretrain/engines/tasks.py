"""The shipped task files (skypilot/, dstack/, slurm/ beside this module) as data: where they are, the
lines their scripts run, and the recovery rules a SkyPilot task states. Read with plain YAML, so the
tests (and SkyPilot's own parser in its own environment, `make sky_test`) see the same files a user
launches. Imports nothing of the package."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

HERE = Path(__file__).parent
SKYPILOT = sorted((HERE / "skypilot").glob("*.yaml"))
DSTACK = sorted((HERE / "dstack").glob("*.yml"))
SLURM = sorted((HERE / "slurm").glob("*.sbatch"))


def read_task(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def script_lines(script: str) -> list[str]:
    """A shell script's command lines: continuations joined, comments and blank lines dropped."""
    joined = script.replace("\\\n", " ")
    lines = [line.split(" # ", 1)[0].strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def command_words(script: str, command: str, env: dict[str, str] | None = None) -> list[str]:
    """The words of the script's first line that runs `command` (e.g. "hf-pretrain launch", or `exec` it),
    `$NAME` and `"$NAME"` replaced from `env` where it has a value for NAME (None: given at launch)."""
    # `exec`: the same command, in place; `run_child` (the Slurm script's): the same command, in the background
    lines = [line.removeprefix("exec ").removeprefix("run_child ") for line in script_lines(script)]
    line = next(line for line in lines if line.startswith(command))
    for name, value in (env or {}).items():
        if value is None:
            continue
        line = line.replace(f'"${name}"', shlex.quote(str(value))).replace(f"${name}", str(value))
    return shlex.split(line)


def recover_on_exit_codes(task: dict) -> set[int]:
    """The exit codes a SkyPilot task always relaunches on (`resources.job_recovery.recover_on_exit_codes`)."""
    codes = (task.get("resources", {}).get("job_recovery") or {}).get("recover_on_exit_codes", [])
    return {codes} if isinstance(codes, int) else set(codes)


def max_restarts_on_errors(task: dict) -> int:
    """How many times a SkyPilot task relaunches on any other non-zero code (SkyPilot's default: 0)."""
    return int((task.get("resources", {}).get("job_recovery") or {}).get("max_restarts_on_errors", 0))
