"""Shared pieces of the end-to-end tests: the short run's overrides and a launcher."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.stacks import communicate_or_diagnose
from tests.warm_start import WarmStarter

ROOT = Path(__file__).resolve().parent.parent
# Where the tests' commands run: an empty folder outside the checkout, so a recipe's relative defaults
# (data/smoke, runs/smoke) name nothing there, whatever `make smoke` left in the checkout.
OUTSIDE_CHECKOUT = Path(tempfile.mkdtemp(prefix="hf_pretrain_cwd_"))

# The smoke model with a 12-step schedule: fast enough to run several times in CI. It keeps the cosine
# its golden curve was recorded with (the smoke recipe itself is wsd; tests/test_run_life.py runs that).
SHORT_RUN = {
    "max_steps": 12,
    "warmup_steps": 2,
    "lr_schedule": "cosine",
    "global_batch_tokens": 2048,
    "micro_batch_size": 8,
    "save_interval": 4,
    "eval_interval": 6,
    "eval_tokens": 2048,
    "log_interval": 1,
    "sample_max_new_tokens": 8,
    "price_per_hour": 2.0,
    "report_to": "tensorboard",
    "phases": {"warmup": 2, "first-half": 6, "second-half": 12},
}


def short_run(data_dir, output_dir, **overrides) -> dict:
    """The keys of a SHORT_RUN of the data in `data_dir` into `output_dir`, `overrides` on top."""
    return {**SHORT_RUN, "data_dir": data_dir, "output_dir": output_dir, **overrides}


def offline_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


TRAIN_SCRIPT = ROOT / "hf_pretrain" / "train.py"
# The one-process runs of this test worker start warm (tests/warm_start.py): ~8 s of imports saved each.
WARM = WarmStarter(offline_env)


def launch_command(
    *launcher_flags: str,
    processes: int = 1,
    config: Path | None = None,
    script: Path = TRAIN_SCRIPT,
    recipe: str = "smoke",
    through_launcher: bool = False,
    **keys,
) -> list[str]:
    """`python -m accelerate.commands.launch --config_file CONFIG [launcher flags] SCRIPT --recipe RECIPE
    --key value ...`: the one hand-built launch of the tests (`launch_training` runs it). CONFIG is
    accelerate_configs/cpu.yaml, or cpu_2proc.yaml for two processes, unless given.

    A one-process run with no launcher flag or config of its own is `python SCRIPT ...`, the trainer as the
    top process (a way users run it too, docs/survival.md), unless `through_launcher`: the launcher would
    only import torch a second time, about 3 s of a core for each of the suite's hundreds of one-process
    runs. What the launcher adds is tested where it is the subject: every two-process run, the launcher's
    own tests (tests/test_launch.py, tests/test_reliability_runs.py) and the smoke recipe as `make smoke`
    runs it."""
    if processes == 1 and not launcher_flags and config is None and not through_launcher:
        command = [sys.executable, str(script), "--recipe", recipe]
    else:
        config = config or ROOT / "accelerate_configs" / ("cpu_2proc.yaml" if processes == 2 else "cpu.yaml")
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), *launcher_flags]
        if processes > 1 and "--main_process_port" not in launcher_flags:
            # a port of its own: the config's fixed one (29555) was shared by two-process runs of other test
            # workers at the same time, whose processes then met in one rendezvous and hung at the end
            command += ["--main_process_port", str(free_port())]
        command += [str(script), "--recipe", recipe]
    for key, value in keys.items():
        command += [f"--{key}", str(value)]
    return command


def free_port() -> int:
    """A TCP port nothing listens on now, for a launch's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_training(
    data_dir: Path,
    run_dir: Path,
    processes: int = 1,
    check: bool = True,
    short: bool = True,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    recipe: str = "smoke",
    cwd: Path = OUTSIDE_CHECKOUT,
    through_launcher: bool = False,
    **overrides,
) -> str:
    """`hf_pretrain/train.py --recipe RECIPE` in `cwd`, through `accelerate launch` for two processes or
    `through_launcher` (`launch_command`), with SHORT_RUN unless `short=False` and `env` on top of the offline
    environment; returns stdout + stderr. Past `timeout` seconds the launch is killed and
    `subprocess.TimeoutExpired` fails the test."""
    args = (
        short_run(data_dir, run_dir, **overrides)
        if short
        else {"data_dir": data_dir, "output_dir": run_dir, **overrides}
    )
    cmd = launch_command(processes=processes, recipe=recipe, through_launcher=through_launcher, **args)
    result = run_captured(cmd, cwd, {**offline_env(), **(env or {})}, timeout)
    log = result.stdout + result.stderr
    if check and result.returncode != 0:
        raise AssertionError(f"training failed ({result.returncode}):\n{log[-4000:]}")
    return log


def run_captured(command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True, timeout=timeout)` in `cwd` with `env`: started warm
    when `command` is `python SCRIPT ...` or `python -m hf_pretrain.X ...` and its environment allows
    (tests/warm_start.py), cold otherwise."""
    ran = WARM.run(command, cwd, env, timeout)
    if ran is None:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = communicate_or_diagnose(process, timeout)
        return subprocess.CompletedProcess(command, process.returncode, out, err)
    return subprocess.CompletedProcess(command, *ran)


def cli(
    *args: str, cwd: Path = OUTSIDE_CHECKOUT, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """`hf-pretrain ARGS` as the tests run it, `python -m hf_pretrain.cli ARGS` in `cwd` with `env` (the offline
    environment unless given), its output captured (`run_captured`: started warm where it can)."""
    return run_captured([sys.executable, "-m", "hf_pretrain.cli", *args], cwd, env or offline_env(), timeout)


def start_merged(command: list[str], cwd: Path, env: dict[str, str]):
    """`subprocess.Popen(command, stdout=PIPE, stderr=STDOUT, text=True)` in `cwd` with `env`: started warm when
    `command` is `python SCRIPT ...` or `python -m hf_pretrain.X ...` and its environment allows
    (tests/warm_start.py), cold otherwise."""
    started = WARM.popen(command, cwd, env, merge_stderr=True)
    if started is None:
        started = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    return started


def recipe_data(recipe, *, rank: int, world_size: int, grad_accum: int, pin_memory: bool = False):
    """The `TrainData` of a whole recipe, its data placed as training's door places it (`Where.of`)."""
    from hf_pretrain.data.loader import sections_data
    from hf_pretrain.data.prepared import prepare_hint
    from hf_pretrain.store.location import Where

    data = Where.of(recipe).data
    return sections_data(
        recipe.data,
        data,
        recipe.train,
        rank=rank,
        world_size=world_size,
        grad_accum=grad_accum,
        fix=prepare_hint(recipe),
        pin_memory=pin_memory,
    )


def build_train_loader(
    recipe,
    rank: int,
    world_size: int,
    grad_accum: int,
    start_step: int,
    pin_memory: bool = False,
    origin: tuple[int, int] = (0, 0),
    decay_position: int | None = None,
):
    """A whole recipe's training batches for `rank`: see `TrainData.loader`."""
    data = recipe_data(recipe, rank=rank, world_size=world_size, grad_accum=grad_accum, pin_memory=pin_memory)
    return data.loader(start_step, origin, decay_position)


def build_val_loader(recipe, rank: int, world_size: int):
    """A whole recipe's validation batches for `rank`: see `TrainData.val_loader`."""
    return recipe_data(recipe, rank=rank, world_size=world_size, grad_accum=1).val_loader(recipe.evaluation.eval_tokens)


def data_of(recipe):
    """Where `recipe`'s data lives, as a command's door decides it."""
    from hf_pretrain.store.location import Where

    return Where.of(recipe).data


def placed(recipe) -> tuple:
    """`(recipe, where its data lives)`: the arguments of `check_prepared_data`."""
    return recipe, data_of(recipe)


def bench_children_started_warm(monkeypatch) -> None:
    """For one test, the bench's children (`python -m hf_pretrain.bench --worker_result ...`, started by
    `bench/variants.run_in_child`) forked warm as the trainer runs are: ~8 s of a core saved each. Not where a
    test measures a child's memory: a forked child's RSS counts the warm process's imports."""
    from types import SimpleNamespace

    from hf_pretrain.bench import variants

    def run(command: list[str], stdout, stderr, env: dict[str, str]) -> subprocess.CompletedProcess:
        # run_in_child puts the folder holding hf_pretrain/ first on PYTHONPATH; the warm process has it there too,
        # spelled as offline_env spells it (a different spelling of the same path would start the child cold)
        assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)
        done = run_captured(command, Path.cwd(), {**env, "PYTHONPATH": offline_env()["PYTHONPATH"]}, timeout=600)
        stdout.write(done.stdout + done.stderr)  # the child's log, as the cold child writes it (stderr to stdout)
        return done

    monkeypatch.setattr(variants, "subprocess", SimpleNamespace(run=run, STDOUT=subprocess.STDOUT))


class StandInTokenizer:
    """What a checkpoint save asks of a tokenizer, and no more."""

    def save_pretrained(self, folder) -> None:
        (Path(folder) / "tokenizer.json").write_text("{}")


def save_with_stand_ins(accelerator, output_dir: Path, step: int, **options):
    """`save_checkpoint` of `accelerator`'s state at `step`, with a default config and a stand-in tokenizer."""
    from transformers import LlamaConfig

    from hf_pretrain.checkpoints.saving import save_checkpoint

    return save_checkpoint(
        accelerator,
        output_dir,
        {"step": step},
        keep=3,
        model_config=LlamaConfig(),
        tokenizer=StandInTokenizer(),
        **options,
    )


class FakeLog:
    """A RunLogger stand-in for the guards: what they said and recorded, kept."""

    def __init__(self):
        self.lines, self.records = [], []

    def say(self, text, every_process=False):
        self.lines.append(text)

    def record(self, record):
        self.records.append(record)


def guards_of(recipe, accelerator, log):
    """The loop's guards of `recipe` (training/loop.py builds them the same way)."""
    from hf_pretrain.training.guards import Guards

    return Guards(
        recipe.stopping, recipe.reporting, output_dir=recipe.train.output_dir, accelerator=accelerator, log=log
    )


def on_cpu(recipe):
    """(`recipe`, its run profile on a CPU): what a doctor's row is handed at the door (preflight/gpu.py)."""
    from hf_pretrain.machine.run_profile import THE_CPU, run_profile

    return recipe, run_profile(recipe.step_as_written, THE_CPU)


def state_at_start(recipe, data=None):
    """`recipe`'s run at step 0, as training's `resumed_state` starts it (`data`: its data folder unless given)."""
    from hf_pretrain.config import math_keys
    from hf_pretrain.optim.build import Schedule
    from hf_pretrain.training.state import TrainState

    return TrainState.at_start(
        "cpu",
        fingerprint=recipe.fingerprint(),
        math=math_keys(recipe),
        schedule=Schedule(recipe.optim, max_steps=recipe.train.max_steps),
        samples_per_step=recipe.train.global_batch_tokens // recipe.data.seq_len,
        data=data or recipe.data.data_dir,
    )


def card_sections(recipe) -> dict:
    """What a GPU's row of `plan` reads of `recipe` (economics/planning/gpu_ranking.gpu_row), by keyword."""
    return {"model": recipe.model, "data": recipe.data, "train": recipe.train, "written": recipe.step_as_written}


def memory_row(recipe, profile, device_memory_bytes=None):
    """The doctor's memory row for `recipe` run as `profile` says (preflight/gpu.check_memory)."""
    from hf_pretrain.preflight.gpu import check_memory

    return check_memory(profile, device_memory_bytes, **card_sections(recipe), recipe_name=recipe.name)


def estimate_memory(recipe, tokenizer_size: int, on, world_size: int = 1):
    """A what-if: the peak memory of the step `recipe` would run on `on` (a card of the table, or a `Machine`)
    with `world_size` processes, as the doctor's memory row models a card it is asked of."""
    from hf_pretrain.economics.memory import memory_of
    from hf_pretrain.machine.what_if import profile_on

    step = profile_on(recipe.step_as_written, on, world_size).step
    batch = recipe.train.global_batch_tokens
    return memory_of(recipe.model, step, tokenizer_size, seq_len=recipe.data.seq_len, global_batch_tokens=batch)


def profile_here(recipe, world_size: int = 1):
    """`recipe`'s complete run profile on this machine, as a command's door builds it (training, the doctor)."""
    from hf_pretrain.economics.resolved_run import complete_profile
    from hf_pretrain.machine.run_profile import this_machine

    return complete_profile(
        recipe.step_as_written, this_machine(), world_size, model=recipe.model, seq_len=recipe.data.seq_len
    )


def resolved_here(recipe, world_size: int = 1, where=None):
    """The door's answer for `recipe` on this machine (`where`: the run and its data, else as the door places
    them), as training's setup and the doctor build it."""
    from hf_pretrain.economics.resolved_run import ResolvedRun
    from hf_pretrain.machine.run_profile import this_machine
    from hf_pretrain.store.location import Where

    return ResolvedRun.at_door(recipe, this_machine(), where or Where.of(recipe), world_size)


def profile_on_cpu(recipe):
    """`recipe`'s run profile on a CPU: what a doctor's row about the machine alone is handed."""
    return on_cpu(recipe)[1]


def section_on_cpu(recipe, section: str):
    """(`recipe`'s `section`, its run profile on a CPU): what a doctor's row that checks one section
    against the machine is handed (`check_cuda(recipe.compute, profile)`)."""
    return getattr(recipe, section), profile_on_cpu(recipe)


def prepared_row(recipe):
    """The doctor's `data` row of `recipe`, handed its sections and the data check as `run_checks` hands them."""
    from hf_pretrain.data.prepared import check_prepared_data
    from hf_pretrain.preflight.data import check_prepared

    return check_prepared(recipe.data, recipe.evaluation, lambda: check_prepared_data(recipe, data_of(recipe)))


def data_budget_row(recipe):
    """The doctor's `data budget` row of `recipe`, handed as `run_checks` hands it."""
    from hf_pretrain.data.prepared import check_prepared_data
    from hf_pretrain.preflight.data import check_data_budget

    return check_data_budget(
        recipe.train, recipe.data, recipe.optim, lambda: check_prepared_data(recipe, data_of(recipe))
    )


def pip_fix_works_here(command: str, cwd: Path, env: dict[str, str]) -> None:
    """A printed `pip install ...` fix as a user pastes it in `cwd` with `env` (issue 57: the index's
    `pip install 'hf-pretrain[s3]'` fails in a clone): its pip runs there and is the pip of the Python that runs
    the suite (not another one on the PATH); in a clone its constraints file exists and its `-e` target is a
    project that declares the extra. Nothing is installed: the tests have no network."""
    import re
    import shlex
    import shutil
    import tomllib

    argv = shlex.split(command)
    install = argv.index("install")
    pip = argv[:install]
    found = (cwd / pip[0]) if "/" in pip[0] else shutil.which(pip[0], path=env.get("PATH"))
    assert found and os.access(found, os.X_OK), f"`{pip[0]}` is no command in {cwd}"
    ran = subprocess.run([*pip, "--version"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and str(Path(sys.prefix)) in ran.stdout, f"`{' '.join(pip)}`: {ran.stdout}{ran.stderr}"
    rest = argv[install + 1 :]
    if "-e" not in rest:
        assert len(rest) == 1 and re.fullmatch(r"hf-pretrain\[\w+\]", rest[0]), command
        return
    assert (cwd / rest[rest.index("-c") + 1]).is_file(), f"{command}: no constraints file there"
    folder, extra = re.fullmatch(r"(.*)\[(\w+)\]", rest[rest.index("-e") + 1]).groups()
    project = tomllib.loads((cwd / folder / "pyproject.toml").read_text())["project"]
    assert project["name"] == "hf-pretrain" and extra in project["optional-dependencies"], command


# What-ifs on a named card of the table (machine/what_if.py), as `plan` asks them: the project's H100 SXM. The
# package assumes no card; a test that models one names it.
CARD = "H100 SXM"


def h100_workload(recipe, *, tokenizer_size=None, micro_batch_size=None, world_size: int = 1, checkpointed_layers=None):
    """The performance model's workload of `recipe` on one of `world_size` H100s (economics/workload.py)."""
    from hf_pretrain.economics.workload import run_workload
    from hf_pretrain.machine.what_if import profile_on

    step = profile_on(recipe.step_as_written, CARD, world_size, micro_batch_size, checkpointed_layers).step
    return run_workload(recipe.model, recipe.data, step, recipe.train.global_batch_tokens, tokenizer_size)


def h100_configuration(recipe, world_size: int = 1):
    """What a measurement of `recipe` on `world_size` H100s is keyed by (economics/measurements.py)."""
    from hf_pretrain.economics.measurements import configuration
    from hf_pretrain.machine.what_if import profile_on

    step = profile_on(recipe.step_as_written, CARD, world_size).step
    return configuration(recipe.model, recipe.data, step, global_batch_tokens=recipe.train.global_batch_tokens)
