"""Session fixtures: the smoke corpus prepared once, and one reference run the other tests compare to, each
built once for the whole session and shared by the xdist workers (`built_once`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from filelock import FileLock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `make test` runs three test processes on two cores (pytest-xdist): a worker's own torch work on two threads
# would fight the others' for them (OpenMP threads spin while they wait, several times slower), so
# each worker computes on one thread, as every process the tests start does (helpers.offline_env). The
# numbers are the same on one thread or two (docs/testing.md, golden losses).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# the measurements a GPU recorded (economics/measurements.py): never the user's, so `plan` reads the same everywhere
os.environ["HF_PRETRAIN_HOME"] = tempfile.mkdtemp(prefix="hf_pretrain_home_")


def built_once(name: str, tmp_path_factory, worker_id: str, build) -> Path:
    """The folder `build(folder)` fills, built once for the whole test session: the first of the xdist workers
    to ask builds it under a lock, the others wait and share it (each used to build its own: a prepared corpus
    and a trained run more per worker). What is built here is read, never changed, by the tests."""
    if worker_id == "master":  # no xdist: one process, pytest's own session scope is enough
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    shared = tmp_path_factory.getbasetemp().parent / "built_once"  # the session's folder, above every worker's
    shared.mkdir(exist_ok=True)
    folder, done = shared / name, shared / f"{name}.done"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():  # a worker whose build failed left no mark: the next one builds it again
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def smoke_data(tmp_path_factory, worker_id):
    """The `smoke` recipe's built-in corpus, tokenized once per test session."""

    def build(folder: Path) -> None:
        from hf_pretrain.config import load_recipe
        from hf_pretrain.data.prepare_run import prepare

        prepare(load_recipe("smoke", {"data_dir": str(folder)}), log=lambda _: None)

    return built_once("smoke_data", tmp_path_factory, worker_id, build)


def trained_once(name: str, data_dir: Path, tmp_path_factory, worker_id: str, **launch) -> tuple[Path, str]:
    """An uninterrupted short run of `data_dir` (`launch_training(..., **launch)`), trained once for the whole
    session (`built_once`): (run_dir, its launch's output)."""

    def build(folder: Path) -> None:
        from tests.helpers import launch_training

        (folder / "launch.log").write_text(launch_training(data_dir, folder / "run", **launch))

    folder = built_once(name, tmp_path_factory, worker_id, build)
    return folder / "run", (folder / "launch.log").read_text()


@pytest.fixture(scope="session")
def reference_run(smoke_data, tmp_path_factory, worker_id):
    """An uninterrupted one-process run of the short smoke schedule, through `accelerate launch` as users type
    it: (run_dir, log)."""
    return trained_once("reference", smoke_data, tmp_path_factory, worker_id, through_launcher=True)


@pytest.fixture(scope="session")
def two_process_run(smoke_data, tmp_path_factory, worker_id):
    """The short run on two processes (DDP over gloo) under one `accelerate launch`, never interrupted: what the
    DDP, multi-node and store tests compare their two-process runs to (each used to train its own): (run_dir, log)."""
    return trained_once("two_processes", smoke_data, tmp_path_factory, worker_id, processes=2, timeout=300)


@pytest.fixture(scope="session")
def exported(reference_run, tmp_path_factory, worker_id):
    """`hf-pretrain export` of the reference run (bf16), shared read-only by the export, hub and eval tests."""

    def build(folder: Path) -> None:
        from hf_pretrain.publish import export_command

        out = folder / "tiny"
        assert export_command.main(["--checkpoint", str(reference_run[0]), "--out", str(out)]) == 0

    return built_once("export", tmp_path_factory, worker_id, build) / "tiny"


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


def pytest_configure(config):
    # xdist hands each worker a whole file at a time in the order `pytest_collection_modifyitems` leaves
    # them; its own reordering (by number of tests) would undo that.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """The files with the most end-to-end (`slow`) tests first: they are the long ones, and one of them
    started last keeps one worker busy while the other has nothing left (a minute of the suite on 2 cores,
    docs/testing.md). The order of the tests inside a file is kept."""
    slow_in = Counter(item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow"))
    files = list(dict.fromkeys(item.nodeid.split("::")[0] for item in items))
    rank = {name: (-slow_in[name], position) for position, name in enumerate(files)}
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])
