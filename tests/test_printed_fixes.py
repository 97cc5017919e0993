"""Every fix the data checks print works when pasted: the `prepare` command they name carries the
command line's data settings (`--data_dir`, `--sources`, `--vocab_size` ...) and, run as printed,
makes the data the check then accepts."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hf_pretrain.config import parse_recipe_args
from hf_pretrain.config.recipe_command import recipe_command
from hf_pretrain.data.prepare_run import prepare
from hf_pretrain.data.prepared import PREPARE_KEYS
from tests.helpers import ROOT, cli, prepared_row
from tests.test_prepare import SETTINGS, corpus  # noqa: F401  (a fixture)


def command_line(data_dir: Path, sources: list[dict], recipe: str = "smoke") -> list[str]:
    args = ["--recipe", recipe, "--data_dir", str(data_dir), "--sources", json.dumps(sources)]
    for key, value in SETTINGS.items():
        args += [f"--{key}", str(value)]
    return args


def decay_sources(root: Path) -> list[dict]:
    """A main source and a decay-only one (drawn from the decay on)."""
    return [
        {"kind": "files", "paths": [str(root / "*.jsonl")], "weight": 1.0},
        {"kind": "files", "paths": [str(root / "notes.txt")], "weight": 0.0, "decay_weight": 1.0},
    ]


def paste(fix: str) -> subprocess.CompletedProcess:
    """Run the command quoted in `fix` as a shell would, `hf-pretrain` being this checkout's."""
    commands = re.findall(r"`(hf-pretrain prepare [^`]*)`", fix)
    assert len(commands) == 1, fix
    words = shlex.split(commands[0])
    return cli(*words[1:])


@pytest.mark.slow
def test_the_fix_for_unprepared_data_with_a_decay_source_prepares_it_when_pasted(corpus, tmp_path) -> None:  # noqa: F811
    recipe, _ = parse_recipe_args(command_line(tmp_path / "data", decay_sources(corpus)), prog="test", description="")
    result = prepared_row(recipe)
    assert result.status == "fail" and "not found" in result.reason
    for flag in ("--recipe smoke", "--data_dir", "--sources", "--vocab_size 300", "--val_every 10"):
        assert flag in result.fix, result.fix
    pasted = paste(result.fix)
    assert pasted.returncode == 0, pasted.stdout + pasted.stderr
    assert prepared_row(recipe).status in ("pass", "warn"), prepared_row(recipe)


@pytest.mark.slow
def test_the_fix_for_a_folder_of_other_sources_prepares_a_new_one_when_pasted(corpus, tmp_path) -> None:  # noqa: F811
    one_source = decay_sources(corpus)[:1]
    first, _ = parse_recipe_args(command_line(tmp_path / "data", one_source), prog="test", description="")
    prepare(first, log=lambda _: None)
    recipe, _ = parse_recipe_args(command_line(tmp_path / "data", decay_sources(corpus)), prog="test", description="")
    result = prepared_row(recipe)
    assert result.status == "fail" and "sources expected" in result.reason, result
    new = re.search(r"give this command `--data_dir (\S+)`", result.fix).group(1)
    pasted = paste(result.fix)
    assert pasted.returncode == 0, pasted.stdout + pasted.stderr
    moved, _ = parse_recipe_args(command_line(Path(new), decay_sources(corpus)), prog="test", description="")
    assert prepared_row(moved).status in ("pass", "warn")


def test_the_command_names_the_recipe_file_the_process_was_started_with(corpus, tmp_path, monkeypatch) -> None:  # noqa: F811
    path = tmp_path / "my run.yaml"
    path.write_text(
        (ROOT / "hf_pretrain" / "recipes" / "smoke.yaml").read_text().replace("name: smoke", "name: my-run")
    )
    argv = ["--recipe", str(path), "--data_dir", str(tmp_path / "d"), "--vocab_size", "300"]
    recipe, _ = parse_recipe_args(argv, prog="test", description="")
    monkeypatch.setattr(sys, "argv", ["hf-pretrain", "doctor", *argv])
    command = shlex.split(recipe_command(recipe, "prepare", PREPARE_KEYS))
    assert command[:4] == ["hf-pretrain", "prepare", "--recipe", str(path)]
    assert command[4:] == ["--data_dir", str(tmp_path / "d"), "--vocab_size", "300"]
    # started without it (the recipe built in a library call): the default recipe and every key that differs
    monkeypatch.setattr(sys, "argv", ["python"])
    again, _ = parse_recipe_args(
        shlex.split(recipe_command(recipe, "prepare", PREPARE_KEYS))[2:], prog="test", description=""
    )
    assert again.data == recipe.data and again.train.seed == recipe.train.seed


def test_a_new_seq_len_carries_the_batch_keys_that_keep_the_recipe_valid(tmp_path) -> None:
    argv = ["--recipe", "smoke", "--seq_len", "96", "--global_batch_tokens", str(96 * 8 * 4), "--micro_batch_size", "8"]
    recipe, _ = parse_recipe_args(argv, prog="test", description="")
    command = shlex.split(recipe_command(recipe, "train", ["seq_len"]))
    again, _ = parse_recipe_args(command[2:], prog="test", description="")
    assert again.data == recipe.data and "--global_batch_tokens" in command
