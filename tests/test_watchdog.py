"""Issue 21, the watchdog: a process that stops answering ends the run, promptly, with the stacks of
every process that still can, status.json `hung` naming the one that did not answer, exit code 69,
and the last checkpoint intact; a SIGTERM while a process hangs ends the others instead of leaving
them waiting for a save that cannot happen. Every launch here has a timeout that fails the test."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hf_pretrain.checkpoints.manifest import verify_checkpoint
from hf_pretrain.exit_codes import EXIT_HUNG, EXIT_PREEMPTED
from hf_pretrain.training.watchdog import COLLECTIVE_MARGIN_S, process_group_kwargs, stop_grace_s
from tests.helpers import OUTSIDE_CHECKOUT, launch_command, offline_env
from tests.stacks import communicate_or_diagnose
from tests.test_reliability_runs import arguments, kill_all, logged_step, processes_naming, start, status, wait_until
from tests.test_survival import free_port, start_process

HANG_TIMEOUT_S = 6  # a CPU step of the short run takes well under a second, a save about one: room for a busy machine


# ---------------------------------------------------------------------- the watchdog on its own
WATCHED = """
import json, re, sys, time
from pathlib import Path
from types import SimpleNamespace
from hf_pretrain.run_folder.run_dir import RunDir
from hf_pretrain.training import watchdog
from hf_pretrain.training.session import Session

run, timeout, scene = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
one_process = SimpleNamespace(process_index=0, num_processes=1, is_main_process=True)

def waiting_for_a_collective(w):
    while not (w.folder / "process_0.json").exists():  # the report is written: now a peer "closes" the line
        time.sleep(0.01)
    raise RuntimeError("Connection closed by peer")

def frozen_with_the_interpreter_lock():
    re.match(r"(a+)+$", "a" * 40 + "b")  # minutes in C without releasing the lock

with Session(run) as session, watchdog.Watchdog(timeout, one_process, RunDir(run)) as w:
    for step in (1, 2):
        w.beat(step)
    if scene == "hung":
        waiting_for_a_collective(w)
    elif scene == "frozen":
        watchdog.BACKSTOP_S = 1.0
        w.beat(3)  # re-arms faulthandler's timer with the shorter backstop
        frozen_with_the_interpreter_lock()
    elif scene == "slow-parts":  # a save and an evaluation, each nearly a timeout long, between two steps
        time.sleep(0.6 * timeout)
        with w.paused("a checkpoint save"):
            time.sleep(0.6 * timeout)
        with w.paused("an evaluation"):
            time.sleep(0.6 * timeout)
        time.sleep(0.6 * timeout)
        w.beat(3)
    w.stop()
    session.ended(0, "done", finished=True)
print("finished")
"""


def watched(run_dir: Path, scene: str, timeout: float = 1.0) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", WATCHED, str(run_dir), str(timeout), scene],
        cwd=OUTSIDE_CHECKOUT,
        env=offline_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result, time.monotonic() - started


def test_no_progress_ends_the_process_with_its_stacks_and_status_hung(tmp_path):
    result, _ = watched(tmp_path / "run", "hung")
    assert result.returncode == EXIT_HUNG, result.stderr[-3000:]
    assert "finished" not in result.stdout
    ended = json.loads((tmp_path / "run" / "status.json").read_text())
    # the error the training thread raised after the watchdog fired did not turn the ending into `crashed`
    assert (ended["state"], ended["exit_code"], ended["rerun"]) == ("hung", EXIT_HUNG, True)
    assert ended["hung_step"] == 2 and ended["not_answering"] == [] and ended["pid"] is not None
    assert "hung after step 2: no progress for 1s (hang_timeout_s)" in ended["reason"] and "hangs/" in ended["next"]
    (folder,) = (tmp_path / "run" / "hangs").iterdir()
    assert ended["stacks"] == str(folder)
    stacks = (folder / "process_0_stacks.txt").read_text()
    assert stacks.startswith("process 0 (pid") and "in step 3:" in stacks
    assert "waiting_for_a_collective" in stacks  # the training thread, caught where it waited
    report = json.loads((folder / "process_0.json").read_text())
    assert (report["step"], report["doing"], report["signal"]) == (2, "step 3", None)


def test_saves_and_evaluations_get_a_timeout_of_their_own(tmp_path):
    result, elapsed = watched(tmp_path / "run", "slow-parts", timeout=2.0)
    assert result.returncode == 0 and "finished" in result.stdout, result.stderr[-3000:]
    assert elapsed > 4.8  # 2.4 timeouts passed between two steps, none of them without progress
    assert not (tmp_path / "run" / "hangs").exists()


def test_a_process_frozen_with_the_interpreter_lock_is_ended_by_faulthandler(tmp_path):
    result, elapsed = watched(tmp_path / "run", "frozen")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Timeout (0:00:02)!" in result.stderr and "frozen_with_the_interpreter_lock" in result.stderr
    assert elapsed < 60


def test_the_collective_timeout_follows_hang_timeout_s_and_the_launchers_patience_the_stop_grace(monkeypatch):
    assert process_group_kwargs(600)["timeout"].total_seconds() == 600 + COLLECTIVE_MARGIN_S
    assert process_group_kwargs(0) == {}  # the watchdog off: Accelerate's defaults
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    assert stop_grace_s() == 20  # torchrun's 30 s, less the reports' time
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "15")
    assert stop_grace_s() == 5


# ---------------------------------------------------------------------- a two-process run
GROUP_TIMEOUT = """
import sys, torch
from torch.distributed import distributed_c10d
from hf_pretrain.config import parse_recipe_args
from hf_pretrain.store.location import Where
from hf_pretrain.training.loop import setup

recipe = parse_recipe_args(sys.argv[1:], prog="group_timeout", description="")[0]
run = setup(recipe, Where.of(recipe))
backend = distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
print(f"process {run.accelerator.process_index}: collectives time out after {backend.options._timeout.total_seconds():g}s")
"""


@pytest.mark.slow
def test_the_process_group_of_a_run_times_out_just_after_its_watchdog(smoke_data, tmp_path):
    script = tmp_path / "group_timeout.py"
    script.write_text(GROUP_TIMEOUT)
    command = launch_command("--main_process_port", str(free_port()), processes=2, script=script)
    command += arguments(smoke_data, tmp_path / "run", hang_timeout_s=7)
    result = subprocess.run(
        command, cwd=OUTSIDE_CHECKOUT, env=offline_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    for process in (0, 1):
        assert f"process {process}: collectives time out after {7 + COLLECTIVE_MARGIN_S:g}s" in result.stdout


def stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.slow
def test_a_frozen_process_ends_a_two_process_run_promptly_with_exit_69(smoke_data, tmp_path):
    """Process 1 freezes (SIGSTOP) at step 6: process 0, waiting for it at the first collective of
    step 6, writes its stacks, names process 1 in status.json and exits 69 within hang_timeout_s and
    the reports' wait; the checkpoint of step 4 is intact."""
    run_dir, port = tmp_path / "run", free_port()
    processes = [
        start_process(smoke_data, run_dir, p, port, "hang@1:6", hang_timeout_s=HANG_TIMEOUT_S, eval_interval=100)
        for p in (0, 1)
    ]
    try:
        wait_until(lambda: stopped(processes[1].pid) or processes[0].poll() is not None, 180, "process 1 froze")
        frozen_at = time.monotonic()
        output = communicate_or_diagnose(processes[0], 120)[0]
        took = time.monotonic() - frozen_at
        assert processes[0].returncode == EXIT_HUNG, output[-3000:]
        assert stopped(processes[1].pid)  # still frozen: the watchdog of process 0 ended the run on its own
    finally:
        for p in processes:
            p.kill()
            communicate_or_diagnose(p, 30)
    assert took < HANG_TIMEOUT_S + 5 + 10  # the timeout, the reports' wait, and room for a busy machine
    ended = status(run_dir)
    assert (ended["state"], ended["exit_code"], ended["rerun"]) == ("hung", EXIT_HUNG, True)
    assert (ended["hung_step"], ended["not_answering"]) == (5, [1])
    assert f"process 1 (pid {processes[1].pid} on" in ended["reason"] and "did not answer" in ended["reason"]
    assert "process 0 in step 6" in ended["reason"] and ended["reason"] in output
    folder = Path(ended["stacks"])
    assert sorted(p.name for p in folder.iterdir()) == ["process_0.json", "process_0_stacks.txt"]
    assert "hf_pretrain/training/step.py" in (folder / "process_0_stacks.txt").read_text()  # inside the step
    assert ended["checkpoint_step"] == 4 and verify_checkpoint(Path(ended["checkpoint"]))["step"] == 4


@pytest.mark.slow
def test_sigterm_to_the_launcher_while_a_process_hangs_ends_the_job_and_says_so(smoke_data, tmp_path):
    """A SIGTERM cannot reach a process blocked in a collective; the watchdog hears it, gives the run
    the launcher's patience less the reports' time (15 s here: 5 s) to save, then ends it as hung."""
    run_dir = tmp_path / "run"
    command = launch_command("--main_process_port", str(free_port()), processes=2)
    command += arguments(smoke_data, run_dir, hang_timeout_s=300, eval_interval=100)
    launcher = start(command, env={"HF_PRETRAIN_FAULTS": "hang@1:6", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "15"})
    try:
        # process 1 frozen at the start of step 6, process 0 waiting for it: seen, not slept for (issue 49)
        frozen = lambda: any(stopped(pid) for pid in processes_naming(run_dir))  # noqa: E731
        wait_until(lambda: frozen() or launcher.poll() is not None, 180, "process 1 never froze")
        assert launcher.poll() is None, launcher.communicate()[0][-3000:]
        launcher.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        output = communicate_or_diagnose(launcher, 120)[0]
        took = time.monotonic() - signalled
    finally:
        kill_all(launcher, run_dir)
    assert took < 15 + 10, output[-3000:]  # the launcher's patience: nobody waited for a save forever
    ended = status(run_dir)
    assert (ended["state"], ended["exit_code"]) == ("hung", EXIT_HUNG), output[-3000:]
    assert "stopped by SIGTERM after step 5" in ended["reason"] and ended["not_answering"] == [1]
    assert "no checkpoint was written on the way out" in ended["reason"]
    assert (Path(ended["stacks"]) / "process_0_stacks.txt").is_file()
    assert json.loads((Path(ended["stacks"]) / "process_0.json").read_text())["signal"] == "SIGTERM"
    assert ended["checkpoint_step"] == 4 and verify_checkpoint(Path(ended["checkpoint"]))["step"] == 4


@pytest.mark.slow
def test_sigterm_to_a_healthy_two_process_run_is_still_a_graceful_preemption(smoke_data, tmp_path):
    """The watchdog hears the signal too, but a run that saves within the launcher's patience is not hung."""
    run_dir = tmp_path / "run"
    command = launch_command("--main_process_port", str(free_port()), processes=2)
    command += arguments(smoke_data, run_dir, max_steps=2000, save_interval=1000, hang_timeout_s=HANG_TIMEOUT_S)
    launcher = start(command)
    try:
        wait_until(lambda: logged_step(run_dir) >= 3 or launcher.poll() is not None, 180, "no step 3")
        assert launcher.poll() is None, launcher.communicate()[0][-3000:]
        launcher.send_signal(signal.SIGTERM)
        output = communicate_or_diagnose(launcher, 120)[0]
    finally:
        kill_all(launcher, run_dir)
    ended = status(run_dir)
    assert (ended["state"], ended["exit_code"]) == ("preempted", EXIT_PREEMPTED), output[-3000:]
    assert ended["checkpoint_step"] >= 3 and verify_checkpoint(Path(ended["checkpoint"]))["step"] >= 3
    assert not (run_dir / "hangs").exists()
