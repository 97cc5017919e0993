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


def install_line(script: str) -> str:
    """The one command line of `script` that installs the project."""
    (line,) = [line for line in script_lines(script) if "install" in line and "constraints.txt" in line]
    return " ".join(line.split())


def assert_the_readme_install_through_uv(line: str, python: str) -> None:
    """The README's install (`pip install -c constraints.txt -e .`: the tested pins) with the store's extra, through
    a pinned uv into `python`'s environment (a relaunch's setup, issue 59: docs/benchmarks.md), else pip's own."""
    assert "pip install -c constraints.txt -e ." in README
    readme_args = "-c constraints.txt -e '.[s3]'"
    get_uv, use_uv, fallback = re.fullmatch(r"(.+?) && (.+?) \|\| (.+)", line).groups()
    assert re.fullmatch(r"(\S*|python -m )pip install -q uv==\d+\.\d+\.\d+", get_uv), (
        get_uv
    )  # pinned: the same uv every relaunch
    assert use_uv.endswith(f" pip install --python {python} {readme_args}"), use_uv
    assert re.fullmatch(rf"(\S*|python -m )pip install {re.escape(readme_args)}", fallback), fallback


@pytest.mark.parametrize("path", SKYPILOT, ids=lambda p: p.name)
def test_skypilot_installs_the_readme_way_and_keeps_credentials_out(path):
    task = read_task(path)
    assert_the_readme_install_through_uv(install_line(task["setup"]), "~/hf-pretrain-venv/bin/python")
    assert task["setup"].index("python3 -m venv ~/hf-pretrain-venv") < task["setup"].index("uv==")
    assert task["secrets"] == {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}  # given at launch only
    assert task["envs"]["RUN_URL"] is None and task["envs"]["DATA_URL"] is None  # required at launch


@pytest.mark.parametrize("path", DSTACK, ids=lambda p: p.name)
def test_dstack_installs_the_readme_way_into_the_python_on_the_path(path):
    assert_the_readme_install_through_uv(install_line("\n".join(read_task(path)["commands"])), '"$(command -v python)"')


def stand_in(path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.mark.parametrize(
    "pip_fails_on, uv_fails_on, installs",
    [("nothing", "nothing", ["uv"]), ("uv==", "nothing", ["pip"]), ("nothing", "constraints", ["uv", "pip"])],
    ids=["uv", "no-uv-to-install", "uv-fails"],
)
def test_skypilot_setup_installs_through_uv_and_falls_back_to_pip(tmp_path, pip_fails_on, uv_fails_on, installs):
    """The setup block as a fresh machine runs it (bash, in the clone, an empty HOME), with stand-ins for its
    venv's pip and uv that record what they are asked: the project installed by uv when uv can be had and works,
    else by pip's own README install (a node that cannot reach uv's wheel, or a uv that fails); the block ends 0."""
    import subprocess

    bin_dir, tools = tmp_path / "bin", tmp_path / "tools"
    bin_dir.mkdir()
    tools.mkdir()
    for tool in ("pip", "uv"):  # each fails when its arguments hold $PIP_FAILS_ON / $UV_FAILS_ON
        stand_in(tools / tool, f'#!/bin/bash\necho "{tool} $*" >> "$LOG"\n[[ "$*" != *"${tool.upper()}_FAILS_ON"* ]]\n')
    stand_in(
        bin_dir / "python3", f'#!/bin/bash\n[ "$1 $2" = "-m venv" ] && mkdir -p "$3/bin" && cp {tools}/* "$3/bin/"\n'
    )
    log = tmp_path / "log"
    env = {"HOME": str(tmp_path / "home"), "PATH": f"{bin_dir}:/usr/bin:/bin", "LOG": str(log)}
    env |= {"PIP_FAILS_ON": pip_fails_on, "UV_FAILS_ON": uv_fails_on}
    for path in SKYPILOT:
        log.unlink(missing_ok=True)
        ran = subprocess.run(
            ["bash", "-c", read_task(path)["setup"]], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert ran.returncode == 0, (path.name, ran.stderr)
        calls = log.read_text().splitlines()
        assert calls[0].startswith("pip install -q uv=="), (path.name, calls)
        project = [call.split()[0] for call in calls if call.endswith(" -c constraints.txt -e .[s3]")]
        assert project == installs, (path.name, calls)


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
