"""Runs that fail loudly, never hang, and never destroy (issue 12): a crash ends the process, the
launcher's exit reaches the trainer, status.json tells a script how a session ended, one training
per run folder, a checkpoint that does not fit stops the run, export --overwrite replaces only an
export, and a random state that cannot be restored is said."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from accelerate import Accelerator
from transformers import AutoConfig

from hf_pretrain.checkpoints.load import restore_training_state
from hf_pretrain.checkpoints.manifest import verify_checkpoint, write_manifest
from hf_pretrain.checkpoints.resume_decision import decide_resume
from hf_pretrain.checkpoints.resume_plan import ResumeRefused
from hf_pretrain.config import load_recipe
from hf_pretrain.data.prepared import data_identity
from hf_pretrain.exit_codes import EXIT_CONFIG, EXIT_CRASHED, EXIT_LOCKED, EXIT_PREEMPTED, EXIT_PREFLIGHT
from hf_pretrain.model.llama import build_model
from hf_pretrain.optim.build import build_optimizer
from hf_pretrain.publish import export_command
from hf_pretrain.run_folder.run_dir import RunDir, read_jsonl
from hf_pretrain.run_folder.run_lock import RunLock, RunLocked, holder_of
from tests.helpers import OUTSIDE_CHECKOUT, ROOT, SHORT_RUN, launch_command, offline_env, run_captured, short_run
from tests.stacks import communicate_or_diagnose

TRAIN = [str(ROOT / "hf_pretrain" / "train.py"), "--recipe", "smoke"]


def decided(recipe):
    """The resume decision of a start of `recipe`, handed its data's identity as training hands it."""
    return decide_resume(recipe, data_identity(recipe.data.data_dir))


def arguments(data_dir: Path, run_dir: Path, **overrides) -> list[str]:
    args = short_run(data_dir, run_dir, **overrides)
    return [part for key, value in args.items() for part in (f"--{key}", str(value))]


def start(command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """A process in a session of its own, so that whatever it leaves behind can be found and killed."""
    return subprocess.Popen(
        command,
        cwd=OUTSIDE_CHECKOUT,
        env={**offline_env(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def processes_naming(run_dir: Path) -> list[int]:
    """Pids of the live processes whose command line names `run_dir` (trainers and their loader workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(run_dir).encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s")
        time.sleep(0.1)


def kill_all(process: subprocess.Popen, run_dir: Path) -> None:
    """Leave nothing running, whatever the test saw."""
    for pid in [process.pid, *processes_naming(run_dir)]:
        try:
            os.killpg(pid, signal.SIGKILL) if pid == process.pid else os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    process.wait(timeout=30)


def status(run_dir: Path) -> dict:
    return json.loads(RunDir(run_dir).status.read_text())


def logged_step(run_dir: Path) -> int:
    train = [r for r in read_jsonl(RunDir(run_dir).metrics) if r.get("kind") == "train"]
    return train[-1]["step"] if train else 0


# ---------------------------------------------------------------- a crash must end the process
def test_a_crash_with_loader_workers_alive_ends_the_process(smoke_data, tmp_path):
    run_dir = tmp_path / "crash"
    process = start(
        [sys.executable, *TRAIN, *arguments(smoke_data, run_dir, num_workers=1)], env={"HF_PRETRAIN_FAULTS": "crash:3"}
    )
    try:
        output = communicate_or_diagnose(process, 90)[0]  # it used to wait forever for the workers
        assert process.returncode == EXIT_CRASHED, output[-3000:]
        assert "RuntimeError: injected fault: crash at step 3" in output  # what failed, with its traceback
        wait_until(lambda: not processes_naming(run_dir), 15, "loader workers still alive")
        ended = status(run_dir)
        assert (ended["state"], ended["exit_code"], ended["rerun"]) == ("crashed", EXIT_CRASHED, False)
        assert "injected fault" in ended["reason"]
        assert holder_of(run_dir) is None  # the lock went with the process
    finally:
        kill_all(process, run_dir)


@pytest.mark.slow  # 14 s on an idle 2-core machine, twice that when it is busy
def test_sigterm_to_the_launcher_stops_the_trainer_with_a_checkpoint(smoke_data, tmp_path):
    run_dir = tmp_path / "orphan"
    launcher = start(
        [*launch_command(through_launcher=True), *arguments(smoke_data, run_dir, max_steps=2000, save_interval=1000)]
    )
    try:
        wait_until(lambda: logged_step(run_dir) >= 2 or launcher.poll() is not None, 120, "no step 2")
        assert launcher.poll() is None, launcher.communicate()[0][-3000:]
        status_before = status(run_dir)
        assert (status_before["state"], status_before["launcher"]) == ("running", "accelerate launch")
        launcher.send_signal(signal.SIGTERM)  # the launcher alone, as a container runtime does
        output = communicate_or_diagnose(launcher, 30)[0]
        wait_until(lambda: not processes_naming(run_dir), 90, "the trainer outlived its launcher")
        ended = status(run_dir)
        assert (ended["state"], ended["exit_code"], ended["rerun"]) == ("preempted", EXIT_PREEMPTED, True), output
        assert "launcher" in ended["reason"]
        step = ended["checkpoint_step"]
        assert step >= 2 and verify_checkpoint(Path(ended["checkpoint"]))["step"] == step
        assert "exit of its launcher" in output
    finally:
        kill_all(launcher, run_dir)


def trainer_of(launcher: subprocess.Popen) -> int | None:
    """The pid of the launcher's child, once it has one."""
    children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children")
    pids = children.read_text().split() if children.is_file() else []
    return int(pids[0]) if pids else None


@pytest.mark.slow
def test_sigterm_to_the_launcher_while_the_trainer_imports_ends_the_trainer_too(smoke_data, tmp_path):
    """Issue 33: the launcher gone 1 s into the trainer's life (still importing torch), the trainer
    trained the whole run on its own and ended `finished`, while the scheduler saw 143."""
    run_dir = tmp_path / "early"
    # 2,000 steps: alone, the trainer would outlive the 20 s wait below by minutes, never finish within it
    launcher = start([*launch_command(through_launcher=True), *arguments(smoke_data, run_dir, max_steps=2000)])
    try:
        wait_until(lambda: trainer_of(launcher) or launcher.poll() is not None, 120, "no trainer started")
        assert launcher.poll() is None, launcher.communicate()[0][-3000:]
        time.sleep(1.0)
        launcher.send_signal(signal.SIGTERM)
        output = communicate_or_diagnose(launcher, 30)[0]
        wait_until(lambda: not processes_naming(run_dir), 20, "the trainer outlived its launcher")
        ended = json.loads(RunDir(run_dir).status.read_text()) if RunDir(run_dir).status.is_file() else {}
        assert ended.get("state") in (None, "preempted"), ended  # never `finished`: it trained nothing alone
        assert not RunDir(run_dir).metrics.is_file() or logged_step(run_dir) < 2000
        assert "launcher (accelerate launch, pid" in output or "exit of its launcher" in output, output[-3000:]
    finally:
        kill_all(launcher, run_dir)


ORPHAN_STARTER = (
    "import os, subprocess, sys\n"
    "with open(sys.argv[1], 'w') as err:\n"
    "    child = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=err, env=dict(os.environ, ACCELERATE_USE_CPU='true'))\n"
    "print(child.pid, flush=True)\n"  # and exit at once: the trainer's launcher is gone before it is followed
)


def test_a_trainer_whose_launcher_is_gone_before_it_follows_it_ends_in_one_line(smoke_data, tmp_path):
    run_dir, stderr = tmp_path / "orphan", tmp_path / "trainer.err"
    starter = subprocess.run(
        [sys.executable, "-c", ORPHAN_STARTER, str(stderr), sys.executable, *TRAIN, *arguments(smoke_data, run_dir)],
        cwd=OUTSIDE_CHECKOUT,
        env=offline_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    trainer = int(starter.stdout)
    wait_until(lambda: not Path(f"/proc/{trainer}").exists(), 60, "the orphaned trainer went on")
    lines = stderr.read_text().strip().splitlines()
    assert len(lines) == 1 and "exited before training began" in lines[0], lines
    assert lines[0].endswith("started without a launcher? unset ACCELERATE_USE_CPU")
    assert not run_dir.exists(), "an orphaned trainer wrote into the run folder"


def test_a_finished_run_says_so_in_status_json(reference_run):
    run_dir, _ = reference_run
    ended = status(run_dir)
    assert (ended["state"], ended["exit_code"], ended["rerun"]) == ("finished", 0, False)
    assert ended["checkpoint_step"] == SHORT_RUN["max_steps"] and ended["launcher"] == "accelerate launch"
    assert holder_of(run_dir) is None


# ---------------------------------------------------------------- one training per run folder
HOLD_THE_LOCK = (
    "import sys, time\nfrom hf_pretrain.run_folder.run_dir import RunDir\nfrom hf_pretrain.run_folder.run_lock "
    "import RunLock\nRunLock(RunDir(sys.argv[1])).acquire()\nprint('locked', flush=True)\ntime.sleep(600)\n"
)


def test_a_second_training_in_the_same_folder_is_refused_by_name(smoke_data, tmp_path):
    run_dir = tmp_path / "busy"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_LOCK, str(run_dir)],
        cwd=OUTSIDE_CHECKOUT,
        env=offline_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        second = subprocess.run(
            [sys.executable, *TRAIN, *arguments(smoke_data, run_dir)],
            cwd=OUTSIDE_CHECKOUT,
            env=offline_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == EXIT_LOCKED, second.stderr[-2000:]
        assert f"pid {holder.pid} on {socket.gethostname()}" in second.stderr and "in use" in second.stderr
        assert sorted(p.name for p in run_dir.iterdir()) == ["run.lock"]  # nothing written, no status.json
        with pytest.raises(RunLocked, match=f"pid {holder.pid}"):
            RunLock(RunDir(run_dir)).acquire()
    finally:
        holder.kill()
        holder.wait()
    lock = RunLock(RunDir(run_dir))
    lock.acquire()  # the holder was SIGKILLed: its lock died with it
    assert holder_of(run_dir)["pid"] == os.getpid()
    lock.release()


# ---------------------------------------------------------------- a checkpoint that does not fit
def tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in ("status.json", "run.lock")
    }


@pytest.fixture
def copied_run(reference_run, tmp_path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run[0], run_dir, ignore=shutil.ignore_patterns("final", "runs", "status.json"))
    return run_dir


@pytest.mark.slow  # two trainings that stop before their first step: 15 s each on an idle 2-core machine
@pytest.mark.parametrize(
    "change, named",
    [
        ({"num_hidden_layers": 2}, "num_hidden_layers 4 -> 2"),  # seen before the model is built (preflight)
        ({"vocab_multiple": 100}, "vocab_size 4096 -> 4100"),  # seen when the checkpoint is loaded
    ],
)
def test_a_checkpoint_of_another_shape_stops_the_run_and_touches_nothing(smoke_data, copied_run, change, named):
    before = tree_digest(copied_run)
    command = [sys.executable, *TRAIN, *arguments(smoke_data, copied_run, **change)]
    result = run_captured(command, OUTSIDE_CHECKOUT, offline_env(), timeout=180)
    assert result.returncode == EXIT_PREFLIGHT, (result.stdout + result.stderr)[-3000:]
    assert named in result.stderr and "--resume none --output_dir" in result.stderr
    assert tree_digest(copied_run) == before  # no metrics truncated, no checkpoint pruned, the recipe kept
    assert status(copied_run)["state"] == "refused"


def test_starting_over_on_top_of_a_run_is_refused(copied_run):
    recipe = load_recipe(str(copied_run / "resolved_recipe.yaml"), {"output_dir": str(copied_run), "resume": "none"})
    with pytest.raises(ResumeRefused, match="already holds a run"):
        decided(recipe)
    for checkpoint in (copied_run / "checkpoints").iterdir():  # every checkpoint torn
        (checkpoint / "optimizer.bin").write_bytes(b"torn")
    with pytest.raises(ResumeRefused, match="none of the checkpoints") as refused:
        decided(load_recipe(str(copied_run / "resolved_recipe.yaml"), {"output_dir": str(copied_run)}))
    # damaged files, not another recipe's: the fix was "go back to the recipe the checkpoints were saved with"
    assert "damaged" in refused.value.fix and "recipe the checkpoints were saved with" not in refused.value.fix


def test_an_unreadable_random_state_is_said(copied_run):
    checkpoint = copied_run / "checkpoints" / f"step_{SHORT_RUN['max_steps']:08d}"
    (checkpoint / "random_states_0.pkl").write_bytes(b"not a pickle")
    write_manifest(checkpoint)  # whole by its manifest: only the load can tell
    config = AutoConfig.from_pretrained(checkpoint)
    model = build_model(config)
    optimizer = build_optimizer(model, load_recipe(str(copied_run / "resolved_recipe.yaml")).optim, fused=False)
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    said: list[str] = []
    recipe = load_recipe(str(copied_run / "resolved_recipe.yaml"), {"output_dir": str(copied_run)})
    resumed = decided(recipe).folder
    restore_training_state(accelerator, resumed, log=said.append)
    assert resumed == checkpoint  # the weights and optimizer still resume
    assert any("random_states_0.pkl is unreadable" in line and "fresh random state" in line for line in said), said


# ---------------------------------------------------------------- export --overwrite
def test_export_overwrite_replaces_a_previous_export_and_nothing_else(
    reference_run, exported, tmp_path, monkeypatch, capsys
):
    run_dir, _ = reference_run
    common = ["--checkpoint", str(run_dir), "--overwrite"]
    before = tree_digest(run_dir)
    assert (
        export_command.main([*common, "--out", str(run_dir)]) == EXIT_CONFIG
    )  # it used to delete every checkpoint, rc 0
    assert "holds the checkpoint being exported" in capsys.readouterr().err
    assert tree_digest(run_dir) == before

    mine = tmp_path / "mine"
    shutil.copytree(exported, mine)
    (mine / "notes.txt").write_text("my notes")
    (mine / "data").mkdir()
    assert export_command.main([*common, "--out", str(mine)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "notes.txt" in err and "data/" in err and "not one" in err
    assert (mine / "notes.txt").read_text() == "my notes" and (mine / "model.safetensors").is_file()

    previous = tmp_path / "previous"
    shutil.copytree(exported, previous)
    (previous / "config.json").write_text("{}")  # stale: the new export must replace it
    (tmp_path / "previous.tmp").mkdir()  # a folder of the user's that the old export would have deleted
    (tmp_path / "previous.tmp" / "keep").write_text("x")
    assert export_command.main([*common, "--out", str(previous)]) == 0
    assert json.loads((previous / "config.json").read_text())["num_hidden_layers"] == 4
    assert (tmp_path / "previous.tmp" / "keep").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "previous", "previous.tmp"]  # nothing left over

    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert export_command.main(["--checkpoint", str(run_dir), "--out", "."]) == 0  # a traceback before
    assert (here / "model.safetensors").is_file() and (here / "config.json").is_file()


# ---------------------------------------------------------------- a run knows its data
def other_data(smoke_data: Path, tmp_path: Path, **meta_changes) -> Path:
    """A copy of the smoke data whose meta.json says it was made otherwise (another tokenizer, other shards)."""
    data = tmp_path / "other_data"
    shutil.copytree(smoke_data, data)
    meta = json.loads((data / "meta.json").read_text())
    if "tokenizer_hash" in meta_changes:
        meta["tokenizer_hash"] = meta_changes["tokenizer_hash"]
    if meta_changes.get("shards"):
        meta["sources"][0]["splits"]["train"]["files"][0]["sha256"] = "0" * 64
    (data / "meta.json").write_text(json.dumps(meta))
    return data


def recipe_of(run: Path, data: Path, **overrides):
    return load_recipe(str(run / "resolved_recipe.yaml"), {"output_dir": str(run), "data_dir": str(data), **overrides})


def test_the_checkpoint_records_its_data_and_another_tokenizers_data_is_refused(smoke_data, copied_run, tmp_path):
    saved = verify_checkpoint(copied_run / "checkpoints" / f"step_{SHORT_RUN['max_steps']:08d}")
    assert saved["data"]["tokenizer_hash"] == json.loads((smoke_data / "meta.json").read_text())["tokenizer_hash"]
    assert decided(recipe_of(copied_run, smoke_data)).data_change is None  # the same data: no note
    data = other_data(smoke_data, tmp_path, tokenizer_hash="f" * 64)
    with pytest.raises(ResumeRefused, match="another tokenizer") as refused:
        decided(recipe_of(copied_run, data, allow_data_change=True))  # no flag lets that through
    assert str(data) in refused.value.reason and "prepare the data again" in refused.value.fix


def test_other_shards_of_the_same_tokenizer_need_allow_data_change_and_are_recorded(smoke_data, copied_run, tmp_path):
    data = other_data(smoke_data, tmp_path, shards=True)
    with pytest.raises(ResumeRefused, match="not the ones the checkpoint of step 12 trained on") as refused:
        decided(recipe_of(copied_run, data))
    assert "--allow_data_change true" in refused.value.fix
    plan = decided(recipe_of(copied_run, data, allow_data_change=True))
    assert plan.data_change["step"] == 12 and plan.data_change["to_data_dir"] == str(data)
    assert any("training data changed" in note for note in plan.notes)

    from hf_pretrain.publish.model_card import _how_it_ended
    from tests.helpers import state_at_start

    recipe = recipe_of(copied_run, data, allow_data_change=True)
    state = state_at_start(recipe)
    state.load_state_dict(plan.saved)
    state.go_on_as(plan, plan.saved)
    assert state.data_changes == [plan.data_change] and state.state_dict()["data"]["data_dir"] == str(data)
    rows = dict(_how_it_ended(state.schedule, state.state_dict()))
    assert "after step 12" in rows["data changed"] and str(data) in rows["data changed"]


@pytest.mark.slow  # one training that stops before its first step
def test_training_on_re_prepared_data_is_refused_before_any_work(smoke_data, copied_run, tmp_path):
    data = other_data(smoke_data, tmp_path, tokenizer_hash="f" * 64)
    before = tree_digest(copied_run)
    result = run_captured([sys.executable, *TRAIN, *arguments(data, copied_run)], OUTSIDE_CHECKOUT, offline_env(), 300)
    assert result.returncode == EXIT_PREFLIGHT, (result.stdout + result.stderr)[-3000:]
    assert "another tokenizer" in result.stdout + result.stderr
    assert tree_digest(copied_run) == before and status(copied_run)["state"] == "refused"


def test_only_init_or_a_subreaper_counts_as_a_launcher_that_left():
    """The trainer's parent under a launcher's environment: a launcher (also as a container's pid 1) or
    a Python driver of the tests' kind is followed; init or a non-Python subreaper means it had left."""
    from hf_pretrain.processes import left_by_launcher

    assert not left_by_launcher(4242, "/venv/bin/python /venv/bin/accelerate launch train.py")
    assert not left_by_launcher(1, "/venv/bin/python -m torch.distributed.run --nproc_per_node 8 train.py")
    assert not left_by_launcher(4242, "/venv/bin/python -m pytest -q tests")
    assert not left_by_launcher(4242, None)  # unreadable: never guess it gone
    assert left_by_launcher(1, "/sbin/init")
    assert left_by_launcher(1, "/usr/bin/python3 /sbin/some-init")
    assert left_by_launcher(777, "/lib/systemd/systemd --user")


def test_the_launchers_exit_and_the_machines_sigterm_are_one_stop_in_either_order(monkeypatch):
    """A machine's shutdown sends SIGTERM to every process: the launcher may end (its exit reaching the trainer)
    before the trainer's own SIGTERM is handled. That SIGTERM is the same stop, ended with a checkpoint, not a
    second signal that exits at once (it was: tests/test_engine_run.py's node 1 left no checkpoint, once)."""
    from hf_pretrain.training import guards

    exits: list[str] = []
    monkeypatch.setattr(guards, "followed_launcher", lambda: 4242)
    monkeypatch.setattr(guards, "launcher_gone", lambda: True)
    monkeypatch.setattr(guards, "exit_at_once", lambda name, signum, lost: exits.append(name))
    with guards.GracefulStop(lambda line: None) as stop:
        assert stop.stopping()  # the launcher's exit, seen first
        signal.raise_signal(signal.SIGTERM)  # then the machine's SIGTERM to this process
        assert not exits and stop.signal_name == "the exit of its launcher (pid 4242)"
        signal.raise_signal(signal.SIGTERM)  # sent again: that one exits at once
        assert exits == ["SIGTERM"]
    with guards.GracefulStop(lambda line: None) as stop:
        signal.raise_signal(signal.SIGTERM)  # the other order: the signal, then the launcher's exit
        stop._launcher_exited(guards.LAUNCHER_GONE, None)
        assert exits == ["SIGTERM"] and stop.stopping() and stop.signal_name == "SIGTERM"
