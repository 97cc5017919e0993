"""A run in the store, seen from anywhere (issue 47): a URL typo refused before any work, a store that
stops answering or throttles never hangs nor tears a checkpoint, `status URL` answers from the store's
small records, and the user sees the URL they gave. Against the moto S3 server behind the proxy
(tests/object_store_server.py: cut, stall, throttle)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from hf_pretrain import cli
from hf_pretrain.exit_codes import EXIT_CONFIG

# ------------------------------------------------------------------------------------ 1. URL typos

TYPOS = ["s3:/bkt/runs/x", "s3:bkt", "s4://bkt/x", "gs:/x", "S3://bkt/x", "s3://bkt/a/../b"]
# each command that takes a run, a checkpoint, a data folder or a model, with where it takes it
COMMAND_LINES = {
    "train": ["--recipe", "smoke", "--output_dir", "{}"],
    "prepare": ["--recipe", "smoke", "--data_dir={}"],
    "status": ["{}"],
    "stop": ["{}"],
    "doctor": ["--recipe", "smoke", "--output_dir", "{}"],
    "export": ["--checkpoint", "{}", "--out", "exported"],
    "eval": ["--model", "{}"],
    "report": ["{}"],
    "gguf": ["{}"],
    "demo": ["--model", "{}"],
}


@pytest.mark.parametrize("command", sorted(COMMAND_LINES))
@pytest.mark.parametrize("typo", TYPOS)
def test_a_url_typo_is_refused_in_one_line_before_any_work(command, typo, capsys, tmp_path):
    argv = [command, *(a.format(typo) for a in COMMAND_LINES[command])]
    assert cli.main(argv) == EXIT_CONFIG
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hf-pretrain {command}: error: "), err
    assert "://" in err[0]  # the spelling that works, or the schemes that do
    assert not list(Path.cwd().iterdir()), "nothing may be written before the refusal"


def test_a_typo_names_the_spelling_that_works():
    from hf_pretrain.object_store.urls import StoreUnavailable, check_location

    with pytest.raises(StoreUnavailable, match=r"write it as s3://bkt/runs/x"):
        check_location("s3:/bkt/runs/x")
    with pytest.raises(StoreUnavailable, match=r"write it as s3://bkt/x"):
        check_location("S3://bkt/x")
    for fine in ("runs/x", "./s3:/x", "C:/x", "hold:12", "s3://bkt/x", "/abs/path"):
        check_location(fine, any_arg=True)  # local paths, a fault's spelling, a real URL: no refusal


def test_train_launched_without_the_cli_refuses_a_typo_too(capsys):
    """`accelerate launch hf_pretrain/train.py` does not pass through cli.py: train.py checks itself."""
    from hf_pretrain import train

    assert train.main(["--recipe", "smoke", "--output_dir", "s3:/bkt/runs/x"]) == EXIT_CONFIG
    assert "write it as s3://bkt/runs/x" in capsys.readouterr().err
    assert not Path("s3:").exists()


def test_a_dot_dot_url_never_leaves_the_cache():
    from hf_pretrain.object_store.urls import StoreUnavailable, StoreURL

    with pytest.raises(StoreUnavailable, match=r"`\.` or `\.\.`"):
        StoreURL.parse("s3://bkt/runs/../../../etc")
