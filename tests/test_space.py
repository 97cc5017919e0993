"""`hf-pretrain space`: the files of the Space, its app.py served on its own, and a push to a Hub stand-in."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
import time

import pytest
from huggingface_hub import SpaceCard

from hf_pretrain.config import DEFAULT_PROMPTS
from hf_pretrain.exit_codes import EXIT_CONFIG
from hf_pretrain.publish.space import SpaceRefused, write_space
from hf_pretrain.publish.targets import WRITTEN_RECORD
from tests.helpers import ROOT, cli, offline_env
from tests.hub_standin import HubStandIn
from tests.test_demo import free_port, greedy_completion

pytestmark = pytest.mark.filterwarnings("ignore:.*:Warning:gradio.queueing")  # gradio's own pandas deprecations

TEMPLATE = ROOT / "hf_pretrain" / "publish" / "space_template" / "app.py"
# What a Space provides to app.py: the standard library, the gradio SDK (with huggingface_hub) and
# requirements.txt.
SPACE_MODULES = set(sys.stdlib_module_names) | {"gradio", "huggingface_hub", "torch", "transformers"}
TOKEN = "hf_standinToken0123456789"


def test_the_space_has_an_app_its_requirements_and_a_readme_the_hub_reads(tmp_path):
    out = write_space(["me/llama-step10k", "me/llama-final"], tmp_path / "space", title="Llama, step by step")
    assert sorted(p.name for p in out.iterdir()) == [
        WRITTEN_RECORD,
        "README.md",
        "app.py",
        "demo.json",
        "requirements.txt",
    ]
    card = SpaceCard.load(out / "README.md")
    assert card.data.sdk == "gradio"
    assert card.data.sdk_version == importlib.metadata.version("gradio")
    assert card.data.app_file == "app.py"
    assert card.data.title == "Llama, step by step"
    assert card.data.models == ["me/llama-step10k", "me/llama-final"]
    requirements = (out / "requirements.txt").read_text().split()
    assert f"transformers=={importlib.metadata.version('transformers')}" in requirements
    assert any(line.startswith("torch==") and "+" not in line for line in requirements)
    assert (out / "app.py").read_text() == TEMPLATE.read_text()
    assert '"prompts"' in (out / "demo.json").read_text() and DEFAULT_PROMPTS[0] in (out / "demo.json").read_text()


def test_the_app_imports_only_what_a_space_has():
    imported = set()
    for node in ast.walk(ast.parse(TEMPLATE.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported <= SPACE_MODULES, imported - SPACE_MODULES


@pytest.mark.slow
def test_the_space_app_serves_a_local_model_from_its_own_folder(reference_run, tmp_path):
    from gradio_client import Client

    final = reference_run[0] / "final"
    out = write_space(["me/llama"], tmp_path / "space")
    port = free_port()
    # -I: neither this repository nor the current folder on sys.path, as on a Space
    env = dict(
        offline_env(),
        DEMO_MODELS=str(final),
        GRADIO_SERVER_NAME="127.0.0.1",
        GRADIO_SERVER_PORT=str(port),
        GRADIO_ANALYTICS_ENABLED="False",
    )
    server = subprocess.Popen(
        [sys.executable, "-I", "app.py"], cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        client, deadline = None, time.monotonic() + 90
        while client is None:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"app.py did not come up:\n{server.communicate()[0][-3000:]}")
            try:
                client = Client(f"http://127.0.0.1:{port}/", verbose=False)
            except Exception:  # not listening yet
                time.sleep(0.5)
        text = client.predict("def fibonacci(n):", [str(final)], 12, 0.0, 50, 1.0, 1.0, 0, api_name="/generate")
        assert text == greedy_completion(final, "def fibonacci(n):", 12)
    finally:
        server.terminate()
        server.wait(timeout=30)


def push_env(hub: HubStandIn, tmp_path, offline: bool = False) -> dict[str, str]:
    return dict(
        offline_env(),
        HF_ENDPOINT=hub.url,
        HF_HUB_OFFLINE="1" if offline else "0",
        HF_TOKEN=TOKEN,
        HF_HOME=str(tmp_path / "hf_home"),
        HF_HUB_DISABLE_TELEMETRY="1",
    )


def test_push_creates_a_gradio_space_and_uploads_the_folder(tmp_path):
    with HubStandIn(TOKEN) as hub:
        result = cli(
            "space",
            "--model",
            "me/llama",
            "--out",
            str(tmp_path / "space"),
            "--push",
            "me/llama-demo",
            env=push_env(hub, tmp_path),
        )
    assert result.returncode == 0, result.stderr
    assert f"pushed: {hub.url}/spaces/me/llama-demo/commit/" in result.stdout
    assert hub.state.unexpected == []
    [created] = hub.state.created
    assert created == {"organization": "me", "name": "llama-demo", "type": "space", "sdk": "gradio"}
    assert set(hub.state.authorization) == {f"Bearer {TOKEN}"}
    [commit] = hub.state.commits
    assert commit["repo"] == "me/llama-demo"
    written = {p.name: p.read_bytes() for p in (tmp_path / "space").iterdir() if p.name != WRITTEN_RECORD}
    assert commit["files"] == written  # the record of what was written stays on this machine


def test_a_space_push_goes_through_the_one_upload_path(tmp_path):
    """push_folder's offline check and token scrubbing hold for Spaces too; the folder stays for a later push."""
    with HubStandIn(TOKEN) as hub:
        offline = cli(
            "space",
            "--model",
            "me/llama",
            "--out",
            str(tmp_path / "space"),
            "--push",
            "me/llama-demo",
            env=push_env(hub, tmp_path, offline=True),
        )
        assert offline.returncode == 1 and "HF_HUB_OFFLINE" in offline.stderr
        assert hub.state.requests == []  # refused before any request
        hub.state.refuse_writes = True
        refused = cli(
            "space",
            "--model",
            "me/llama",
            "--out",
            str(tmp_path / "space"),
            "--push",
            "me/llama-demo",
            env=push_env(hub, tmp_path),
        )
    assert refused.returncode == 1
    assert "me/llama-demo" in refused.stderr and "hf upload me/llama-demo" in refused.stderr
    assert hub.state.requests  # the refusal came from the stand-in, which repeats the token in its message
    assert TOKEN not in refused.stdout + refused.stderr
    assert (tmp_path / "space" / "app.py").is_file()


def test_a_model_that_is_not_a_repo_id_is_refused(tmp_path):
    result = cli("space", "--model", "runs/smoke/final/", "--out", str(tmp_path / "space"))
    assert result.returncode == EXIT_CONFIG
    assert "is not a Hub repo id" in result.stderr
    assert not (tmp_path / "space").exists()


def test_space_never_writes_over_a_users_files(tmp_path):
    """Issue 38: `space --out` wrote its app.py over the user's own in an existing folder, silently."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "app.py").write_text("my own app")
    (project / "notes.txt").write_text("mine")
    refused = cli("space", "--model", "me/llama", "--out", str(project))
    assert refused.returncode == EXIT_CONFIG, refused.stderr
    assert "app.py" in refused.stderr and "notes.txt" in refused.stderr and "--overwrite" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1  # one line, no traceback
    assert sorted(p.name for p in project.iterdir()) == ["app.py", "notes.txt"]
    assert (project / "app.py").read_text() == "my own app"

    own = write_space(["me/a"], tmp_path / "space")
    write_space(["me/b"], own)  # a Space this command wrote, unchanged: written again
    assert '"me/b"' in (own / "demo.json").read_text()
    (own / "app.py").write_text("edited by hand")
    with pytest.raises(SpaceRefused, match=r"app\.py \(changed since hf-pretrain space\)"):
        write_space(["me/c"], own)
    assert (own / "app.py").read_text() == "edited by hand"

    replaced = cli("space", "--model", "me/llama", "--out", str(project), "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert (project / "app.py").read_text() == TEMPLATE.read_text()
    assert (project / "notes.txt").read_text() == "mine"  # what the Space does not write is kept
