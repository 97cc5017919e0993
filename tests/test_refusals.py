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
from hf_pretrain.config import build_recipe, load_recipe, save_recipe
from hf_pretrain.exit_codes import EXIT_CONFIG
from hf_pretrain.optim.build import Cooldown
from hf_pretrain.preflight.checks import run_checks
from hf_pretrain.run_commands.stop_command import main as stop_main
from hf_pretrain.run_folder.run_dir import RunDir
from hf_pretrain.run_folder.run_lock import RunLock
from hf_pretrain.run_folder.stop_request import read_stop_request, request_stop
from hf_pretrain.store.location import Where
from hf_pretrain.training.guards import take_up_at_start
from hf_pretrain.training.session import Session, read_status
from tests.helpers import FakeLog, guards_of, launch_training, resolved_here, state_at_start


# ---------------------------------------------------------------------- a run folder by hand
def fake_checkpoint(run: Path, step: int, **state) -> Path:
    folder = RunDir(run).checkpoints / f"step_{step:08d}"
    folder.mkdir(parents=True)
    (folder / TRAIN_STATE).write_text(json.dumps({"step": step, **state}))
    write_manifest(folder)
    return folder


def write_status(run: Path, **status) -> None:
    RunDir(run).status.write_text(json.dumps(status))


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


@pytest.mark.parametrize(
    "schedule, flags, then",
    [
        ("cosine", [], "saves and writes final/ after its next step (a cosine run: the model will not have finished"),
        ("wsd", [], "decays its learning rate over decay_fraction x the steps done from its first step"),
        ("wsd", ["--cooldown_steps", "0"], "saves and writes final/ after its next step; a start"),
    ],
)
def test_what_a_stop_says_the_run_will_do_follows_its_recipe_schedule(tmp_path, capsys, schedule, flags, then):
    """The answer reads the run's own recipe (resolved_recipe.yaml): a cosine run stops unfinished."""
    fake_checkpoint(tmp_path, 40, end=100)
    save_recipe(build_recipe({}, {"lr_schedule": schedule, "max_steps": 100}), RunDir(tmp_path).resolved_recipe)
    assert stop_main([str(tmp_path), *flags]) == 0
    assert then in capsys.readouterr().out


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
    from hf_pretrain.run_folder.stop_request import answer_stop_request

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
    guards = guards_of(recipe, SimpleNamespace(num_processes=1, is_main_process=True), log)
    return state_at_start(recipe), guards, log


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
    where = Where.of(recipe)
    assert not [
        r for r in run_checks(recipe, resolved_here(recipe, where=where)) if r.name == "stop request"
    ]  # no row without a request
    (tmp_path / "run").mkdir()
    request_stop(tmp_path / "run", cooldown_steps=9)
    path = RunDir(tmp_path / "run").stop_request
    hour_ago = time.time() - 3600
    path.write_text(json.dumps({**json.loads(path.read_text()), "requested_at_epoch": hour_ago}))
    (row,) = [r for r in run_checks(recipe, resolved_here(recipe, where=where)) if r.name == "stop request"]
    assert row.status == "warn" and "of 60.0 min ago (cooldown 9 steps)" in row.reason
    assert "applied at the first step" in row.reason and str(path) in row.fix


# ---------------------------------------------------------------------- 5. a killed session is recognised
def test_the_next_start_recognises_a_killed_session(tmp_path, capsys):
    fake_checkpoint(tmp_path, 20, end=100)
    fake_checkpoint(tmp_path, 30, end=100)  # saved after step 27 was logged (issue 45: "killed at step 27 ... 30")
    RunDir(tmp_path).metrics.write_text(
        "\n".join(json.dumps({"kind": "train", "step": s}) for s in (10, 20, 27)) + '\n{"kind": "tr'
    )
    write_status(tmp_path, state="running", pid=999999, host="gpu-7", started="then")
    with Session(tmp_path) as session:
        status = read_status(tmp_path)
        session.ended(0, "done", True)
    note = "the last run was killed after logging step 27 (pid 999999 on gpu-7 gone, started then"
    assert note in capsys.readouterr().out and note in status["reason"]
    assert "newest checkpoint is step 30" in status["reason"] and status["state"] == "running"
    with Session(tmp_path):  # it ended `finished`: nothing to say this time
        assert "killed" not in read_status(tmp_path)["reason"]


def test_a_start_removes_the_unfinished_save_of_a_killed_session_and_nothing_else(tmp_path, capsys):
    """Issue 38: a `step_N.tmp/` left by two SIGTERMs during a save was never cleaned. A start that holds
    the lock removes one that holds only what a save writes; a folder with anything else stays."""
    root = tmp_path / "checkpoints"
    torn = root / "step_00000007.tmp"
    torn.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.bin", "random_states_0.pkl", "config.json", "tokenizer.json"):
        (torn / name).write_bytes(b"partial")
    foreign = root / "step_00000009.tmp"
    foreign.mkdir()
    (foreign / "my_notes.txt").write_text("mine")
    with Session(tmp_path) as session:
        session.ended(0, "done", True)
    assert not torn.exists() and (foreign / "my_notes.txt").read_text() == "mine"
    out = capsys.readouterr().out
    assert "removed step_00000007.tmp: the unfinished save of a session that was killed while saving" in out
    assert f"{foreign} holds files no save writes: left as it is" in out


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


# ---------------------------------------------------------------------- 5. every refusal a message
def test_an_impossible_output_dir_is_refused_in_a_line_with_exit_78(tmp_path, smoke_data, capsys):
    from hf_pretrain import train

    (tmp_path / "a_file").write_text("not a folder")
    output_dir = tmp_path / "a_file" / "run"
    assert train.main(["--recipe", "smoke", "--data_dir", str(smoke_data), "--output_dir", str(output_dir)]) == 78
    err = capsys.readouterr().err
    assert f"refused, nothing was started: cannot use {output_dir} as the run folder" in err
    assert "--output_dir on a writable disk" in err and "Traceback" not in err


def test_a_truncated_tokenizer_fails_the_data_check_naming_the_file(tmp_path, smoke_data, capsys):
    import shutil

    from hf_pretrain import train
    from tests.helpers import prepared_row

    data = tmp_path / "data"
    shutil.copytree(smoke_data, data)
    tokenizer = data / "tokenizer" / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes()[:5000])
    result = prepared_row(load_recipe("smoke", {"data_dir": str(data)}))
    assert result.status == "fail" and f"{tokenizer} cannot be read" in result.reason and "truncated" in result.reason
    assert f"delete {data} and prepare it again" in result.fix
    run = tmp_path / "run"
    assert train.main(["--recipe", "smoke", "--data_dir", str(data), "--output_dir", str(run)]) == 78
    err = capsys.readouterr().err
    assert "preflight failed, nothing was started" in err and str(tokenizer) in err and "Traceback" not in err
    assert read_status(run)["state"] == "refused" and read_status(run)["exit_code"] == 78


def test_a_batch_that_does_not_split_names_the_values_that_do():
    from hf_pretrain.preflight.data import check_batch_split

    def split(recipe, world_size):
        return check_batch_split(recipe.train, world_size, seq_len=recipe.data.seq_len)

    smoke = split(load_recipe("smoke"), 3)  # 32 sequences of 128, micro-batches of 16
    assert smoke.status == "fail" and "no micro_batch_size splits 32 sequences over 3 processes" in smoke.fix
    assert "--global_batch_tokens 6144" in smoke.fix and "keep this batch on 1 or 2 process(es)" in smoke.fix
    big = split(load_recipe("1b"), 16)  # 64 sequences of 2048: 4 per process
    assert "--micro_batch_size 4, 2 or 1 (4 sequences per process)" in big.fix
    assert "--global_batch_tokens 262144" in big.fix and "1, 2, 4 or 8 process(es)" in big.fix
    for fix, world in ((smoke.fix, 3), (big.fix, 16)):  # every value named does split
        for tokens in [int(t) for t in fix.split("--global_batch_tokens ")[1].split(" (")[0].split(" or ")]:
            recipe = load_recipe("smoke" if world == 3 else "1b", {"global_batch_tokens": tokens})
            assert split(recipe, world).status == "pass"


@pytest.mark.parametrize("missing", ["tokenizer.json", "config.json"])
def test_eval_on_an_export_missing_a_file_names_it(tmp_path, capsys, missing):
    from hf_pretrain.evaluation import eval_command

    folder = tmp_path / "export"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    (folder / missing).unlink()
    assert eval_command.main(["--model", str(folder), "--tasks", "arc_easy", "--limit", "2"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert f"{folder} has no {missing}: not a whole model folder" in err and "--overwrite" in err
    assert "Traceback" not in err and not (folder / "eval").exists()
    (folder / missing).write_text('{"model_type": "lla')  # cut short
    assert eval_command.main(["--model", str(folder), "--tasks", "arc_easy"]) == EXIT_CONFIG
    assert f"{folder / missing} cannot be read" in capsys.readouterr().err


def test_divergence_is_a_verdict_on_the_last_window_and_the_card_says_it():
    from hf_pretrain.publish.model_card import _how_it_ended
    from hf_pretrain.training.metrics import DivergenceWatch

    def records(losses):
        return [{"kind": "train", "step": i + 1, "loss": loss} for i, loss in enumerate(losses)]

    healthy = DivergenceWatch(records([8.3 - 0.1 * i for i in range(40)]))
    assert healthy.verdict is None
    above_start = DivergenceWatch(records([8.3, 7.0] + [12.0] * 20))
    assert "above its start, 8.300" in above_start.verdict
    rising = DivergenceWatch(records([8.0 - 0.2 * i for i in range(20)] + [6.5] * 10))
    assert "risen" in rising.verdict and "above the lowest mean it reached" in rising.verdict
    watch = DivergenceWatch([])  # said once, when it turns; a recovery clears it
    said = [watch.observe(r) for r in records([8.3] + [9.0] * 12)]
    assert sum(s is not None for s in said) == 1
    for record in records([8.3] + [9.0] * 12 + [3.0] * 10)[13:]:
        watch.observe(record)
    assert watch.verdict is None
    schedule = state_at_start(load_recipe("smoke"), "data/smoke").schedule
    rows = dict(_how_it_ended(schedule, {"step": 10, "divergence": above_start.verdict}))
    assert rows["diverged"].startswith("**yes**: the loss diverged")


def test_only_the_tied_embedding_note_is_silenced_and_only_during_the_save(caplog):
    import logging

    from hf_pretrain.checkpoints.saving import quiet_about_the_tied_embedding

    logger = logging.getLogger("accelerate.utils.other")
    tied = "[RANK 0] Removed shared tensor {'lm_head.weight'} while saving. This should be OK, but check ..."
    other = "Removed shared tensor {'encoder.weight'} while saving. This should be OK, but check ..."
    with caplog.at_level(logging.WARNING, logger="accelerate.utils.other"):
        with quiet_about_the_tied_embedding():
            logger.warning(tied)
            logger.warning(other)
        logger.warning(tied)
    assert [r.getMessage() for r in caplog.records] == [other, tied]


@pytest.mark.slow
def test_three_processes_on_a_batch_that_does_not_split_are_refused_not_crashed(smoke_data, tmp_path):
    import subprocess

    from tests.helpers import OUTSIDE_CHECKOUT, launch_command, offline_env

    run = tmp_path / "run"
    command = launch_command("--num_processes", "3", processes=2, data_dir=smoke_data, output_dir=run)
    result = subprocess.run(
        command, cwd=OUTSIDE_CHECKOUT, env=offline_env(), capture_output=True, text=True, timeout=300
    )
    log = result.stdout + result.stderr
    status = read_status(run)
    assert result.returncode != 0 and status["state"] == "refused" and status["exit_code"] == 78, log[-3000:]
    assert "--global_batch_tokens 6144" in status["reason"] and "1 or 2 process(es)" in status["reason"]
    assert log.count("train.py: preflight failed, nothing was started") == 3  # each process, in a line
    assert "RecipeError" not in log and "training/loop.py" not in log  # no traceback of ours (torchrun prints its own)


def run_export(args: list[str], file_limit: int = 0, umask: str = "022"):
    """`hf-pretrain export ARGS` under a file-size limit (0: none) and `umask` (tests/export_within_limits.py)."""
    import sys

    from tests.helpers import OUTSIDE_CHECKOUT, ROOT, offline_env, run_captured

    command = [sys.executable, str(ROOT / "tests" / "export_within_limits.py"), str(file_limit), umask, *map(str, args)]
    return run_captured(command, OUTSIDE_CHECKOUT, offline_env(), timeout=300)


@pytest.mark.slow
def test_an_export_onto_a_full_disk_says_so_and_leaves_nothing(reference_run, tmp_path):
    out = tmp_path / "exports" / "tiny"
    full = run_export(["--checkpoint", reference_run[0], "--out", out], file_limit=1_000_000)
    assert full.returncode == 74, full.stderr[-3000:]
    assert "hf-pretrain export: error: writing" in full.stderr and "File too large" in full.stderr
    assert "Nothing of this export was left behind" in full.stderr and "Traceback" not in full.stderr
    assert not out.exists() and list((tmp_path / "exports").iterdir()) == []  # no hidden build folder
    # the HF folder fits (bf16, 2.6 MB), its f32 GGUF (5.3 MB) does not: the .gguf.tmp goes
    gguf = run_export(["--checkpoint", reference_run[0], "--out", out, "--gguf", "--gguf_type", "f32"], 4_000_000)
    assert gguf.returncode == 74 and "The partial file was removed" in gguf.stderr, gguf.stderr[-3000:]
    assert "Traceback" not in gguf.stderr and (out / "config.json").is_file()
    assert not list(out.glob("*.gguf*")) and list((tmp_path / "exports").iterdir()) == [out]


@pytest.mark.slow
def test_overwrite_cleans_what_a_killed_export_left_and_exports_are_readable_by_all(reference_run, tmp_path):
    out = tmp_path / "tiny"
    assert run_export(["--checkpoint", reference_run[0], "--out", out]).returncode == 0
    assert {oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {"0o644"}  # model.safetensors too
    assert oct(out.stat().st_mode & 0o777) == "0o755"
    (out / "tiny-f16.gguf.tmp").write_bytes(b"\0" * 1000)  # what a kill leaves: a GGUF being written,
    (tmp_path / ".tiny.export-k1ll3d").mkdir()  # and the folder an export was being built in
    (tmp_path / ".tiny.export-k1ll3d" / "model.safetensors").write_bytes(b"\0" * 1000)
    refused = run_export(["--checkpoint", reference_run[0], "--out", out])
    assert (
        refused.returncode == EXIT_CONFIG and "tiny-f16.gguf.tmp" in refused.stderr and "--overwrite" in refused.stderr
    )
    elsewhere = run_export(["--checkpoint", reference_run[0], "--out", tmp_path / "tiny2"])
    assert elsewhere.returncode == 0 and "removed" not in elsewhere.stdout  # another --out's leftovers stay
    cleaned = run_export(["--checkpoint", reference_run[0], "--out", out, "--overwrite"], umask="027")
    assert cleaned.returncode == 0, cleaned.stderr[-3000:]
    assert "removed what an interrupted export left" in cleaned.stdout and ".tiny.export-k1ll3d" in cleaned.stdout
    assert not (out / "tiny-f16.gguf.tmp").exists() and not (tmp_path / ".tiny.export-k1ll3d").exists()
    assert {oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {"0o640"}  # the umask is respected
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.slow
def test_a_diverged_run_that_finishes_exits_0_and_says_so_everywhere(smoke_data, tmp_path):
    run = tmp_path / "run"
    log = launch_training(smoke_data, run, learning_rate=1.0, max_bad_steps=100, timeout=300)
    status = read_status(run)
    assert status["state"] == "finished" and status["exit_code"] == 0
    assert "warning: the loss diverged" in status["reason"] and "warning: the loss diverged" in log
    assert any(r["kind"] == "divergence" for r in map(json.loads, RunDir(run).metrics.read_text().splitlines()))
    assert "| diverged | **yes**: the loss diverged" in (RunDir(run).final / "README.md").read_text()
    assert "Removed shared tensor" not in log  # the tied embedding's note, silenced where checkpoints are saved
