"""A run's side jobs (publish/side_jobs.py) beside a real training run: uploads to a slow stand-in
Hub (tests/hub_standin.py) go on while training does, and the run waits for them at its end."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hf_pretrain.config import build_recipe
from hf_pretrain.publish.side_jobs import SideJobs
from hf_pretrain.run_folder.run_dir import read_jsonl
from tests.helpers import ROOT, launch_training
from tests.hub_standin import HubStandIn

pytestmark = pytest.mark.slow
TOKEN = "hf_StandInToken0123456789abcdefXYZ"
COMMIT_SECONDS = 5.0  # several training steps on a CPU
ARC = ROOT.parent / "shared" / "data" / "arc"


def last_train_step(run_dir: Path) -> int:
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    return records[-1]["step"] if records else 0


def test_uploads_go_on_beside_training_and_the_run_waits_for_them(smoke_data, tmp_path):
    run_dir = tmp_path / "run"
    with HubStandIn(TOKEN) as hub:
        hub.state.commit_delay = COMMIT_SECONDS
        hub.state.watch = lambda: last_train_step(run_dir)  # the training's progress as each commit arrives/ends
        env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN, "HF_HOME": str(tmp_path / "hf_home")}
        log = launch_training(smoke_data, run_dir, env=env, push_to_hub="me/run", push_checkpoints=True)

    # while the first checkpoint's upload was pending, training went on logging steps
    pending = {revision: (arrival, answer) for revision, arrival, answer in hub.state.watched}
    print(f"\nlast logged step as each commit arrived and was answered: {pending}")
    arrival, answer = pending["step-4"]
    assert answer > arrival >= 4, f"no step logged during the step-4 upload: {hub.state.watched}"
    # at the end the run waited for what was still queued, said so, and everything arrived
    assert "waiting for" in log and "the push of final/" in log, log[-3000:]
    branches = hub.state.repos["me/run"].branches
    assert {"main", "step-4", "step-8", "step-12"} <= set(branches)
    assert b"step 8" in branches["step-8"].files["README.md"]
    pushed = hub.files("me/run")
    assert {p.name: p.read_bytes() for p in (run_dir / "final").iterdir()}.items() <= pushed.items()
    assert "pushed final/ to" in log and TOKEN not in log
    assert hub.state.unexpected == []
    assert not list((run_dir / "checkpoints").glob("*.pin"))  # pinned copies removed once pushed


@pytest.mark.skipif(not ARC.is_dir(), reason="../shared/data/arc is absent: the local ARC task needs its JSONL files")
def test_benchmarks_run_in_their_own_process_and_a_failure_only_warns(reference_run, tmp_path):
    run_dir = tmp_path / "run"
    checkpoint = run_dir / "checkpoints" / "step_00000012"
    shutil.copytree(reference_run[0] / "checkpoints" / "step_00000012", checkpoint)
    said: list[str] = []
    scoring = {"lm_eval_tasks": ["arc_easy_local"], "lm_eval_limit": 5, "lm_eval_data_dir": str(ARC)}
    recipe = build_recipe({}, scoring)
    jobs = SideJobs(recipe.publish, recipe.evaluation, log=said.append)
    jobs.on_checkpoint_saved(checkpoint, 12)
    jobs.wait()
    assert said[-1].startswith("step 12: benchmarks {'arc_easy_local': {'acc':"), said
    assert [(r["step"], r["limit"]) for r in read_jsonl(run_dir / "benchmarks.jsonl")] == [(12, 5)]

    broken_recipe = build_recipe({}, {**scoring, "lm_eval_tasks": ["no_such_task"]})
    broken = SideJobs(broken_recipe.publish, broken_recipe.evaluation, log=said.append)
    broken.on_checkpoint_saved(checkpoint, 12)
    broken.wait()
    assert said[-1].startswith("warning: step 12 benchmarks failed") and "no_such_task" in said[-1], said
    assert len(read_jsonl(run_dir / "benchmarks.jsonl")) == 1
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["step_00000012"]  # no pinned copy left
