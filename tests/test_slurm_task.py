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

STAND_IN = """#!/bin/bash
# hf-pretrain, as the Slurm script calls it: `check` and `launch` end with the codes the test sets
echo "$*" >> "$CALLS"
case "$1" in
  check) exit "${CHECK_CODE:-0}" ;;
  launch)
    if [ -n "${WAIT_FOR_TERM:-}" ]; then
      trap 'echo "launch got SIGTERM" >> "$CALLS"; exit 75' TERM
      touch "$WAITING"
      while true; do sleep 0.05; done
    fi
    exit "${LAUNCH_CODE:-0}" ;;
esac
"""


def run_script(tmp_path: Path, wait_for_term: bool = False, **codes: int) -> tuple[subprocess.Popen, Path]:
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
    process.communicate(timeout=60)
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
    out = process.communicate(timeout=60)[0]
    said = calls.read_text()
    assert process.returncode == EXIT_PREEMPTED and "launch got SIGTERM" in said, (said, out)
    assert "scontrol requeue 4242" in said and "exit 75" in out
