"""One contract for every command's exit codes (hf_pretrain/exit_codes.py): a bad value is refused
with EXIT_CONFIG (78) in one line on stderr and no traceback, whichever command it reaches; a command
line that does not parse is EXIT_USAGE (2), one line too; docs/survival.md shows the same table."""

from __future__ import annotations

import re

import pytest

from hf_pretrain.cli import COMMANDS
from hf_pretrain.cli import main as cli
from hf_pretrain.exit_codes import CONTRACT, EXIT_CONFIG, EXIT_USAGE
from tests.helpers import ROOT


def bad_values(tmp_path) -> dict[str, list[str]]:
    """For each command, arguments that parse but whose values cannot be used."""
    nothing = str(tmp_path / "nothing")
    return {
        "prepare": ["--recipe", "smoke", "--seq_len", "0"],
        "train": ["--recipe", "smoke", "--micro_batch_size", "-1"],
        "stop": [nothing],
        "doctor": ["--recipe", "smoke", "--warmup_steps", "-3"],
        "export": ["--checkpoint", nothing, "--out", str(tmp_path / "out")],
        "eval": ["--model", "m", "--data_dir", nothing],
        "bench": ["--recipe", "smoke", "--gpu_price", "H100"],
        "plan": ["--params", "1e9", "--tokens", "-5"],
        "report": [nothing],
        "demo": ["--model", str(tmp_path / "missing" / "x")],
        "space": ["--model", "runs/smoke/final/", "--out", str(tmp_path / "space")],
        "gguf": [nothing],
        "check": ["--recipe", "smoke", "--budget_s", "-5"],
        "status": [nothing],
        "launch": ["--config_file", nothing, "hf_pretrain/train.py", "--recipe", "smoke"],
    }


def exit_code(argv: list[str]) -> int:
    try:
        return cli(argv)
    except SystemExit as exc:  # a parser's refusal ends the command where it parses
        return exc.code


def test_every_command_is_driven_here():
    assert set(bad_values(ROOT)) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_bad_value_is_exit_config_in_one_line_for_every_command(command, tmp_path, monkeypatch, capsys):
    if command == "demo":
        pytest.importorskip("gradio")
    monkeypatch.chdir(tmp_path)  # nothing a refusal might write lands in the checkout
    code = exit_code([command, *bad_values(tmp_path)[command]])
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith(("hf-pretrain", "train.py"))]
    assert code == EXIT_CONFIG, err
    assert len(ours) == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("command", ["train", "doctor", "stop", "gguf"])
def test_a_flag_that_does_not_parse_is_exit_usage_in_one_line(command, capsys):
    code = exit_code([command, "--no_such_flag", "1"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and len(err.strip().splitlines()) == 1 and "unknown key `no_such_flag`" in err, err


@pytest.mark.parametrize("command", ["train", "doctor", "check", "prepare"])
def test_a_bad_choice_is_exit_usage_and_its_hint_can_be_pasted(command, capsys):
    """train's hint was "`train.py --help` lists the options": no such command for who typed `hf-pretrain train`."""
    code = exit_code([command, "--attention-backend", "flash3"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and len(err.strip().splitlines()) == 1, err
    assert "invalid choice: 'flash3'" in err and f"(`hf-pretrain {command} --help` lists the options)" in err, err


def test_the_docs_table_is_the_contract():
    text = (ROOT / "docs" / "survival.md").read_text()
    table = text.split("## Exit codes of every command", 1)[1].split("\n- ", 1)[0]
    rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| `(\w+)` \|", table, re.M)}
    assert rows == {code: name for code, (name, _) in CONTRACT.items()}
