"""`hf-pretrain --help`, `stop`, `plan`, `report` and `train --help` answer without importing torch (seconds
of CPU), and the parsers of stop, plan and report without transformers: checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import OUTSIDE_CHECKOUT, offline_env

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
    ["hf_pretrain.cli", "hf_pretrain.training.stop_request", "hf_pretrain.economics.plan", "hf_pretrain.report"],
)
def test_the_light_commands_import_no_heavy_library(module):
    assert heavy_imports(f"import {module}") == []


def help_of(argv: list[str]) -> str:
    return f"from hf_pretrain import cli\ntry:\n    cli.main({argv!r})\nexcept SystemExit:\n    pass"


@pytest.mark.parametrize("argv", [["--help"], ["stop", "--help"], ["plan", "--help"], ["report", "--help"]])
def test_help_of_the_light_commands_imports_no_heavy_library(argv):
    assert heavy_imports(help_of(argv)) == []


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
