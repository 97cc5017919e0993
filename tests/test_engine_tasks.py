"""The shipped engine tasks (hf_pretrain/engines/), read as plain YAML and shell: the README's training
command inside each, the recovery rules of the exit-code contract, no credential in any file.
SkyPilot's own parser reads them in `make sky_test` (tests/test_skypilot_tasks.py)."""

from __future__ import annotations

import re

import pytest

from hf_pretrain.engines.tasks import (
    DSTACK,
    SKYPILOT,
    SLURM,
    command_words,
    max_restarts_on_errors,
    read_task,
    recover_on_exit_codes,
    script_lines,
)
from hf_pretrain.exit_codes import CONTRACT, EXIT_CONFIG, EXIT_FAULTY_HOST, EXIT_LOCKED, EXIT_OK, EXIT_PREEMPTED
from tests.helpers import ROOT

README = (ROOT / "README.md").read_text()


def readme_training_command() -> list[str]:
    """The README's one-GPU training command, `accelerate launch ... hf_pretrain/train.py --recipe 1b`."""
    line = next(line for line in README.splitlines() if line.startswith("accelerate launch --config_file"))
    return line.split(" #")[0].split()


def test_the_readme_command_is_the_one_gpu_launch():
    assert readme_training_command()[2:] == [
        "--config_file",
        "accelerate_configs/single_gpu.yaml",
        "hf_pretrain/train.py",
        "--recipe",
        "1b",
    ]


def one_gpu_tasks() -> list[tuple[str, str, dict]]:
    """(name, script, its environment's defaults) of each one-GPU task."""
    tasks = []
    for path in SKYPILOT:
        task = read_task(path)
        if task.get("num_nodes", 1) == 1:
            tasks.append((path.name, task["run"], task["envs"]))
    for path in DSTACK:
        task = read_task(path)
        env = dict(entry.split("=", 1) for entry in task["env"] if "=" in entry)
        tasks.append((path.name, "\n".join(task["commands"]), env))
    for path in SLURM:
        text = path.read_text()
        env = dict(re.findall(r"^(\w+)=\$\{\w+:-([^}]*)\}$", text, re.M))
        tasks.append((path.name, text, env))
    return tasks


@pytest.mark.parametrize("name, script, env", one_gpu_tasks(), ids=[name for name, _, _ in one_gpu_tasks()])
def test_each_task_trains_with_the_readme_command_through_the_launcher(name, script, env):
    words = command_words(script, "hf-pretrain launch", env)
    readme = readme_training_command()
    assert words[2 : len(readme)] == readme[2:], (name, words)
    assert words[words.index("--output_dir") + 1] == "$RUN_URL" and words[words.index("--data_dir") + 1] == "$DATA_URL"
    check = command_words(script, "hf-pretrain check", env)  # the pod check gates the training
    assert check[2:4] == ["--recipe", "1b"] and script.index("hf-pretrain check") < script.index("hf-pretrain launch")


@pytest.mark.parametrize("path", SKYPILOT, ids=lambda p: p.name)
def test_skypilot_relaunches_on_go_on_elsewhere_and_never_on_held_or_refused(path):
    task = read_task(path)
    codes = recover_on_exit_codes(task)
    assert codes == {EXIT_PREEMPTED, EXIT_FAULTY_HOST} and codes <= set(CONTRACT)
    assert not codes & {EXIT_OK, EXIT_LOCKED, EXIT_CONFIG}
    assert max_restarts_on_errors(task) == 0  # every other failure needs a person
    options = task["resources"].get("any_of") or task["resources"]["ordered"]  # ordered: the plan's cheapest first
    spots = {option.get("use_spot") for option in options}
    assert spots == {True, False}  # spot, and on-demand as the fallback
    assert "|| exit $?" in task["run"]  # a check that fails ends the run block with the check's own code


@pytest.mark.parametrize("path", SKYPILOT, ids=lambda p: p.name)
def test_skypilot_installs_the_readme_way_and_keeps_credentials_out(path):
    task = read_task(path)
    assert "pip install -c constraints.txt -e" in task["setup"] and "pip install -c constraints.txt -e ." in README
    assert task["secrets"] == {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}  # given at launch only
    assert task["envs"]["RUN_URL"] is None and task["envs"]["DATA_URL"] is None  # required at launch


def test_the_multinode_task_builds_each_machines_launcher_from_skypilots_variables():
    task = read_task(next(p for p in SKYPILOT if "multinode" in p.name))
    words = command_words(task["run"], "hf-pretrain launch")
    flags = dict(zip(words[2::2], words[3::2], strict=False))
    assert flags["--num_machines"] == "$SKYPILOT_NUM_NODES" and flags["--machine_rank"] == "$SKYPILOT_NODE_RANK"
    assert flags["--num_processes"] == "$((SKYPILOT_NUM_NODES*SKYPILOT_NUM_GPUS_PER_NODE))"
    assert 'MAIN_PROCESS_IP=$(echo "$SKYPILOT_NODE_IPS" | head -n 1)' in script_lines(task["run"])
    assert flags["--main_process_ip"] == "$MAIN_PROCESS_IP"


def test_slurm_requeues_on_the_go_on_codes_only():
    text = SLURM[0].read_text()
    assert "#SBATCH --requeue" in text
    requeue = next(line for line in script_lines(text) if "scontrol requeue" in line)
    assert re.findall(r"\d+", requeue.split(")")[0]) == [str(EXIT_PREEMPTED), str(EXIT_FAULTY_HOST)]
    assert script_lines(text)[-1] == 'exit "$code"'


def test_no_task_file_holds_a_credential():
    for path in SKYPILOT + DSTACK + SLURM:
        text = path.read_text()
        assert not re.search(r"(SECRET|TOKEN|KEY)\w*\s*[:=]\s*['\"]?[A-Za-z0-9/+]{16,}", text), path
