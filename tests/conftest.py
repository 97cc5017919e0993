"""Session fixtures: the smoke corpus prepared once, and one reference run the other tests compare to."""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `make test` runs two test processes on two cores (pytest-xdist): a worker's own torch work on two threads
# would fight the other worker's for them (OpenMP threads spin while they wait, several times slower), so
# each worker computes on one thread, as every process the tests start does (helpers.offline_env). The
# numbers are the same on one thread or two (docs/testing.md, golden losses).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# the measurements a GPU recorded (economics/measurements.py): never the user's, so `plan` reads the same everywhere
os.environ["HF_PRETRAIN_HOME"] = tempfile.mkdtemp(prefix="hf_pretrain_home_")


@pytest.fixture(scope="session")
def smoke_data(tmp_path_factory):
    """The `smoke` recipe's built-in corpus, tokenized once per test session."""
    from hf_pretrain.config import load_recipe
    from hf_pretrain.data.prepare_run import prepare

    data_dir = tmp_path_factory.mktemp("smoke_data")
    prepare(load_recipe("smoke", {"data_dir": str(data_dir)}), log=lambda _: None)
    return data_dir


@pytest.fixture(scope="session")
def reference_run(smoke_data, tmp_path_factory):
    """An uninterrupted one-process run of the short smoke schedule, through `accelerate launch`: (run_dir, log)."""
    from tests.helpers import launch_training

    run_dir = tmp_path_factory.mktemp("reference") / "run"
    return run_dir, launch_training(smoke_data, run_dir, through_launcher=True)  # as users type it


@pytest.fixture(scope="session")
def exported(reference_run, tmp_path_factory):
    """`hf-pretrain export` of the reference run (bf16), shared read-only by the export, hub and eval tests."""
    from hf_pretrain.publish import export_command

    out = tmp_path_factory.mktemp("export") / "tiny"
    assert export_command.main(["--checkpoint", str(reference_run[0]), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def s3_server():
    """An S3-compatible server on localhost (moto) behind a proxy the tests can cut; its env set here too."""
    pytest.importorskip("moto.server", reason="the object-store tests need the dev extra (moto[server])")
    pytest.importorskip("s3fs", reason="the object-store tests need the dev extra (s3fs)")
    from tests.object_store_server import running_s3_server

    with running_s3_server() as server:
        saved = {k: os.environ.get(k) for k in server.env}
        os.environ.update(server.env)
        yield server
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def s3_bucket(s3_server, request):
    """A fresh bucket for one test: its URL, `s3://<name>`."""
    import re

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") + f"-{os.getpid()}"
    return s3_server.make_bucket(name)


@pytest.fixture(autouse=True)
def _outside_the_checkout(tmp_path_factory, monkeypatch):
    """Each test runs in its own empty folder: a recipe's relative defaults (data/smoke, runs/smoke) name
    nothing there, so the suite gives the same result before and after `make smoke` (issue 42)."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
