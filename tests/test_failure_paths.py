"""Issue 29, the failure paths of training and the doctor: each one ends in a line that names the
problem and a fix, with an exit code and a status.json that say the same, never a traceback.

The full disk is a real one where the platform allows it: a tmpfs mounted for the test (root, or a
user namespace that may mount), skipped cleanly elsewhere; beside it, the same errors injected.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from hf_pretrain.checkpoints import disk_space
from hf_pretrain.checkpoints.async_save import StagedState
from hf_pretrain.checkpoints.saving import CheckpointSaveError
from hf_pretrain.exit_codes import EXIT_PREEMPTED, EXIT_SAVE_FAILED
from hf_pretrain.training.session import Session, read_status
from hf_pretrain.training.start_up import StoppedDuringStartUp, loop_ended
from tests.helpers import launch_training, save_with_stand_ins
from tests.stacks import communicate_or_diagnose
from tests.test_survival import complete_steps, start_training, wait_for_step

# what torch's zip writer raised when the disk filled under it (seen on a full tmpfs)
TORCH_FULL_DISK = "[enforce fail at inline_container.cc:672] . unexpected pos 5188928 vs 5188816"


@contextmanager
def small_volume(where: Path, size: str):
    """A tmpfs of `size` mounted at `where` for the test; skips the test where mounting is not allowed."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip() or 'mount failed'})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(volume: Path, leave: int) -> Path:
    """Take all the free space of `volume` but `leave` bytes, with one file (which the test removes later)."""
    filler = volume / "filler"
    with filler.open("wb") as f:
        while (free := shutil.disk_usage(volume).free) > leave:
            f.write(b"\0" * min(free - leave, 1 << 20))
            f.flush()
    return filler


@pytest.fixture(scope="module")
def accelerator():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model := torch.nn.Linear(256, 256), torch.optim.AdamW(model.parameters()))
    model(torch.ones(1, 256)).sum().backward()
    optimizer.step()  # AdamW's moments exist: optimizer.bin is twice the weights, written by torch's zip writer
    return accelerator


save = save_with_stand_ins


# ---------------------------------------------------------------------- a full disk inside a checkpoint save
@pytest.mark.parametrize("fails_in", ["model.safetensors", "optimizer.bin"])
def test_a_real_full_disk_inside_a_save_is_named_and_leaves_the_previous_checkpoint(accelerator, tmp_path, fails_in):
    """safetensors says "I/O error: No space left on device (os error 28)", torch "unexpected pos": neither an OSError."""
    with small_volume(tmp_path / "disk", "2m") as volume:
        save(accelerator, volume, 1)  # about 0.8 MB: room for one, not two
        size = {f.name: f.stat().st_size for f in (volume / "checkpoints" / "step_00000001").iterdir()}
        fill(
            volume,
            leave=size["model.safetensors"] // 2
            if fails_in == "model.safetensors"
            else size["model.safetensors"] + size["optimizer.bin"] // 2,
        )
        with pytest.raises(CheckpointSaveError) as raised:
            save(accelerator, volume, 2)
        message = str(raised.value)
        assert "No space left on device" in message and "free on that volume" in message, message
        assert "step_00000001 is intact" in message and "\n" not in message
        assert sorted(p.name for p in (volume / "checkpoints").iterdir()) == ["step_00000001"]


@pytest.mark.parametrize(
    "raised",
    [
        RuntimeError(TORCH_FULL_DISK),
        RuntimeError("PytorchStreamWriter failed writing file data/3: file write failed"),
        OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)),
    ],
    ids=["torch-unexpected-pos", "torch-stream-writer", "quota"],
)
def test_the_errors_a_full_disk_gives_are_a_failed_save_when_the_volume_is_full(
    accelerator, tmp_path, monkeypatch, raised
):
    save(accelerator, tmp_path, 1)

    def full(*args, **kwargs):
        raise raised

    monkeypatch.setattr(StagedState, "write", full)  # the states written on this thread (the last save)
    monkeypatch.setattr(disk_space, "free_bytes", lambda path: 4096)  # what was left when the write failed
    with pytest.raises(CheckpointSaveError, match=r"saving the step 2 checkpoint.*step_00000001 is intact") as e:
        save(accelerator, tmp_path, 2)
    assert "4.1 kB free on that volume" in str(e.value) and "a checkpoint of this run takes about" in str(e.value)
    assert not (tmp_path / "checkpoints" / "step_00000002.tmp").exists()


def test_the_same_words_on_a_roomy_disk_are_a_crash_not_a_full_disk(accelerator, tmp_path, monkeypatch):
    """Judged by the volume, not by the words: a bug that says `unexpected pos` keeps its traceback."""
    save(accelerator, tmp_path, 1)

    def bug(*args, **kwargs):
        raise RuntimeError(TORCH_FULL_DISK)

    monkeypatch.setattr(StagedState, "write", bug)
    with pytest.raises(RuntimeError, match="unexpected pos") as raised:
        save(accelerator, tmp_path, 2)
    assert not isinstance(raised.value, CheckpointSaveError)


def test_status_json_is_written_on_a_full_disk_and_no_temporary_copy_is_left(tmp_path):
    with small_volume(tmp_path / "disk", "1m") as volume:
        run_dir = volume / "run"
        with Session(run_dir) as session:
            assert read_status(run_dir)["state"] == "running"
            fill(volume, leave=0)
            session.ended(EXIT_SAVE_FAILED, "stopped: the disk is full", finished=False)
        status = read_status(run_dir)
        assert status["state"] == "save_failed" and status["exit_code"] == EXIT_SAVE_FAILED
        assert not list(run_dir.glob("status.json.*.tmp"))


@pytest.mark.slow
def test_a_run_whose_disk_fills_up_exits_74_with_the_free_space_and_the_next_start_resumes(smoke_data, tmp_path):
    """The run of the issue: the disk fills between two saves; torch's zip writer fails in optimizer.bin."""
    with small_volume(tmp_path / "disk", "400m") as volume:  # room for the preflight's estimate
        run_dir = volume / "run"
        release = tmp_path / "release"  # held before step 6 while the disk fills: no race with step 8 (issue 49)
        process = start_training(smoke_data, run_dir, "hold:6", release, save_interval=4, report_to="none")
        try:
            assert wait_for_step(process, run_dir, 5, timeout=300)
            first = run_dir / "checkpoints" / "step_00000004"
            deadline = time.monotonic() + 60
            while not (first / "manifest.json").exists():  # sealed on a thread
                assert time.monotonic() < deadline, "the step 4 checkpoint was never sealed"
                time.sleep(0.05)
            size = {f.name: f.stat().st_size for f in first.iterdir()}
            filler = fill(volume, leave=size["model.safetensors"] + size["optimizer.bin"] // 2)
            (release / "6").touch()
            output = communicate_or_diagnose(process, 300)[0]
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == EXIT_SAVE_FAILED, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
        stopped = [line for line in output.splitlines() if line.startswith("stopped: ")]
        assert len(stopped) == 1 and "No space left on device" in stopped[0] and "free on that volume" in stopped[0]
        assert "step_00000004 is intact" in stopped[0]
        status = json.loads((run_dir / "status.json").read_text())
        assert status["state"] == "save_failed" and status["exit_code"] == EXIT_SAVE_FAILED
        assert not list(run_dir.glob("status.json.*.tmp"))
        assert complete_steps(run_dir) == [4] and not (run_dir / "checkpoints" / "step_00000008.tmp").exists()

        filler.unlink()  # the user frees space and reruns the same command
        log = launch_training(smoke_data, run_dir, report_to="none")
        assert "killed" not in log and "out of memory" not in log
        assert "resumed from" in log and "at step 4" in log and (run_dir / "final").exists()


# ---------------------------------------------------------------------- SIGTERM during start-up
def test_sigterm_before_the_loop_ends_the_session_as_preempted_and_restores_the_handlers(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(StoppedDuringStartUp), Session(tmp_path / "run"):
        os.kill(os.getpid(), signal.SIGTERM)  # delivered at the next bytecode: in the preflight, say
        time.sleep(5)
        pytest.fail("the signal did not stop the start-up")
    status = read_status(tmp_path / "run")
    assert status["state"] == "preempted" and status["exit_code"] == EXIT_PREEMPTED and status["rerun"]
    assert "during start-up" in status["reason"] and "Rerun the same command" in status["reason"]
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_signal_after_the_loop_does_not_change_the_ending(tmp_path, capfd):
    with Session(tmp_path / "run") as session:
        loop_ended()  # as the loop's guards say when they hand the signals back
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        session.ended(0, "done", finished=True)
    assert read_status(tmp_path / "run")["state"] == "finished"
    assert "already ending" in capfd.readouterr().err


@pytest.mark.slow
def test_sigterm_in_the_first_seconds_exits_75_with_a_status_that_says_so(smoke_data, tmp_path):
    run_dir = tmp_path / "run"
    process = start_training(smoke_data, run_dir, "hold:0", tmp_path / "release")  # a start-up that waits (issue 49)
    try:
        deadline = time.monotonic() + 120
        while read_status(run_dir).get("state") != "running":  # the session holds the folder: start-up begins
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0][-2000:]
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        output = communicate_or_diagnose(process, 120)[0]
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == EXIT_PREEMPTED, output[-3000:]
    assert "Traceback" not in output and "during start-up" in output, output[-3000:]
    status = read_status(run_dir)
    assert status["state"] == "preempted" and status["exit_code"] == EXIT_PREEMPTED and status["rerun"]
    assert not (run_dir / "metrics.jsonl").exists()  # no step was trained
    log = launch_training(smoke_data, run_dir, max_steps=4)
    assert "killed" not in log


# ---------------------------------------------------------------------- push_to_hub and no way to push
HUB_TOKEN = "hf_StandInToken0123456789abcdefXYZ"


@pytest.fixture
def hub_recipe(tmp_path):
    from hf_pretrain.config import build_recipe

    return build_recipe({}, {"push_to_hub": "me/run", "output_dir": str(tmp_path / "run")})


@pytest.fixture
def online(monkeypatch, tmp_path):
    """This process talks to a stand-in Hub on loopback, with no token of its own."""
    import huggingface_hub

    from tests.hub_standin import HubStandIn

    with HubStandIn(HUB_TOKEN) as hub:
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield hub


def test_the_doctor_says_offline_mode_defeats_push_to_hub(hub_recipe, monkeypatch):
    import huggingface_hub

    from hf_pretrain.preflight.hub_access import check_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    result = check_hub(hub_recipe.publish, output_dir=hub_recipe.train.output_dir)
    assert (
        result.status == "warn"
        and "HF_HUB_OFFLINE is set" in result.reason
        and "nothing will be pushed" in result.reason
    )
    assert f"hf upload me/run {hub_recipe.train.output_dir}/final" in result.fix


def test_the_doctor_checks_the_token_with_the_hub(hub_recipe, online, monkeypatch):
    from hf_pretrain.preflight.hub_access import check_hub

    result = check_hub(hub_recipe.publish, output_dir=hub_recipe.train.output_dir)  # no token at all
    assert result.status == "warn" and "no Hub token" in result.reason and "hf auth login" in result.fix
    monkeypatch.setenv("HF_TOKEN", "hf_NotTheRightToken0123456789")
    result = check_hub(hub_recipe.publish, output_dir=hub_recipe.train.output_dir)
    assert result.status == "warn" and "refused the token (HTTP 401)" in result.reason, result.reason
    assert "hf_NotTheRightToken" not in result.reason  # never printed
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    online.state.refuse_writes = True
    result = check_hub(hub_recipe.publish, output_dir=hub_recipe.train.output_dir)
    assert result.status == "warn" and "can only read" in result.reason
    online.state.refuse_writes = False
    result = check_hub(hub_recipe.publish, output_dir=hub_recipe.train.output_dir)
    assert result.status == "pass" and "pushes to me/run as user" in result.reason
    assert "GET /api/whoami-v2" in online.state.requests


def test_the_doctor_says_when_the_hub_cannot_be_reached(hub_recipe, monkeypatch):
    import socket

    import huggingface_hub

    from hf_pretrain.preflight.hub_access import check_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    with socket.socket() as silent:  # listens, never answers: a firewall that swallows the connection
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        result = check_hub(hub_recipe.publish, output_dir=hub_recipe.train.output_dir, timeout=0.5)
    assert result.status == "warn" and "did not answer within" in result.reason
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: the connection is refused
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
        result = check_hub(hub_recipe.publish, output_dir=hub_recipe.train.output_dir)
    assert result.status == "warn" and "cannot reach" in result.reason, result.reason


@pytest.mark.slow
def test_a_run_that_cannot_push_trains_and_its_end_says_what_was_not_pushed(smoke_data, tmp_path):
    run_dir = tmp_path / "run"
    log = launch_training(smoke_data, run_dir, max_steps=4, push_to_hub="me/run")  # offline: no push possible
    assert "HF_HUB_OFFLINE is set" in log  # the doctor's table, before training
    lines = log.splitlines()  # stdout, then stderr (progress bars)
    done = next(i for i, line in enumerate(lines) if line.startswith("done: "))
    last = next(line for line in lines[done + 1 :] if line.strip() and not line.startswith("Writing model shards"))
    assert last.startswith("warning: not pushed to me/run: final/") and f"hf upload me/run {run_dir}/final" in last
    status = read_status(run_dir)
    assert status["state"] == "finished" and status["not_pushed"] == ["final/"]
    assert "not pushed to me/run: final/" in status["reason"]


# ---------------------------------------------------------------------- stop --cooldown_steps past max_steps
def stoppable_run(run: Path, step: int, max_steps: int = 100) -> None:
    """A run folder by hand: its recipe, a checkpoint at `step`, and metrics up to `step`."""
    from hf_pretrain.checkpoints.layout import TRAIN_STATE
    from hf_pretrain.checkpoints.manifest import write_manifest
    from hf_pretrain.config import build_recipe, save_recipe
    from hf_pretrain.run_folder.run_dir import RunDir

    recipe = build_recipe({}, {"output_dir": str(run), "max_steps": max_steps, "global_batch_tokens": 4096})
    folder = RunDir(run).checkpoints / f"step_{step:08d}"
    folder.mkdir(parents=True)
    (folder / TRAIN_STATE).write_text(json.dumps({"step": step, "end": max_steps, "max_steps": max_steps}))
    write_manifest(folder)
    save_recipe(recipe, RunDir(run).resolved_recipe)
    records = [{"kind": "train", "step": s, "tokens_per_s": 2048.0} for s in range(1, step + 3)]  # 2 s a step
    RunDir(run).metrics.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_stop_with_a_cooldown_longer_than_what_is_left_says_where_and_when_the_decay_ends(tmp_path, capsys):
    from hf_pretrain.run_commands.stop_command import main as stop_main
    from hf_pretrain.run_folder.run_dir import RunDir
    from hf_pretrain.run_folder.run_lock import RunLock

    stoppable_run(tmp_path, 90)
    lock = RunLock(RunDir(tmp_path))
    lock.acquire()  # a running job, at step 92 (its last logged)
    try:
        assert stop_main([str(tmp_path), "--cooldown_steps", "500"]) == 0
    finally:
        lock.release()
    out = capsys.readouterr().out
    assert "500 steps are more than the 8 left after step 92" in out, out
    assert "the decay ends at max_steps, step 100, in about 16.0 s at its last logged 2,048 tokens/s" in out
    # not running: the next start resumes at the checkpoint, step 90; no rate to promise
    assert stop_main([str(tmp_path), "--cooldown_steps", "500"]) == 0
    out = capsys.readouterr().out
    assert "more than the 10 left after step 90: the decay ends at max_steps, step 100;" in out, out
    assert stop_main([str(tmp_path), "--cooldown_steps", "5"]) == 0  # it fits: nothing to say
    assert "more than the" not in capsys.readouterr().out


def test_the_job_says_a_cooldown_was_cut_at_max_steps(tmp_path):
    from types import SimpleNamespace

    from hf_pretrain.config import build_recipe
    from hf_pretrain.run_folder.stop_request import request_stop
    from tests.helpers import guards_of, state_at_start

    recipe = build_recipe({}, {"output_dir": str(tmp_path), "max_steps": 100, "lr_schedule": "wsd"})
    said = []
    log = SimpleNamespace(say=lambda text, every_process=False: said.append(text), record=lambda r: None)
    guards = guards_of(recipe, SimpleNamespace(num_processes=1, is_main_process=True), log)
    state = state_at_start(recipe)
    state.step = 95
    request_stop(tmp_path, cooldown_steps=500)
    assert guards.decide(state, []) is None and state.cooldown.end == 100
    assert "over steps 96-100" in said[-1] and "500 steps were asked, 5 are left to max_steps" in said[-1]


# ---------------------------------------------------------------------- a mixture changed on resume
def test_a_mixture_changed_on_resume_is_said_in_words_that_agree_with_the_readme():
    from hf_pretrain.checkpoints.resume_rules import plan_continuation
    from hf_pretrain.config import load_recipe, math_keys

    old = load_recipe("smoke", {})
    sources = [{"name": s.name, "kind": s.kind, "weight": w} for s, w in zip(old.data.sources, (0.3, 0.7), strict=True)]
    new = load_recipe("smoke", {"sources": sources})
    saved = {"step": 40, "math_keys": math_keys(old), "max_steps": old.train.max_steps}
    notes = plan_continuation(saved, new).notes
    assert len(notes) == 1, notes
    assert notes[0].startswith("note: the data mixture changed since the checkpoint of step 40: ")
    assert "python-docs weight 0.1 -> 0.3; python-stdlib weight 0.9 -> 0.7" in notes[0]
    assert "no new prepare is needed" in notes[0] and "{" not in notes[0] and len(notes[0]) < 300
