"""Pushing exports with the real huggingface_hub client to a stand-in Hub on loopback (tests/hub_standin.py)."""

from __future__ import annotations

import subprocess
import sys

import huggingface_hub
import pytest
import torch
from huggingface_hub import snapshot_download
from transformers import AutoModelForCausalLM

from hf_pretrain.publish import export, export_command
from hf_pretrain.redaction import redact
from tests.helpers import OUTSIDE_CHECKOUT, offline_env
from tests.hub_standin import HubStandIn

pytestmark = pytest.mark.slow
TOKEN = "hf_StandInToken0123456789abcdefXYZ"
INPUT_IDS = torch.arange(40).reshape(2, 20)


@pytest.fixture
def hub():
    with HubStandIn(TOKEN) as server:
        yield server


def point_at(hub, monkeypatch):
    """In this process, what HF_ENDPOINT and HF_HUB_OFFLINE=0 would have set when huggingface_hub was imported."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(
        huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    )


@pytest.fixture
def online(hub, monkeypatch, tmp_path):
    """This process talks to the stand-in: online mode, its endpoint, its token, a private HF_HOME."""
    point_at(hub, monkeypatch)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return hub


def logits(folder):
    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(folder)(input_ids=INPUT_IDS).logits


def download(hub, repo_id, revision, tmp_path):
    return snapshot_download(repo_id, revision=revision, token=TOKEN, cache_dir=tmp_path / f"download-{revision}")


def test_export_cli_pushes_through_hf_endpoint_and_the_files_load_again(
    reference_run, exported, hub, tmp_path, monkeypatch
):
    run_dir, _ = reference_run
    env = {
        **offline_env(),
        "HF_HUB_OFFLINE": "0",
        "HF_ENDPOINT": hub.url,
        "HF_TOKEN": TOKEN,
        "HF_HOME": str(tmp_path / "hf_home"),
    }
    out = tmp_path / "pushed"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_pretrain.cli",
            "export",
            "--checkpoint",
            str(run_dir),
            "--out",
            str(out),
            "--push_to_hub",
            "me/tiny-llama",
            "--private",
        ],
        cwd=OUTSIDE_CHECKOUT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    assert TOKEN not in log
    assert f"pushed to {hub.url}/me/tiny-llama/commit/" in log
    repo = hub.state.repos["me/tiny-llama"]
    assert repo.private
    files = hub.files("me/tiny-llama")
    for path in out.iterdir():
        assert files[path.name] == path.read_bytes(), path.name
    assert TOKEN.encode() not in files["README.md"]

    point_at(hub, monkeypatch)
    snapshot = download(hub, "me/tiny-llama", "main", tmp_path)
    assert torch.equal(logits(snapshot), logits(exported))


def test_push_checkpoint_goes_to_a_step_branch(reference_run, exported, online, tmp_path):
    run_dir, _ = reference_run
    url = export.push_checkpoint(run_dir / "checkpoints" / "step_00000008", "me/tiny-llama", 8)
    assert "/me/tiny-llama/commit/" in url
    branches = online.state.repos["me/tiny-llama"].branches
    assert set(branches) == {"main", "step-8"}
    assert set(branches["main"].files) == {".gitattributes"}  # main untouched
    assert "config.json" in branches["step-8"].files
    assert b"step 8" in branches["step-8"].files["README.md"]
    snapshot = download(online, "me/tiny-llama", "step-8", tmp_path)
    assert AutoModelForCausalLM.from_pretrained(snapshot).config.num_hidden_layers == 4
    # pushing the same step again finds the repo and the branch already there
    export.push_checkpoint(run_dir / "checkpoints" / "step_00000008", "me/tiny-llama", 8)
    assert online.state.requests.count("POST /api/models/me/tiny-llama/branch/step-8") == 2


def test_training_publishes_each_checkpoint_and_survives_a_refusal(reference_run, online, tmp_path):
    """The training loop's hook: a checkpoint goes to its `step-N` branch; a refused push only warns."""
    import shutil

    from hf_pretrain.config import build_recipe
    from hf_pretrain.publish.side_jobs import SideJobs

    # the jobs pin their checkpoints beside them: a copy, as the shared reference run is only read
    checkpoints = tmp_path / "checkpoints"
    for name in ("step_00000008", "step_00000012"):
        shutil.copytree(reference_run[0] / "checkpoints" / name, checkpoints / name)
    train_cfg = build_recipe({}, {"push_to_hub": "me/run", "push_checkpoints": True})
    said = []
    side_jobs = SideJobs(train_cfg.publish, train_cfg.evaluation, log=said.append)
    side_jobs.on_checkpoint_saved(checkpoints / "step_00000012", 12)
    side_jobs.wait()
    assert "config.json" in online.state.repos["me/run"].branches["step-12"].files
    assert "pushed to" in said[-1]
    online.state.refuse_writes = True
    side_jobs.on_checkpoint_saved(checkpoints / "step_00000008", 8)
    side_jobs.wait()
    assert said[-1].startswith("warning: step 8 was not pushed") and TOKEN not in said[-1]
    assert not list(checkpoints.glob("*.pin"))  # the jobs' pinned copies are gone


def test_a_refused_upload_fails_clearly_without_the_token_and_keeps_the_export(
    reference_run, online, tmp_path, monkeypatch, capsys
):
    run_dir, _ = reference_run
    monkeypatch.delenv("HF_TOKEN")  # the token comes from the local login file this time
    login = tmp_path / "token"
    login.write_text(TOKEN)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(login))  # set from HF_HOME at import
    online.state.refuse_writes = True
    out = tmp_path / "kept"
    code = export_command.main(["--checkpoint", str(run_dir), "--out", str(out), "--push_to_hub", "me/refused"])
    captured = capsys.readouterr()
    assert code == 1
    assert "403" in captured.err and "me/refused" in captured.err
    assert f"The export in {out} is complete: push it later with `hf upload me/refused {out}`" in captured.err
    assert TOKEN not in captured.out + captured.err
    assert online.state.requests  # the refusal came from the stand-in, not from a missing connection
    assert logits(out).shape == (*INPUT_IDS.shape, 4096)  # the export is whole and loads
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md"} <= {p.name for p in out.iterdir()}


def test_offline_mode_fails_before_any_request(reference_run, hub, tmp_path, capsys):
    run_dir, _ = reference_run
    assert huggingface_hub.constants.HF_HUB_OFFLINE  # the test session runs offline
    out = tmp_path / "offline"
    assert export_command.main(["--checkpoint", str(run_dir), "--out", str(out), "--push_to_hub", "me/offline"]) == 1
    assert "HF_HUB_OFFLINE" in capsys.readouterr().err
    assert hub.state.requests == []
    assert (out / "model.safetensors").is_file()


def test_redact_removes_the_held_token_and_anything_shaped_like_one(monkeypatch):
    """The uploads' errors go through redaction.py's one rule: the token huggingface_hub holds (here not in the
    environment: read from the login file) and any Hub-token shape; a package name that starts `hf_` stays."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    message = f"403 for token {TOKEN} (also hf_otherTokenABCDEFGH12345 in a URL) from hf_pretrain.publish"
    cleaned = redact(message, held=[TOKEN])
    assert TOKEN not in cleaned and "hf_otherTokenABCDEFGH12345" not in cleaned
    assert cleaned.startswith("403 for token ***") and cleaned.endswith("from hf_pretrain.publish")
    assert redact("hf_short", held=[None]) == "hf_short"
