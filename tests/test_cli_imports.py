"""`hf-pretrain --help` and every command's `--help` answer without importing torch (seconds of CPU, a minute
on a loaded machine), the parsers of stop, plan and report without transformers; `eval` and `demo` without
their extras say in one line which pip command installs them: checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hf_pretrain.cli import COMMANDS
from hf_pretrain.exit_codes import EXIT_CONFIG
from tests.helpers import OUTSIDE_CHECKOUT, offline_env, pip_fix_works_here

HEAVY = ("torch", "transformers", "accelerate", "datasets", "datatrove", "safetensors")


def heavy_imports(code: str) -> list[str]:
    """The heavy libraries a fresh interpreter holds after running `code`."""
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    run = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=OUTSIDE_CHECKOUT,
        env=offline_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "module",
    [
        "hf_pretrain.cli",
        "hf_pretrain.run_commands.stop_command",
        "hf_pretrain.economics.planning",
        "hf_pretrain.run_commands.report",
    ],
)
def test_the_light_commands_import_no_heavy_library(module):
    assert heavy_imports(f"import {module}") == []


def help_of(argv: list[str]) -> str:
    return f"from hf_pretrain import cli\ntry:\n    cli.main({argv!r})\nexcept SystemExit:\n    pass"


@pytest.mark.parametrize("argv", [["--help"], ["stop", "--help"], ["plan", "--help"], ["report", "--help"]])
def test_help_of_the_light_commands_imports_no_heavy_library(argv):
    assert heavy_imports(help_of(argv)) == []


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_of_every_command_imports_no_torch(command):
    """Issue 38: doctor, eval, export, bench, demo, prepare and gguf imported torch for `--help` (up to 48 s)."""
    assert "torch" not in heavy_imports(help_of([command, "--help"]))


# A fresh interpreter in which these modules cannot be imported, as in an install without the extra.
BLOCK = """
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Absent())
from hf_pretrain import cli
sys.exit(cli.main({argv!r}))
"""


def run_without(blocked: set[str], argv: list[str]) -> subprocess.CompletedProcess:
    code = BLOCK.format(blocked=blocked, argv=argv)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=OUTSIDE_CHECKOUT,
        env=offline_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.parametrize(
    ("extra", "module", "argv"),
    [
        ("demo", "gradio", ["demo", "--model", "runs/none"]),
        ("eval", "lm_eval", ["eval", "--model", "exports/none", "--tasks", "arc_easy"]),
    ],
)
def test_a_command_without_its_extra_names_the_pip_command_in_one_line(extra, module, argv):
    run = run_without({module}, argv)
    assert run.returncode != 0
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    errors = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, run.stderr
    assert f"[{extra}]'" in errors[0] and module in errors[0], errors[0]
    pip_fix_works_here(errors[0].rsplit("): ", 1)[1], OUTSIDE_CHECKOUT, offline_env())  # as pasted where it ran
    assert "loading" in run.stdout  # what it was doing before the slow part


def test_a_store_url_without_its_extra_names_the_install_that_works_here():
    """Issue 57: a run URL without s3fs printed `pip install 'hf-pretrain[s3]'`, which fails in a clone."""
    run = run_without({"s3fs"}, ["status", "s3://bucket/runs/x"])
    assert run.returncode == EXIT_CONFIG and "Traceback" not in run.stderr, run.stderr[-2000:]
    errors = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "s3fs" in errors[0] and "[s3]'" in errors[0], run.stderr
    pip_fix_works_here(errors[0].split("package: ", 1)[1], OUTSIDE_CHECKOUT, offline_env())


@pytest.mark.parametrize(("command", "module"), [("demo", "gradio"), ("eval", "lm_eval")])
def test_help_answers_without_the_extra(command, module):
    run = run_without({module}, [command, "--help"])
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"hf-pretrain {command}" in run.stdout


def test_stop_plan_and_a_refused_report_run_without_torch(tmp_path):
    code = "\n".join(
        [
            help_of(["stop", str(tmp_path)]),  # not a run folder: said, exit 2
            help_of(["plan", "--params", "1e9", "--gpu", "H100"]),
            help_of(["report", str(tmp_path / "none")]),
        ]
    )
    assert heavy_imports(code) == []


def test_train_help_reads_the_recipe_keys_without_torch():
    # HfArgumentParser, which builds the recipe's flags, comes with transformers; torch is left for training.
    assert heavy_imports(help_of(["train", "--help"])) == ["transformers"]


def test_the_checkpoint_layout_names_accelerates_rng_file_as_accelerate_does():
    from accelerate.utils import RNG_STATE_NAME

    from hf_pretrain.checkpoints import layout

    assert layout.RNG_STATE_NAME == RNG_STATE_NAME
