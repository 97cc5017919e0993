"""SkyPilot's own parser reads every shipped SkyPilot task (`make sky_test`: SkyPilot is large, ~460 MB,
so it lives in a virtual environment of its own, .venv-sky, like Liger's extra; skipped elsewhere). The
values launch takes with `--env` and `--secret` are given as `sky jobs launch` gives them, offline."""

from __future__ import annotations

import pytest

from hf_pretrain.engines.tasks import SKYPILOT, read_task
from hf_pretrain.exit_codes import EXIT_FAULTY_HOST, EXIT_PREEMPTED

sky = pytest.importorskip("sky", reason="SkyPilot's parser: `make sky_test` installs it in .venv-sky")

ENVS = [("RUN_URL", "s3://bucket/runs/1b"), ("DATA_URL", "s3://bucket/data/1b")]
SECRETS = [("AWS_ACCESS_KEY_ID", "AKIASTANDIN"), ("AWS_SECRET_ACCESS_KEY", "stand-in")]


@pytest.mark.parametrize("path", SKYPILOT, ids=lambda p: p.name)
def test_skypilot_reads_the_task_as_launch_would(path):
    task = sky.Task.from_yaml_config(read_task(path), env_overrides=ENVS, secrets_overrides=SECRETS)
    options = list(task.resources)
    assert {r.use_spot for r in options} == {True, False}, options  # spot, and on-demand as the fallback
    for resources in options:
        assert resources.job_recovery["recover_on_exit_codes"] == [EXIT_PREEMPTED, EXIT_FAULTY_HOST]
        assert resources.job_recovery["max_restarts_on_errors"] == 0
    if "multinode" in path.name:
        assert all(list(r.accelerators) == ["H100"] for r in options)
    else:  # the plan's cheapest offers, in its order (a list: SkyPilot tries them in turn), each on its cloud
        assert isinstance(task.resources, list) and 1 < len(options) <= 8, task.resources
        planned = [c for c in read_task(path)["resources"]["ordered"]]
        assert [str(r.cloud).lower() for r in options] == [c["cloud"] for c in planned]
        assert [r.accelerators for r in options] == [
            {c["accelerators"].split(":")[0]: int(c["accelerators"].split(":")[1])} for c in planned
        ]
        assert all(r.disk_size == 256 for r in options)
    assert task.envs["RUN_URL"] == "s3://bucket/runs/1b" and "hf-pretrain launch" in task.run
    multinode = "multinode" in path.name
    assert task.num_nodes == (2 if multinode else 1)
    assert set(task.secrets) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


@pytest.mark.parametrize("path", SKYPILOT, ids=lambda p: p.name)
def test_skypilot_itself_requires_the_run_and_data_urls(path):
    with pytest.raises(ValueError, match="RUN_URL"):
        sky.Task.from_yaml(str(path))


def test_skypilot_reads_a_task_plan_writes_for_another_recipe(tmp_path):
    """`plan --skypilot_task` writes the shipped task renting the plan's offers (engines/skypilot_task.py): what it
    writes for another recipe, on clouds and cards of the catalog's spellings, is a task SkyPilot launches."""
    from hf_pretrain.engines.skypilot_task import Candidate, planned_task, write_task

    candidates = [
        Candidate("nebius", "H200", 1, True, 1.45, "H200: spot"),
        Candidate("lambda", "A100-80GB", 1, False, 1.79),
        Candidate("primeintellect", "RTX6000Ada", 1, True, 0.23),
    ]
    path = tmp_path / "my run.yaml"
    write_task(path, planned_task("recipes/my run.yaml", candidates, "a test catalog", "2026-12-04"))
    task = sky.Task.from_yaml_config(read_task(path), env_overrides=ENVS, secrets_overrides=SECRETS)
    assert task.name == "hf-pretrain-my-run" and task.envs["RECIPE"] == "recipes/my run.yaml"
    assert [(str(r.cloud).lower(), r.accelerators, r.use_spot) for r in task.resources] == [
        ("nebius", {"H200": 1}, True),
        ("lambda", {"A100-80GB": 1}, False),
        ("primeintellect", {"RTX6000Ada": 1}, True),
    ]
    assert (
        task.envs["PLANNED_PRICES"]
        == "nebius:H200:spot=1.45 lambda:A100-80GB:on-demand=1.79 primeintellect:RTX6000Ada:spot=0.23"
    )
