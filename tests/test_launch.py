"""The exit-code contract survives the launcher (issue 48): `hf-pretrain launch` ends with the trainer's
own code (0, 75 rerun, 73, 78 refused) where `accelerate launch` says 1, one process or two, and a
refusal is one line with no launcher traceback. The end-to-end cases are certain: a refusal ends before
training, and the SIGTERM is sent while the trainer is held before a step (faults.py `hold`) and the
hold released only once the trainer said it will checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hf_pretrain.engines.accelerate_quietly import code_of_launcher_error
from hf_pretrain.engines.launch_command import job_exit_code, missing_config
from hf_pretrain.exit_codes import EXIT_CONFIG, EXIT_FAILED, EXIT_LOCKED, EXIT_OK, EXIT_PREEMPTED
from tests.helpers import ROOT, TRAIN_SCRIPT, free_port, offline_env, short_run
from tests.stacks import communicate_or_diagnose


def leave(folder: Path, rank: int, pid: int, code: int | None, when_ns: int = 0) -> None:
    (folder / f"pid.{rank}").write_text(str(pid))
    if code is not None:
        path = folder / f"code.{rank}"
        path.write_text(str(code))
        os.utime(path, ns=(when_ns, when_ns))


def test_the_job_code_is_the_first_failure_a_trainer_left(tmp_path):
    leave(tmp_path, 0, 100, EXIT_PREEMPTED, when_ns=2_000)  # rank 0 signalled by the launcher after rank 1 refused
    leave(tmp_path, 1, 101, EXIT_CONFIG, when_ns=1_000)
    assert job_exit_code(tmp_path, launcher_code=1, reaped={}) == EXIT_CONFIG


def test_every_trainer_done_is_zero_whatever_the_launcher_says(tmp_path):
    leave(tmp_path, 0, 100, EXIT_OK)
    leave(tmp_path, 1, 101, EXIT_OK)
    assert job_exit_code(tmp_path, launcher_code=143, reaped={}) == EXIT_OK


def test_a_trainer_that_left_no_code_is_read_from_its_reaped_status(tmp_path):
    leave(tmp_path, 0, 100, None)  # ended by os._exit at start-up, orphaned, reaped by the wrapper
    assert job_exit_code(tmp_path, launcher_code=143, reaped={100: EXIT_PREEMPTED}) == EXIT_PREEMPTED
    assert job_exit_code(tmp_path, launcher_code=143, reaped={100: -signal.SIGKILL}) == 128 + signal.SIGKILL


def test_nothing_left_is_the_launchers_code(tmp_path):
    assert job_exit_code(tmp_path, launcher_code=2, reaped={}) == 2
    leave(tmp_path, 0, 100, EXIT_OK)
    leave(tmp_path, 1, 101, None)  # started, never said: reaped by the launcher, whose code stands
    assert job_exit_code(tmp_path, launcher_code=EXIT_LOCKED, reaped={}) == EXIT_LOCKED


class ChildFailedError(Exception):  # torch.distributed.elastic's, by name: what the quiet launcher reads
    def __init__(self, failures):
        self.failures = failures


class SignalException(Exception):
    def __init__(self, sigval):
        self.sigval = sigval


class Failure:
    def __init__(self, local_rank, exitcode, timestamp):
        self.local_rank, self.exitcode, self.timestamp = local_rank, exitcode, timestamp


def test_the_launchers_errors_carry_their_code():
    assert code_of_launcher_error(subprocess.CalledProcessError(EXIT_CONFIG, "x")) == EXIT_CONFIG
    assert code_of_launcher_error(subprocess.CalledProcessError(-signal.SIGTERM, "x")) == 128 + signal.SIGTERM
    assert code_of_launcher_error(KeyboardInterrupt()) == 128 + signal.SIGINT
    failures = {1: Failure(1, EXIT_PREEMPTED, 20), 0: Failure(0, EXIT_CONFIG, 10)}
    assert code_of_launcher_error(ChildFailedError(failures)) == EXIT_CONFIG
    assert code_of_launcher_error(SignalException(signal.SIGTERM)) == 128 + signal.SIGTERM
    assert code_of_launcher_error(ValueError("a bug")) is None  # raised: its traceback is the story


def test_a_missing_launch_config_is_found_before_the_script_only():
    assert missing_config(["--config_file", "/nothing.yaml", "train.py"]) == "/nothing.yaml"
    assert missing_config(["--config-file=/nothing.yaml", "train.py"]) == "/nothing.yaml"
    config = str(ROOT / "accelerate_configs" / "cpu.yaml")
    assert missing_config(["--config_file", config, "--num_processes", "1", "train.py"]) is None
    assert missing_config(["train.py", "--config_file", "/nothing.yaml"]) is None  # the script's own flag


def launch(*accelerate_flags: str, config: str = "cpu.yaml", **keys) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "hf_pretrain.cli",
        "launch",
        "--config_file",
        str(ROOT / "accelerate_configs" / config),
    ]
    if config == "cpu_2proc.yaml" and "--main_process_port" not in accelerate_flags:
        accelerate_flags += ("--main_process_port", str(free_port()))  # not the config's, shared by other workers
    command += [*accelerate_flags, str(TRAIN_SCRIPT), "--recipe", "smoke"]
    for key, value in keys.items():
        command += [f"--{key}", str(value)]
    return command


@pytest.mark.slow
@pytest.mark.parametrize("config", ["cpu.yaml", "cpu_2proc.yaml"])
def test_a_refusal_through_the_launcher_is_78_in_one_line(config, tmp_path):
    result = subprocess.run(
        launch(config=config, micro_batch_size=-1, output_dir=tmp_path / "run"),
        env=offline_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = result.stderr
    ours = [line for line in err.splitlines() if line.startswith(("hf-pretrain", "train.py"))]
    assert result.returncode == EXIT_CONFIG, err
    assert "Traceback" not in err and "CalledProcessError" not in err and "ChildFailedError" not in err, err
    assert len(set(ours)) == 1, err  # each process says the same one line
    # the plain launcher, as the issue found it: 1, and a traceback
    if config == "cpu.yaml":
        plain = [sys.executable, "-m", "accelerate.commands.launch", *launch(config=config)[4:]]
        plain += ["--micro_batch_size", "-1", "--output_dir", str(tmp_path / "run")]
        result = subprocess.run(plain, env=offline_env(), capture_output=True, text=True, timeout=300)
        assert result.returncode == EXIT_FAILED and "CalledProcessError" in result.stderr, result.stderr


def read_until(process: subprocess.Popen, text: str, seen: list[str]) -> None:
    """Lines of the launch's output until one holds `text` (the output ending first fails the test)."""
    for line in process.stdout:
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"the launch ended before `{text}`:\n{''.join(seen)[-3000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("config", ["cpu.yaml", "cpu_2proc.yaml"])
def test_a_sigterm_to_the_launcher_ends_the_job_75_with_a_checkpoint(config, smoke_data, tmp_path):
    """One process: accelerate exits at once and the trainer follows it with a checkpoint, reaped by the
    wrapper; two: torchrun's agent passes the SIGTERM on (and waits 30 s before its SIGKILL)."""
    release, run = tmp_path / "release", tmp_path / "run"
    release.mkdir()
    env = {**offline_env(), "HF_PRETRAIN_FAULTS": "hold:3", "HF_PRETRAIN_RELEASE": str(release)}
    env["PYTHONUNBUFFERED"] = "1"
    command = launch(config=config, **short_run(smoke_data, run))
    launcher = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    try:
        read_until(launcher, "holding before step 3", seen)
        launcher.send_signal(signal.SIGTERM)  # what a scheduler sends the job's top process
        read_until(launcher, "writing a checkpoint", seen)  # the trainer recorded it: now let it go on
        (release / "3").touch()
        out = communicate_or_diagnose(launcher, 300)[0]
    finally:
        (release / "3").touch()
        if launcher.poll() is None:
            launcher.kill()
    log = "".join(seen) + out
    assert launcher.returncode == EXIT_PREEMPTED, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert (run / "checkpoints" / "step_00000003").is_dir(), log[-3000:]


DRIVER = """
import json, subprocess, sys
from pathlib import Path
from hf_pretrain.engines.launch_command import become_subreaper, job_exit_code, reap_the_trainers
folder = Path(sys.argv[1])
assert become_subreaper()
launcher = "import os, sys, time\\npid = os.fork()\\nif pid:\\n    open(sys.argv[1], 'w').write(str(pid))\\n    sys.exit(0)\\ntime.sleep(0.5)\\nos._exit(75)"
assert subprocess.run([sys.executable, "-c", launcher, str(folder / "pid.0")]).returncode == 0
reaped = reap_the_trainers(folder)
print(json.dumps({"reaped": reaped, "code": job_exit_code(folder, 143, reaped)}))
"""


def test_the_wrapper_waits_for_an_orphaned_trainer_and_reads_its_status(tmp_path):
    """A trainer its launcher left (accelerate exits at once on SIGTERM) becomes the wrapper's child (the
    subreaper), which waits for it and reads its status; in a process of its own, as the wrapper is."""
    import json

    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path)], env=offline_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    orphan = int((tmp_path / "pid.0").read_text())
    assert result == {"reaped": {str(orphan): EXIT_PREEMPTED}, "code": EXIT_PREEMPTED}


def test_a_sigterm_during_the_launchs_own_start_ends_it_75_in_one_line(monkeypatch, capsys):
    """Issue 57: a SIGTERM before the launcher set its handlers killed it (143, which no engine reruns on). Sent
    by the test's stand-ins at two certain points: before the launcher starts, and while it starts (it dies of
    the forwarded signal before any trainer began)."""
    from hf_pretrain.engines import launch_command

    argv = ["--config_file", str(ROOT / "accelerate_configs" / "cpu.yaml"), "hf_pretrain/train.py", "--recipe", "smoke"]
    monkeypatch.setattr(launch_command, "become_subreaper", lambda: os.kill(os.getpid(), signal.SIGTERM) or False)
    assert launch_command.main(argv) == EXIT_PREEMPTED
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stopped by SIGTERM before training began" in err[0] and "exit 75" in err[0], err

    started = []

    class StartingLauncher(subprocess.Popen):
        def __init__(self, command, **kwargs):  # a launcher that has not set its handlers yet: SIGTERM kills it
            super().__init__([sys.executable, "-c", "import time; time.sleep(600)"], **kwargs)
            started.append(self)
            os.kill(os.getpid(), signal.SIGTERM)  # while it starts

    monkeypatch.setattr(launch_command, "become_subreaper", lambda: False)
    monkeypatch.setattr(launch_command.subprocess, "Popen", StartingLauncher)
    assert launch_command.main(argv) == EXIT_PREEMPTED
    assert started[0].returncode == -signal.SIGTERM  # the signal reached it
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stopped by SIGTERM before training began" in err[0], err
    assert signal.getsignal(signal.SIGTERM) is not None  # handed back
