"""The shipped Slurm script (hf_pretrain/engines/slurm/1b.sbatch) run by bash with stand-ins for
`hf-pretrain` and `scontrol` on PATH: it requeues itself on 75 and 71 only, ends with the trainer's own
code, and passes the SIGTERM Slurm sends the batch script (`--signal=B:TERM`) on to the launcher. The
signal is sent once the stand-in launcher has said it waits for it: no race."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hf_pretrain.engines.tasks import SLURM
from hf_pretrain.exit_codes import EXIT_CONFIG, EXIT_FAULTY_HOST, EXIT_LOCKED, EXIT_OK, EXIT_PREEMPTED
from tests.stacks import communicate_or_diagnose

STAND_IN = """#!/bin/bash
# hf-pretrain, as the Slurm script calls it: `check` and `launch` end with the codes the test sets
echo "$*" >> "$CALLS"
case "$1" in
  check)
    # the real check's refusal of a folder an earlier check wrote (check/command.py: check_output), else its results
    out=$(echo "$*" | sed -n 's/.*--output \\([^ ]*\\).*/\\1/p')
    if [ -e "$out" ]; then echo "--output $out holds an earlier check's results" >> "$CALLS"; exit 78; fi
    mkdir -p "$out"
    if [ -n "${CHECK_WAITS_FOR_TERM:-}" ]; then
      trap 'echo "check got SIGTERM" >> "$CALLS"; exit 75' TERM
      touch "$WAITING"
      while true; do sleep 0.05; done
    fi
    exit "${CHECK_CODE:-0}" ;;
  launch)
    if [ -n "${WAIT_FOR_TERM:-}" ]; then
      trap 'echo "launch got SIGTERM" >> "$CALLS"; exit 75' TERM
      touch "$WAITING"
      while true; do sleep 0.05; done
    fi
    exit "${LAUNCH_CODE:-0}" ;;
esac
"""


def run_script(
    tmp_path: Path, wait_for_term: bool = False, check_waits: bool = False, restarts: int | None = None, **codes: int
) -> tuple[subprocess.Popen, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("hf-pretrain", STAND_IN), ("scontrol", '#!/bin/bash\necho "scontrol $*" >> "$CALLS"\n')):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CALLS=str(calls), WAITING=str(tmp_path / "waiting"))
    env |= {"SLURM_JOB_ID": "4242", "RUN_URL": "s3://b/runs/1b", "DATA_URL": "s3://b/data/1b"}
    env |= {name.upper(): str(code) for name, code in codes.items()}
    if wait_for_term:
        env["WAIT_FOR_TERM"] = "1"
    if check_waits:
        env["CHECK_WAITS_FOR_TERM"] = "1"
    if restarts is not None:  # Slurm sets it on a requeued job's start
        env["SLURM_RESTART_COUNT"] = str(restarts)
    process = subprocess.Popen(["bash", str(SLURM[0])], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    return process, calls


@pytest.mark.parametrize(
    "check_code, launch_code, requeued",
    [
        (0, EXIT_PREEMPTED, True),
        (EXIT_FAULTY_HOST, 0, True),  # the check's verdict: the launch never starts
        (0, EXIT_OK, False),
        (0, EXIT_LOCKED, False),
        (0, EXIT_CONFIG, False),
        (EXIT_CONFIG, 0, False),
    ],
)
def test_the_job_requeues_on_75_and_71_only_and_ends_with_the_code(tmp_path, check_code, launch_code, requeued):
    process, calls = run_script(tmp_path, check_code=check_code, launch_code=launch_code)
    communicate_or_diagnose(process, 60)
    expected = check_code or launch_code
    said = calls.read_text()
    assert process.returncode == expected, said
    assert ("scontrol requeue 4242" in said) == requeued, said
    assert ("launch --config_file accelerate_configs/single_gpu.yaml" in said) == (check_code == 0), said


def test_the_batch_scripts_sigterm_reaches_the_launcher_and_the_job_requeues(tmp_path):
    process, calls = run_script(tmp_path, wait_for_term=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "waiting").exists():  # the stand-in launcher waits, its trap set: a certain point
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)  # what `--signal=B:TERM@120` sends the batch script
    out = communicate_or_diagnose(process, 60)[0]
    said = calls.read_text()
    assert process.returncode == EXIT_PREEMPTED and "launch got SIGTERM" in said, (said, out)
    assert "scontrol requeue 4242" in said and "exit 75" in out


def wait_for(path: Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():  # the stand-in waits, its trap set: a certain point
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)


def test_a_requeued_job_checks_again_and_trains(tmp_path):
    """Issue 57: the requeue (same id, same folder) ran the check into the first start's results: 78, never
    resumed. Each start's check has a folder of its own."""
    first, calls = run_script(tmp_path, launch_code=EXIT_PREEMPTED)
    communicate_or_diagnose(first, 60)
    assert first.returncode == EXIT_PREEMPTED and "scontrol requeue 4242" in calls.read_text()
    again, calls = run_script(tmp_path, restarts=1, launch_code=EXIT_OK)  # the requeued job, in the same folder
    communicate_or_diagnose(again, 60)
    said = calls.read_text()
    assert again.returncode == EXIT_OK and "earlier check" not in said, said
    assert said.count("launch --config_file") == 2, said
    assert (tmp_path / "pod_check_4242_0").is_dir() and (tmp_path / "pod_check_4242_1").is_dir()


def test_a_sigterm_during_the_check_ends_the_check_and_the_job_requeues_with_75(tmp_path):
    """Issue 57: the trap was set after the check, so the SIGTERM killed the batch shell (143) and left the
    check running alone. The signal is sent once the stand-in check has said it waits for it: no race."""
    process, calls = run_script(tmp_path, check_waits=True)
    wait_for(tmp_path / "waiting", process)
    process.send_signal(signal.SIGTERM)
    out = communicate_or_diagnose(process, 60)[0]
    said = calls.read_text()
    assert process.returncode == EXIT_PREEMPTED and "check got SIGTERM" in said, (said, out)
    assert "launch --config_file" not in said and "scontrol requeue 4242" in said and "exit 75" in out
