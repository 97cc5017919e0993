"""Issue 21: stop requests that mean what they say, and every refusal a message (a line naming the file,
key or value and the fix, a meaningful exit code, no traceback). Pure parts first; the CPU runs are
marked slow, each launch with a timeout that fails the test instead of hanging it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hf_pretrain.checkpoints.layout import TRAIN_STATE
from hf_pretrain.checkpoints.manifest import write_manifest
from hf_pretrain.config import build_recipe, load_recipe
from hf_pretrain.optim import Cooldown
from hf_pretrain.preflight import run_checks
from hf_pretrain.run_dir import RunDir
from hf_pretrain.run_lock import RunLock
from hf_pretrain.stop_file import read_stop_request, request_stop
from hf_pretrain.training.guards import Guards
from hf_pretrain.training.session import Session, read_status
from hf_pretrain.training.state import TrainState
from hf_pretrain.training.stop_request import main as stop_main
from hf_pretrain.training.stop_request import take_up_at_start
from tests.helpers import launch_training


# ---------------------------------------------------------------------- a run folder by hand
def fake_checkpoint(run: Path, step: int, **state) -> Path:
    folder = RunDir(run).checkpoints / f"step_{step:08d}"
    folder.mkdir(parents=True)
    (folder / TRAIN_STATE).write_text(json.dumps({"step": step, **state}))
    write_manifest(folder)
    return folder


def write_status(run: Path, **status) -> None:
    RunDir(run).status.write_text(json.dumps(status))


class FakeLog:
    def __init__(self):
        self.lines, self.records = [], []

    def say(self, text, every_process=False):
        self.lines.append(text)

    def record(self, record):
        self.records.append(record)


# ---------------------------------------------------------------------- 4. stop requests
def test_a_stop_on_a_run_that_is_not_running_says_so_and_waits_for_the_next_start(tmp_path, capsys):
    fake_checkpoint(tmp_path, 40, end=100)
    write_status(tmp_path, state="preempted", updated="yesterday", checkpoint_step=40)
    assert stop_main([str(tmp_path), "--cooldown_steps", "7"]) == 0
    out = capsys.readouterr().out
    assert "is not running" in out and "ended `preempted`" in out and "waits for its next start" in out
    assert "over 7 steps from its first step" in out and "another --max_steps sets it aside" in out
    assert read_stop_request(tmp_path).cooldown_steps == 7


def test_a_second_request_before_the_run_reads_the_first_replaces_it_and_says_so(tmp_path, capsys):
    fake_checkpoint(tmp_path, 40, end=100)
    assert stop_main([str(tmp_path), "--cooldown_steps", "7"]) == 0
    capsys.readouterr()
    assert stop_main([str(tmp_path), "--cooldown_steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "It replaces a stop request of" in out and "cooldown 7 steps" in out and "had not read yet" in out
    assert read_stop_request(tmp_path).cooldown_steps == 3


@pytest.mark.parametrize("how", ["status", "final"])
def test_a_stop_on_a_finished_run_is_refused_and_writes_nothing(tmp_path, capsys, how):
    if how == "status":  # status.json says so
        fake_checkpoint(tmp_path, 100, end=100)
        write_status(tmp_path, state="finished", checkpoint_step=100)
    else:  # an older run without status.json: its newest checkpoint is at its end, and final/ is there
        fake_checkpoint(tmp_path, 60, end=60, max_steps=100, cooldown={"start": 50, "end": 60, "reason": "x"})
        RunDir(tmp_path).final.mkdir()
    finished = 100 if how == "status" else 60
    assert stop_main([str(tmp_path)]) == 78
    err = capsys.readouterr().err
    assert f"finished at step {finished}: there is nothing to stop. To go further" in err and "--max_steps" in err
    assert "Traceback" not in err and not RunDir(tmp_path).stop_request.exists()


def test_a_stop_during_a_cooldown_is_refused_by_the_command_and_by_the_running_job(tmp_path, capsys):
    # a run that stopped (not running) inside its cooldown: its next start finishes it
    fake_checkpoint(tmp_path, 45, end=60, cooldown={"start": 40, "end": 60, "reason": "stop requested"})
    assert stop_main([str(tmp_path)]) == 78
    assert "in its cooldown (stop requested)" in capsys.readouterr().err
    # a running job that answered a request: a second one is refused, naming how to stop sooner
    request_stop(tmp_path)
    from hf_pretrain.stop_file import answer_stop_request

    answer_stop_request(tmp_path, 40, "began its cooldown to step 60")
    lock = RunLock(RunDir(tmp_path))
    lock.acquire()
    try:
        assert stop_main([str(tmp_path), "--cooldown_steps", "0"]) == 78
    finally:
        lock.release()
    err = capsys.readouterr().err
    assert "already finishing" in err and "at step 40" in err and f"kill -TERM {os.getpid()}" in err
    assert read_stop_request(tmp_path).cooldown_steps is None  # the first request stands


def guarded_state(tmp_path, **overrides):
    recipe = build_recipe(
        {}, {"output_dir": str(tmp_path), "max_steps": 100, "warmup_steps": 10, "lr_schedule": "wsd", **overrides}
    )
    log = FakeLog()
    guards = Guards(recipe.train, SimpleNamespace(num_processes=1, is_main_process=True), log)
    return TrainState.for_recipe(recipe, "cpu"), guards, log


def test_the_job_answers_a_request_and_refuses_a_second_one_during_its_cooldown(tmp_path):
    state, guards, log = guarded_state(tmp_path)
    state.step = 40
    request_stop(tmp_path, cooldown_steps=10)
    assert guards.decide(state, []) is None and state.cooldown == Cooldown(40, 50, "stop requested (hf-pretrain stop)")
    answered = read_stop_request(tmp_path)
    assert answered.answered_at_step == 40 and "cooldown to step 50" in answered.answer
    state.step = 41
    request_stop(tmp_path, cooldown_steps=0)  # a second request, written past the command
    assert guards.decide(state, []) is None and state.cooldown.end == 50  # not applied
    assert "refused: the run is already in its cooldown" in log.lines[-1]
    assert read_stop_request(tmp_path).answered_at_step == 41
    log.lines.clear()
    state.step = 42
    assert guards.decide(state, []) is None and not log.lines  # said once


def test_a_request_from_before_a_start_is_set_aside_by_an_extension_and_applied_otherwise(tmp_path):
    lines = []
    request_stop(tmp_path, cooldown_steps=5)
    take_up_at_start(tmp_path, max_steps_changed=False, cooldown=None, say=lines.append)
    assert "written while no training ran: applied at the first step" in lines[-1]
    assert read_stop_request(tmp_path) is not None
    take_up_at_start(tmp_path, max_steps_changed=True, cooldown=None, say=lines.append)
    assert "set aside, not applied" in lines[-1] and "changes max_steps" in lines[-1]
    assert read_stop_request(tmp_path) is None
    request_stop(tmp_path)
    take_up_at_start(tmp_path, max_steps_changed=False, cooldown=Cooldown(40, 50, "asked"), say=lines.append)
    assert "resumes the cooldown that ends it at step 50" in lines[-1] and read_stop_request(tmp_path) is None


def test_the_doctor_shows_a_pending_request_and_its_age(tmp_path, smoke_data):
    recipe = load_recipe("smoke", {"data_dir": str(smoke_data), "output_dir": str(tmp_path / "run")})
    assert not [r for r in run_checks(recipe) if r.name == "stop request"]  # no row without a request
    (tmp_path / "run").mkdir()
    request_stop(tmp_path / "run", cooldown_steps=9)
    path = RunDir(tmp_path / "run").stop_request
    hour_ago = time.time() - 3600
    path.write_text(json.dumps({**json.loads(path.read_text()), "requested_at_epoch": hour_ago}))
    (row,) = [r for r in run_checks(recipe) if r.name == "stop request"]
    assert row.status == "warn" and "of 60.0 min ago (cooldown 9 steps)" in row.reason
    assert "applied at the first step" in row.reason and str(path) in row.fix


# ---------------------------------------------------------------------- 5. a killed session is recognised
def test_the_next_start_recognises_a_killed_session(tmp_path, capsys):
    fake_checkpoint(tmp_path, 20, end=100)
    RunDir(tmp_path).metrics.write_text(
        "\n".join(json.dumps({"kind": "train", "step": s}) for s in (10, 20, 27)) + '\n{"kind": "tr'
    )
    write_status(tmp_path, state="running", pid=999999, host="gpu-7", started="then")
    with Session(tmp_path) as session:
        status = read_status(tmp_path)
        session.ended(0, "done", True)
    note = "the last run was killed at step 27 (pid 999999 on gpu-7 gone, started then"
    assert note in capsys.readouterr().out and note in status["reason"]
    assert "newest checkpoint is step 20" in status["reason"] and status["state"] == "running"
    with Session(tmp_path):  # it ended `finished`: nothing to say this time
        assert "killed" not in read_status(tmp_path)["reason"]


# ---------------------------------------------------------------------- real runs on CPU
WSD = {"lr_schedule": "wsd", "decay_fraction": 0.25, "eval_interval": 0, "save_interval": 4, "log_interval": 1}


@pytest.mark.slow
def test_a_stale_request_does_not_cut_an_extension_and_a_finished_run_refuses_one(smoke_data, tmp_path, capsys):
    """A run stopped at step 4 of 8, then `hf-pretrain stop` while nothing runs, then the run extended
    to 12: the request from before that start is set aside (said), and the run reaches its 12 steps."""
    run = tmp_path / "run"
    launch_training(smoke_data, run, max_steps=8, stop_at_step=4, timeout=300, **WSD)
    assert read_status(run)["state"] == "stopped"
    assert stop_main([str(run)]) == 0
    assert "is not running" in capsys.readouterr().out
    log = launch_training(smoke_data, run, max_steps=12, timeout=300, **WSD)
    assert "stop request: a stop request of" in log and "set aside, not applied" in log
    assert read_status(run)["state"] == "finished" and "finished at step" not in read_status(run)["reason"]
    assert json.loads((run / "checkpoints" / "step_00000012" / TRAIN_STATE).read_text())["cooldown"] is None
    assert not RunDir(run).stop_request.exists()
    assert stop_main([str(run)]) == 78
    assert "finished at step 12" in capsys.readouterr().err
