"""Runs that survive: kills at any moment, torn checkpoints, a full disk, non-finite steps.

The harness starts training as a subprocess, kills it (SIGTERM and SIGKILL, at chosen and at
random moments, including in the middle of a checkpoint write), resumes until the run is done,
and then holds it to the uninterrupted reference run: the same loss curve and the same final
weights, bitwise.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_pretrain.checkpoints.manifest import CheckpointError, verify_checkpoint
from hf_pretrain.exit_codes import EXIT_DIVERGED, EXIT_PREEMPTED, EXIT_SAVE_FAILED
from hf_pretrain.run_folder.run_dir import read_jsonl
from tests.helpers import (
    OUTSIDE_CHECKOUT,
    launch_command,
    launch_training,
    offline_env,
    short_run,
    start_merged,
)
from tests.stacks import communicate_or_diagnose

MIN_KILLS = 10


def train_losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def last_logged_step(run_dir: Path) -> int:
    records = (
        [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
        if (run_dir / "metrics.jsonl").exists()
        else []
    )
    return records[-1]["step"] if records else 0


def complete_steps(run_dir: Path) -> list[int]:
    root = run_dir / "checkpoints"
    return sorted(int(p.name[5:]) for p in root.glob("step_*") if p.name[5:].isdigit()) if root.exists() else []


def start_training(
    data_dir: Path, run_dir: Path, faults: str = "", release: Path | None = None, **overrides
) -> subprocess.Popen:
    """The training process itself (no launcher in between), so signals reach it directly. A `hold`
    fault waits for its file in `release` (faults.py)."""
    cmd = launch_command(**short_run(data_dir, run_dir, **overrides))
    env = offline_env()
    if faults:
        env["HF_PRETRAIN_FAULTS"] = faults
    if release is not None:
        release.mkdir(parents=True, exist_ok=True)
        env["HF_PRETRAIN_RELEASE"] = str(release)
    return start_merged(cmd, OUTSIDE_CHECKOUT, env)


def wait_for_step(process: subprocess.Popen, run_dir: Path, step: int, timeout: float = 120) -> bool:
    """Wait until the run has logged `step` (True) or the process has ended (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if last_logged_step(run_dir) >= step:
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.02)
    raise AssertionError(f"no step {step} within {timeout}s")


KILL_RUN_STEPS = 30  # long enough that a dozen kills, each after a step or two, cannot finish the run


@pytest.mark.slow
def test_kills_at_any_moment_lose_nothing_but_recent_steps(smoke_data, tmp_path):
    overrides = {"max_steps": KILL_RUN_STEPS, "eval_interval": 10, "save_interval": 1, "keep_checkpoints": 3}
    reference_dir = tmp_path / "uninterrupted"
    launch_training(smoke_data, reference_dir, **overrides)
    run_dir = tmp_path / "killed"
    rng = random.Random(7)
    # chosen moments first (a torn checkpoint write, a graceful SIGTERM, a kill mid-step), then random ones
    plan = [
        "kill-during-save",
        "sigterm",
        "sigkill-after-step",
        "sigkill-random",
        "kill-during-save",
        "sigterm",
        "sigkill-random",
        "sigkill-after-step",
        "sigkill-anytime",
        "sigterm",
        "sigkill-random",
        "kill-during-save",
    ]
    kills, lost_steps, torn = 0, [], 0
    for action in plan:
        done = complete_steps(run_dir)
        resume_step = done[-1] if done else 0
        if action == "kill-during-save":
            process = start_training(smoke_data, run_dir, faults=f"kill-during-save:{resume_step + 2}", **overrides)
            output = communicate_or_diagnose(process, 300)[0]
            assert process.returncode == -signal.SIGKILL, output[-2000:]
            assert (run_dir / "checkpoints" / f"step_{resume_step + 2:08d}.tmp").exists()
            torn += 1
        else:
            # a killed run may have logged steps past its last checkpoint: wait for fresh ones
            target = max(resume_step, last_logged_step(run_dir)) + 1 + rng.randrange(2)
            # held before target + 2: the kill lands before it however fast the machine is (issue 49)
            release = tmp_path / f"release_{kills}"
            process = start_training(smoke_data, run_dir, f"hold:{target + 2}", release, **overrides)
            if action == "sigkill-anytime":
                time.sleep(rng.uniform(0.5, 5.0))  # start-up, a step, an eval or a checkpoint write
            else:
                assert wait_for_step(process, run_dir, target), process.communicate()[0][-2000:]
                if action == "sigkill-random":
                    time.sleep(rng.uniform(0.0, 0.3))  # somewhere in the next step or its checkpoint
            process.send_signal(signal.SIGTERM if action == "sigterm" else signal.SIGKILL)
            (release / str(target + 2)).touch()  # a SIGTERM'd run that reached the hold takes its step, then stops
            output = communicate_or_diagnose(process, 300)[0]
            if action == "sigterm" and process.returncode == EXIT_PREEMPTED:
                assert "SIGTERM received" in output and "Rerun the same command to resume" in output
                # a graceful stop checkpoints the step it finished: nothing lost
                assert complete_steps(run_dir)[-1] == last_logged_step(run_dir)
            else:
                # a SIGTERM that lands before the handler is installed (start-up) ends the process as usual
                assert process.returncode in (-signal.SIGKILL, -signal.SIGTERM, EXIT_PREEMPTED), output[-2000:]
        kills += 1
        survivors = complete_steps(run_dir)
        lost_steps.append(max(0, last_logged_step(run_dir) - (survivors[-1] if survivors else 0)))
        assert not (run_dir / "final").exists(), "the run finished before the kills did"

    # resume to the end; unfinished writes are skipped with the reason
    log = launch_training(smoke_data, run_dir, **overrides)
    assert kills >= MIN_KILLS
    print(f"\nsurvival: {kills} kills ({torn} during a checkpoint write), steps lost per kill {lost_steps}")
    assert train_losses(run_dir) == train_losses(reference_dir)
    final_ref = load_file(reference_dir / "final" / "model.safetensors")
    final_got = load_file(run_dir / "final" / "model.safetensors")
    assert all(torch.equal(final_ref[k], final_got[k]) for k in final_ref)
    assert not list((run_dir / "checkpoints").glob("*.tmp")), log


def copy_checkpoint_run(reference_dir: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(reference_dir / "checkpoints", run_dir / "checkpoints")
    return run_dir


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("truncate", r"optimizer.bin has \d+ bytes, the manifest says \d+"),
        ("delete", r"model.safetensors is missing"),
        ("manifest", r"manifest.json is unreadable"),
        ("flip", r"model.safetensors fails its checksum"),
        ("no-manifest", r"has no manifest.json: the save did not finish"),
    ],
)
def test_torn_checkpoint_is_refused_with_the_reason(reference_run, tmp_path, damage, reason):
    run_dir = copy_checkpoint_run(reference_run[0], tmp_path)
    newest = run_dir / "checkpoints" / "step_00000012"
    verify_checkpoint(newest)  # intact before we damage it
    if damage == "truncate":
        path = newest / "optimizer.bin"
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "delete":
        (newest / "model.safetensors").unlink()
    elif damage == "manifest":
        (newest / "manifest.json").write_text("{not json")
    elif damage == "flip":
        path = newest / "model.safetensors"
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        (newest / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=reason):
        verify_checkpoint(newest)


@pytest.mark.slow
def test_resume_auto_skips_torn_checkpoints_and_a_named_one_must_be_good(reference_run, smoke_data, tmp_path):
    reference_dir, _ = reference_run
    run_dir = copy_checkpoint_run(reference_dir, tmp_path)
    shutil.copy(reference_dir / "metrics.jsonl", run_dir / "metrics.jsonl")
    newest = run_dir / "checkpoints" / "step_00000012"
    (newest / "optimizer.bin").write_bytes(b"torn")
    log = launch_training(smoke_data, run_dir, max_steps=12)
    assert "skipping step_00000012" in log and "optimizer.bin has 4 bytes" in log
    assert "at step 8" in log
    assert train_losses(run_dir) == train_losses(reference_dir)

    (newest / "model.safetensors").unlink()
    log = launch_training(smoke_data, run_dir, check=False, resume=str(newest))
    assert "model.safetensors is missing" in log


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.slow
@pytest.mark.parametrize("damaged, keep", [("model.safetensors", 2), ("optimizer.bin", 1)])
def test_a_corrupt_checkpoint_is_set_aside_and_never_costs_a_good_one(
    reference_run, smoke_data, tmp_path, damaged, keep
):
    """Issue 38: retention counted a corrupt checkpoint among the kept ones and deleted the good one
    before it (with keep 1, the step just written), and status.json named the corrupt one."""
    reference_dir, _ = reference_run
    run_dir = copy_checkpoint_run(reference_dir, tmp_path)
    shutil.copy(reference_dir / "metrics.jsonl", run_dir / "metrics.jsonl")
    assert complete_steps(run_dir) == [8, 12]
    flip_last_byte(run_dir / "checkpoints" / "step_00000012" / damaged)

    log = launch_training(smoke_data, run_dir, keep_checkpoints=keep, stop_at_step=10)
    assert "skipping step_00000012" in log and f"{damaged} fails its checksum" in log, log[-3000:]
    assert "skipping skipping" not in log and "skipped skipping" not in log
    assert "resumed from" in log and "at step 8" in log
    assert complete_steps(run_dir) == ([8, 10] if keep == 2 else [10]), log[-3000:]
    aside = run_dir / "checkpoints" / "step_00000012.corrupt"
    assert (aside / damaged).is_file() and "fails its checksum" in (aside / "SET_ASIDE.txt").read_text()
    status = json.loads((run_dir / "status.json").read_text())
    assert status["checkpoint_step"] == 10 and status["checkpoint"].endswith("step_00000010")
    verify_checkpoint(run_dir / "checkpoints" / "step_00000010")

    log = launch_training(smoke_data, run_dir, keep_checkpoints=keep)  # and the run goes on from it
    assert "at step 10" in log and (run_dir / "final").exists(), log[-3000:]
    assert train_losses(run_dir) == train_losses(reference_dir)
    assert aside.is_dir() and json.loads((run_dir / "status.json").read_text())["checkpoint_step"] == 12


@pytest.mark.slow
def test_full_disk_during_save_keeps_the_previous_checkpoint(smoke_data, tmp_path):
    run_dir = tmp_path / "full"
    process = start_training(smoke_data, run_dir, faults="disk-full:8", save_interval=4)
    output = communicate_or_diagnose(process, 300)[0]
    assert process.returncode == EXIT_SAVE_FAILED, output[-2000:]
    assert "No space left on device" in output and "step_00000008.tmp" in output
    assert "step_00000004" in output and "is intact" in output
    assert complete_steps(run_dir) == [4]
    state = verify_checkpoint(run_dir / "checkpoints" / "step_00000004")
    assert state["step"] == 4
    assert not (run_dir / "checkpoints" / "step_00000008.tmp").exists()
    log = launch_training(smoke_data, run_dir)  # the disk has room again: resume and finish
    assert "at step 4" in log and (run_dir / "final").exists()


def start_process(data_dir: Path, run_dir: Path, process: int, port: int, faults: str, **overrides) -> subprocess.Popen:
    """Process `process` of a two-process CPU job, with the environment torchrun would give it, so
    that each process's exit code and output can be read on their own."""
    cmd = launch_command(**short_run(data_dir, run_dir, **overrides))
    env = {
        **offline_env(),
        "HF_PRETRAIN_FAULTS": faults,
        "ACCELERATE_USE_CPU": "true",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "RANK": str(process),
        "LOCAL_RANK": str(process),
    }
    return subprocess.Popen(
        cmd, cwd=OUTSIDE_CHECKOUT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("failing", [0, 1])
def test_a_save_failure_on_one_process_ends_every_process_with_exit_74(smoke_data, tmp_path, failing):
    run_dir = tmp_path / "run"
    port = free_port()
    processes = [start_process(smoke_data, run_dir, p, port, f"disk-full@{failing}:8") for p in (0, 1)]
    deadline = time.monotonic() + 300
    try:
        outputs = [communicate_or_diagnose(p, max(1.0, deadline - time.monotonic()))[0] for p in processes]
    except subprocess.TimeoutExpired as hung:  # tests/stacks.Hung: where each process waited, what it printed
        for p in processes:
            p.kill()
        pytest.fail(f"a process still ran 300 s after the disk-full fault on process {failing}: {hung}")
    assert [p.returncode for p in processes] == [EXIT_SAVE_FAILED, EXIT_SAVE_FAILED], (
        outputs[0][-2000:] + outputs[1][-2000:]
    )
    message = next(line for line in outputs[0].splitlines() if line.startswith("stopped: "))
    assert f"failed on process {failing}: No space left on device" in message and "step_00000004 is intact" in message
    assert f"[process 1] {message}" in outputs[1].splitlines()  # the same words in each process's log
    assert complete_steps(run_dir) == [4]
    assert not (run_dir / "checkpoints" / "step_00000008.tmp").exists()


@pytest.mark.slow
def test_a_save_failure_ends_a_launched_two_process_job(smoke_data, tmp_path):
    """The same through `accelerate launch`: the job ends (no process left waiting) with the reason."""
    run_dir = tmp_path / "launched"
    log = launch_training(
        smoke_data, run_dir, processes=2, check=False, timeout=300, env={"HF_PRETRAIN_FAULTS": "disk-full@0:8"}
    )
    assert "stopped: saving the step 8 checkpoint" in log and "No space left on device" in log, log[-3000:]
    assert "exitcode  : 74" in log  # torchrun's summary of the failed processes
    assert complete_steps(run_dir) == [4]


@pytest.mark.slow
def test_non_finite_steps_are_skipped_then_the_run_stops(smoke_data, tmp_path):
    run_dir = tmp_path / "nan"
    process = start_training(smoke_data, run_dir, faults="nan-loss:3,nan-loss:6-8", save_interval=5)
    output = communicate_or_diagnose(process, 300)[0]
    assert process.returncode == EXIT_DIVERGED, output[-2000:]
    skipped = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "skipped"]
    assert [r["step"] for r in skipped] == [3, 6, 7, 8]
    assert "3 non-finite steps in a row" in output and "before step 6" in output
    state = json.loads((run_dir / "checkpoints" / "step_00000008" / "train_state.json").read_text())
    assert state["skipped_steps"] == 4
    # skipped steps leave the weights alone: step 8's weights are step 5's
    step5 = load_file(run_dir / "checkpoints" / "step_00000005" / "model.safetensors")
    step8 = load_file(run_dir / "checkpoints" / "step_00000008" / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in step8.values())
    assert all(torch.equal(step5[k], step8[k]) for k in step5)


def fake_checkpoint(folder: Path, step: int) -> Path:
    """A sealed checkpoint of a train state alone: enough for listing and retention."""
    from hf_pretrain.checkpoints.manifest import write_manifest

    folder.mkdir(parents=True)
    (folder / "train_state.json").write_text(json.dumps({"step": step}))
    (folder / "model.safetensors").write_bytes(bytes(range(256)))
    write_manifest(folder)
    return folder


def test_milestones_survive_pruning(tmp_path):
    from hf_pretrain.checkpoints.store import prune_checkpoints

    root = tmp_path / "checkpoints"
    for step in (2, 4, 5, 6, 8, 9, 10):
        fake_checkpoint(root / f"step_{step:08d}", step)
    (root / "step_00000003.tmp").mkdir()
    prune_checkpoints(tmp_path, keep=2, milestone_interval=4)
    assert sorted(p.name for p in root.iterdir()) == [
        "step_00000004",
        "step_00000008",
        "step_00000009",
        "step_00000010",
    ]


def test_retention_sets_a_broken_checkpoint_aside_and_keeps_the_good_ones(tmp_path):
    """A checkpoint that failed its verification (a flipped byte), or whose files do not match its
    manifest, is renamed step_N.corrupt/ and never counted among the kept: with keep 1 the good one
    stays (the code before deleted it and kept the corrupt one)."""
    from hf_pretrain.checkpoints.store import newest_good_checkpoint, newest_sound_checkpoint, prune_checkpoints

    root = tmp_path / "checkpoints"
    for step in (8, 10):
        fake_checkpoint(root / f"step_{step:08d}", step)
    flip_last_byte(fake_checkpoint(root / "step_00000012", 12) / "model.safetensors")
    torn = fake_checkpoint(root / "step_00000014", 14)
    (torn / "model.safetensors").write_bytes(b"cut")
    said: list[str] = []
    found = newest_good_checkpoint(tmp_path, log=said.append)
    assert found is not None and found.path.name == "step_00000010", said
    assert newest_sound_checkpoint(tmp_path).step == 10  # what status.json names
    prune_checkpoints(tmp_path, keep=1)
    assert sorted(p.name for p in root.iterdir()) == [
        "step_00000010",
        "step_00000012.corrupt",
        "step_00000014.corrupt",
    ]
    assert "fails its checksum" in (root / "step_00000012.corrupt" / "SET_ASIDE.txt").read_text()
    assert "has 3 bytes" in (root / "step_00000014.corrupt" / "SET_ASIDE.txt").read_text()
    fake_checkpoint(root / "step_00000012", 12)  # the step written again, good, then damaged again
    flip_last_byte(root / "step_00000012" / "model.safetensors")
    newest_good_checkpoint(tmp_path, log=said.append)
    prune_checkpoints(tmp_path, keep=1)
    assert (root / "step_00000012.corrupt.2").is_dir() and (root / "step_00000010").is_dir()
