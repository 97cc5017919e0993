"""Every session on record, and a relaunch storm that ends itself (issue 59): the run's ledger
(`sessions.jsonl`, run_folder/sessions.py), what `status` and `report` say of it, and the start that
refuses (78) after `max_fruitless_sessions` sessions in a row that saved no new checkpoint."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from hf_pretrain.exit_codes import EXIT_CONFIG
from hf_pretrain.run_folder import sessions as ledger
from tests.helpers import launch_command, offline_env, short_run, start_merged
from tests.stacks import communicate_or_diagnose


def a_session(run: Path, ending: str, exit_code: int | None, from_step: int | None, price: float = 2.0) -> None:
    """One earlier session written by the module's own writer: begun from `from_step`, ended as `ending`."""
    one = ledger.Ledger(run, price)
    one.begin(from_step)
    one.began -= 600  # ten minutes long: what it cost is said
    one.ended(exit_code, ending, from_step)


def test_a_torn_last_line_is_skipped_and_the_next_record_starts_its_own_line(tmp_path):
    a_session(tmp_path, "preempted", 75, None)
    with ledger.ledger_path(tmp_path).open("a") as f:
        f.write('{"kind": "start", "session": "cut-sh')  # a kill in the middle of a write
    assert [s.ending for s in ledger.sessions(tmp_path)] == ["preempted"]
    a_session(tmp_path, "crashed", 1, None)
    lines = ledger.ledger_path(tmp_path).read_text().splitlines()
    assert lines[2] == '{"kind": "start", "session": "cut-sh' and json.loads(lines[3])["kind"] == "start"
    assert [s.ending for s in ledger.sessions(tmp_path)] == ["preempted", "crashed"]


def test_only_sessions_that_saved_nothing_count_toward_a_storm(tmp_path):
    a_session(tmp_path, "killed", None, None)
    a_session(tmp_path, "preempted", 75, None)  # stopped during start-up: nothing saved
    a_session(tmp_path, "refused", 78, None)  # nothing started: neither a failure nor progress
    a_session(tmp_path, "crashed", 1, None)
    past = ledger.sessions(tmp_path)
    assert [s.ending for s in ledger.fruitless_streak(past, None)] == ["killed", "preempted", "crashed"]
    assert ledger.fruitless_streak(past, 4) == []  # the newest one left a checkpoint the next start resumes
    line = ledger.storm_refusal(past, None, 3, "runs/x")
    assert "the last 3 sessions of runs/x in a row saved no new checkpoint" in line and "\n" not in line
    assert "$1.00 (30.0 min at $2/h)" in line and "--max_fruitless_sessions 4" in line
    assert ledger.storm_refusal(past, None, 4, "runs/x") is None and ledger.storm_refusal(past, None, 0, "x") is None
    a_session(tmp_path, "finished", 0, None)  # a finished (or stopped) session ends the row
    assert ledger.fruitless_streak(ledger.sessions(tmp_path), None) == []


def test_a_merge_keeps_every_machines_sessions_once(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    a_session(a, "killed", None, 4)
    a_session(b, "preempted", 75, 4)
    theirs = ledger.ledger_path(b).read_bytes()
    assert ledger.merge(a, theirs) == 2 and ledger.merge(a, theirs) == 0
    assert sorted(s.ending for s in ledger.sessions(a)) == ["killed", "preempted"]


def trainer(data: Path, run: Path, tmp_path: Path, **keys):
    env = offline_env() | {"HF_PRETRAIN_RELEASE": str(tmp_path / "release")}
    if "faults" in keys:
        env["HF_PRETRAIN_FAULTS"] = keys.pop("faults")
    return start_merged(launch_command(**short_run(data, run, **keys)), tmp_path, env)


@pytest.mark.slow
def test_a_fourth_fruitless_start_refuses_with_78_then_a_session_that_saves_ends_the_storm(smoke_data, tmp_path):
    """Two sessions that saved nothing (written by the ledger's writer), then a real one SIGKILLed while held
    before step 2 (its first checkpoint is step 4): the next start refuses in one line naming the count, the
    cost and the key, exit 78, and trains nothing; `status` lists the sessions; with the key raised the run
    trains, and its ledger says where the start-up went and how it ended."""
    run = tmp_path / "run"
    run.mkdir()
    a_session(run, "killed", None, None)
    a_session(run, "preempted", 75, None)
    killed = trainer(smoke_data, run, tmp_path, faults="hold:2")
    out = []
    for line in killed.stdout:  # held before step 2 until killed: step 1 is trained, never saved
        out.append(line)
        if "holding before step 2" in line:
            break
    assert killed.poll() is None, "".join(out)[-3000:]
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=60)

    refused = trainer(smoke_data, run, tmp_path)
    said = communicate_or_diagnose(refused, 300)[0]
    assert refused.returncode == EXIT_CONFIG, said[-3000:]
    lines = [line for line in said.splitlines() if "saved no new checkpoint" in line]
    assert len(lines) == 1 and "Traceback" not in said, said[-3000:]
    assert "the last 3 sessions" in lines[0] and "killed, preempted (exit 75), killed" in lines[0], lines[0]
    assert "$" in lines[0] and "at $2/h" in lines[0] and "--max_fruitless_sessions 4" in lines[0], lines[0]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "refused" and status["exit_code"] == EXIT_CONFIG and not (run / "checkpoints").exists()
    past = ledger.sessions(run)
    assert len(past) == 3 and past[-1].end["estimated"] and past[-1].end["steps_trained"] == 1
    assert past[-1].first_step["step"] == 1 and past[-1].first_step["to_first_step_s"] > 0

    from tests.helpers import cli

    shown = cli("status", str(run)).stdout
    assert "sessions: 3 (3 preempted or killed, 0 failed)" in shown and "estimated by the next session" in shown, shown

    again = trainer(smoke_data, run, tmp_path, max_fruitless_sessions=4)
    said = communicate_or_diagnose(again, 600)[0]
    assert again.returncode == 0, said[-3000:]
    newest = ledger.sessions(run)[-1]
    assert newest.ending == "finished" and newest.end["steps_trained"] == 12 and newest.end["steps_lost"] == 0
    assert set(newest.first_step["went_to"]) >= {"first_step", "checkpoint", "data", "other"}
    assert ledger.fruitless_streak(ledger.sessions(run), 12) == []


def test_the_shipped_engine_tasks_end_on_78():
    """A storm's refusal is 78: SkyPilot's task recovers on 75 and 71 only, and Slurm's script requeues on
    those alone; neither relaunches a refused start."""
    import yaml

    from hf_pretrain.engines.tasks import HERE

    for name in ("1b.yaml", "1b_multinode.yaml"):
        task = yaml.safe_load((Path(HERE) / "skypilot" / name).read_text())
        recovery = task["resources"]["job_recovery"]
        assert recovery["recover_on_exit_codes"] == [75, 71] and recovery["max_restarts_on_errors"] == 0
    sbatch = (Path(HERE) / "slurm" / "1b.sbatch").read_text()
    requeued = [line for line in sbatch.splitlines() if "requeue" in line and "scontrol" in line]
    assert requeued and "78" not in " ".join(requeued), requeued
