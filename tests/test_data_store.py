"""Data in object storage (issue 40): `prepare` into an s3:// URL, training reads it through a bounded,
verified block cache, and the batches are exactly those of the same data in a local folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hf_pretrain.config import load_recipe
from tests.helpers import cli, offline_env
from tests.object_store_server import FAKE_SECRET

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def store_data(s3_server, tmp_path_factory, smoke_data):
    """The smoke data prepared into s3://<bucket>/smoke by `hf-pretrain prepare`: (url, its log, the local copy's home)."""
    url = s3_server.make_bucket("store-data") + "/smoke"
    home = tmp_path_factory.mktemp("prepare_home")
    env = offline_env() | s3_server.env | {"HF_PRETRAIN_HOME": str(home)}
    result = cli("prepare", "--recipe", "smoke", "--data_dir", url, cwd=Path.cwd(), env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return url, result.stdout + result.stderr, home


def _store_listing(url: str) -> dict[str, tuple]:
    from hf_pretrain.store.urls import StoreURL, filesystem

    store = StoreURL.parse(url)
    found = filesystem(store).find(store.path, detail=True)
    return {k: (v["size"], v.get("ETag"), str(v.get("LastModified"))) for k, v in found.items()}


def test_prepare_into_a_url_uploads_everything_meta_last(store_data, smoke_data, s3_server):
    url, log, _ = store_data
    listing = _store_listing(url)
    prefix = url.removeprefix("s3://") + "/"
    names = {k.removeprefix(prefix) for k in listing}
    meta = json.loads((smoke_data / "meta.json").read_text())
    for source in meta["sources"]:
        for split in source["splits"].values():
            for entry in split["files"]:
                assert {entry["file"], entry["file"] + ".index", entry["file"] + ".blocks"} <= names
        assert f"{source['folder']}/source.json" in names
    assert {"meta.json", "blocks.json", "tokenizer/tokenizer.json"} <= names
    assert not any(n.startswith(("logs/", "prepare")) for n in names)  # only what a reader needs
    stored_meta = json.loads(_cat(url, "meta.json"))
    # the same bytes as a local prepare of the same recipe: the same shards, the same checksums
    assert [s["splits"] for s in stored_meta["sources"]] == [s["splits"] for s in meta["sources"]]
    assert FAKE_SECRET not in log


def _cat(url: str, name: str) -> bytes:
    from hf_pretrain.store.urls import StoreURL, filesystem

    store = StoreURL.parse(url).join(name)
    return filesystem(store).cat_file(store.path)


def test_a_second_prepare_into_the_url_says_complete_and_rewrites_nothing(store_data, s3_server, tmp_path):
    url, _, _ = store_data
    before = _store_listing(url)
    env = offline_env() | s3_server.env | {"HF_PRETRAIN_HOME": str(tmp_path / "empty")}
    result = cli("prepare", "--recipe", "smoke", "--data-dir", url, cwd=Path.cwd(), env=env)
    assert result.returncode == 0, result.stderr
    assert "already prepared" in result.stdout
    assert _store_listing(url) == before
    assert not (tmp_path / "empty" / "data").exists()  # nothing prepared again on this machine


def test_prepare_into_an_unreachable_store_says_so_in_one_line_within_seconds(tmp_path):
    """Was three retried reads of meta.json: 27 s of silence before the line (measured, endpoint port 9)."""
    import time

    env = offline_env() | {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # nothing listens: connection refused
        "AWS_ACCESS_KEY_ID": "AKIAFAKE",
        "AWS_SECRET_ACCESS_KEY": FAKE_SECRET,
        "HF_PRETRAIN_HOME": str(tmp_path / "home"),
    }
    started = time.monotonic()  # a cold start: the time bound counts the interpreter's, as a user's does
    command = [sys.executable, "-m", "hf_pretrain.cli", "prepare", "--recipe", "smoke", "--data_dir", "s3://any/data"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 78, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "does not answer while listing the data" in lines[0], result.stderr
    assert FAKE_SECRET not in result.stdout + result.stderr and "Traceback" not in result.stderr
    assert time.monotonic() - started < 20
    assert not (tmp_path / "home" / "data").exists()  # before any work


# ---------------------------------------------------------------------- training reads the URL
@pytest.fixture
def machine(tmp_path, monkeypatch):
    """Another machine: an empty cache folder, and nothing this process synced before."""
    from hf_pretrain.store.data import data_cache

    def fresh(name: str) -> Path:
        home = tmp_path / name
        monkeypatch.setenv("HF_PRETRAIN_HOME", str(home))
        monkeypatch.setattr(data_cache, "_SYNCED", {})
        return home

    return fresh


def _batches(recipe, start_step: int, n: int) -> list:
    from tests.helpers import build_train_loader

    loader = build_train_loader(recipe, 0, 1, recipe.grad_accum_steps(1), start_step)
    it = iter(loader)
    out = [next(it) for _ in range(n)]
    del it
    return out


def _assert_same(a: list, b: list) -> None:
    import torch

    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def test_batches_from_the_url_equal_the_local_ones_and_a_resume_elsewhere_too(store_data, smoke_data, machine):
    from tests.helpers import build_val_loader

    url, _, _ = store_data
    local = load_recipe("smoke", {"data_dir": str(smoke_data)})
    remote = load_recipe("smoke", {"data_dir": url})
    home = machine("a")
    _assert_same(_batches(remote, 0, 12), _batches(local, 0, 12))  # 6 steps, through a loader worker
    assert list((home / "data" / "s3").rglob("blocks/rank0/*/*/*/*"))  # the blocks came into this machine's cache
    _assert_same([b for b, _ in build_val_loader(remote, 0, 1)], [b for b, _ in build_val_loader(local, 0, 1)])
    machine("b")  # a resume at step 4 on another machine: its own empty cache
    _assert_same(_batches(remote, 4, 6), _batches(local, 4, 6))


@pytest.fixture(scope="module")
def small_blocks(s3_server, smoke_data):
    """The smoke data uploaded with 1 KiB blocks (the smoke corpus is ~40 blocks of the real 64 KiB)."""
    from hf_pretrain.store.data import data_blocks
    from hf_pretrain.store.data.data_upload import upload_prepared
    from hf_pretrain.store.urls import StoreURL, filesystem

    url = s3_server.make_bucket("small-blocks") + "/smoke"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(data_blocks, "BLOCK_BYTES", 1024)
        copy = _copy_prepared(smoke_data, smoke_data.parent / "smoke_small_blocks")
        upload_prepared(copy, StoreURL.parse(url), filesystem(StoreURL.parse(url)), log=lambda _: None)
    return url


def _copy_prepared(source: Path, target: Path) -> Path:
    import shutil

    if not target.exists():
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("logs", "*.blocks", "blocks.json"))
    return target


def test_a_small_cache_evicts_and_gives_the_same_batches(small_blocks, smoke_data, machine, monkeypatch):
    from hf_pretrain.store.data.data_cache import StoreData

    fetched = []
    real_fetch = StoreData.fetch
    monkeypatch.setattr(
        StoreData, "fetch", lambda self, file, block: fetched.append((file, block)) or real_fetch(self, file, block)
    )
    local = load_recipe("smoke", {"data_dir": str(smoke_data)})
    # 300 KB of a 2.6 MB corpus; no loader worker, so this process sees every fetch
    remote = load_recipe("smoke", {"data_dir": small_blocks, "data_cache_gb": 0.0003, "num_workers": 0})
    home = machine("small")
    _assert_same(_batches(remote, 0, 40), _batches(local, 0, 40))
    cached = [p.stat().st_size for p in home.rglob("blocks/rank0/**/*") if p.is_file()]
    assert len(set(fetched)) * 1024 > 400_000  # more distinct blocks than the cache holds: some were evicted
    assert sum(cached) <= 300_000  # and the cache kept its bound


def test_a_cache_too_small_for_one_step_is_one_line_naming_the_key(small_blocks, machine):
    from hf_pretrain.store.store_calls import StoreError

    machine("tiny")
    remote = load_recipe("smoke", {"data_dir": small_blocks, "data_cache_gb": 0.00001})
    with pytest.raises(StoreError) as refused:
        _batches(remote, 0, 1)
    message = str(refused.value)
    assert "\n" not in message and "data_cache_gb=1e-05" in message and "--data_cache_gb 0.0" in message


@pytest.fixture(scope="module")
def corrupt_store(s3_server, smoke_data):
    """The smoke data uploaded, then the first 4 KB of its largest training shard overwritten in the store
    (same size): (url, that shard's file name)."""
    from hf_pretrain.store.data.data_upload import upload_prepared
    from hf_pretrain.store.urls import StoreURL, filesystem

    url = s3_server.make_bucket("corrupt") + "/smoke"
    store = StoreURL.parse(url)
    fs = filesystem(store)
    upload_prepared(_copy_prepared(smoke_data, smoke_data.parent / "smoke_corrupt"), store, fs, log=lambda _: None)
    meta = json.loads((smoke_data / "meta.json").read_text())
    shard = max((e for s in meta["sources"] for e in s["splits"]["train"]["files"]), key=lambda e: e["tokens"])
    good = fs.cat_file(store.join(shard["file"]).path)
    fs.pipe_file(store.join(shard["file"]).path, bytes(b ^ 0xFF for b in good[:4096]) + good[4096:])
    return url, shard["file"]


def test_a_corrupted_shard_in_the_store_is_caught_by_its_checksum(corrupt_store, machine):
    from hf_pretrain.store.data.data_cache import StoreDataCorrupt
    from tests.helpers import build_train_loader

    url, shard = corrupt_store
    machine("c")
    remote = load_recipe("smoke", {"data_dir": url, "num_workers": 0})
    dataset = build_train_loader(remote, 0, 1, 2, 0).dataset.datasets[1]  # the stdlib source: its first samples
    with pytest.raises(StoreDataCorrupt) as caught:
        dataset[0]
    assert shard in str(caught.value) and "checksum" in str(caught.value)


def the_store_returns_at_the_first_retry(monkeypatch, proxy) -> None:
    """The cut store comes back when the product's retry loop first waits: certain, where a timer that
    restored it after a second raced that loop's own one-second delay on a loaded machine (issue 49)."""
    import time

    from hf_pretrain.store import store_calls

    class Clock:
        def __getattr__(self, name):
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            proxy.restore()
            time.sleep(seconds)

    monkeypatch.setattr(store_calls, "time", Clock())


def test_a_store_cut_during_a_fetch_is_retried_then_a_clear_line(store_data, machine, s3_server, monkeypatch):
    from hf_pretrain.store.data.data_cache import StoreData
    from hf_pretrain.store.store_calls import StoreError

    url, _, _ = store_data
    monkeypatch.setenv("HF_PRETRAIN_STORE_RETRY_DELAYS", "1,1")
    machine("cut")
    data = StoreData(url, None, 10**9)
    file = next(iter(data.sizes))
    s3_server.proxy.cut()
    try:
        with monkeypatch.context() as patched:
            the_store_returns_at_the_first_retry(patched, s3_server.proxy)
            assert len(data.block(file, 0)) == min(data.block_bytes, data.sizes[file])  # came back: retried
        s3_server.proxy.cut()
        monkeypatch.setenv("HF_PRETRAIN_STORE_RETRY_DELAYS", "0.1")
        with pytest.raises(StoreError) as failed:
            data.fetch(file, 1 if data.sizes[file] > data.block_bytes else 0)
    finally:
        s3_server.proxy.restore()
    message = str(failed.value)
    assert "\n" not in message and "did not answer after 2 tries" in message and FAKE_SECRET not in message


# ---------------------------------------------------------------------- the trainer
def _train(url: str, run_dir: Path, home: Path, s3_server, **overrides) -> subprocess.CompletedProcess:
    from tests.helpers import launch_training

    env = s3_server.env | {"HF_PRETRAIN_HOME": str(home), "HF_PRETRAIN_STORE_RETRY_DELAYS": "0.2"}
    return launch_training(url, run_dir, check=False, env=env, **overrides)


def _losses(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


@pytest.mark.slow
def test_training_from_the_url_on_an_empty_machine_trains_as_the_local_data_does(
    store_data, reference_run, s3_server, tmp_path
):
    url, _, _ = store_data
    log = _train(url, tmp_path / "run", tmp_path / "home", s3_server)
    assert "Traceback" not in log, log[-3000:]
    assert _losses(tmp_path / "run") == _losses(reference_run[0])  # the same batches, the same math
    assert list((tmp_path / "home" / "data").rglob("blocks/rank0/*/*/*/*"))
    assert FAKE_SECRET not in log


@pytest.mark.slow
def test_a_trainer_on_a_damaged_shard_or_a_missing_bucket_stops_in_one_line_with_78(corrupt_store, s3_server, tmp_path):
    import re

    url, shard = corrupt_store
    for data_dir, expected in ((url, shard), ("s3://no-such-bucket-hf/data", "does not exist")):
        run_dir = tmp_path / re.sub(r"\W", "-", data_dir)
        log = _train(data_dir, run_dir, tmp_path / "home", s3_server)
        status = json.loads((run_dir / "status.json").read_text()) if (run_dir / "status.json").is_file() else {}
        # (accelerate's launcher prints its own traceback for any failed child; none comes from hf_pretrain)
        assert expected in log and not re.search(r'File "[^"]*hf_pretrain/', log) and FAKE_SECRET not in log
        assert "keep what workers receive picklable" not in log, log[-3000:]
        assert status["exit_code"] == 78, status


def test_a_local_data_dir_imports_no_store_package(smoke_data):
    """A user who never names a URL loads none of the store packages (fsspec, s3fs, aiobotocore, gcsfs): the
    data check, the preflight's data rows, the loaders. (boto3 is accelerate's own import where installed.)"""
    code = f"""
import sys
from hf_pretrain.config import load_recipe
from hf_pretrain.data.loader import sections_data
from hf_pretrain.data.prepared import check_prepared_data, data_identity
from hf_pretrain.store.location import Where
from hf_pretrain.preflight.data import check_data_cache
recipe = load_recipe("smoke", {{"data_dir": {str(smoke_data)!r}, "num_workers": 0}})
data = Where.of(recipe).data
check_prepared_data(recipe, data)
data_identity(data)
assert check_data_cache(recipe.data, data, lambda: check_prepared_data(recipe, data)) == []
batches = sections_data(recipe.data, data, recipe.train, rank=0, world_size=1, grad_accum=2)
next(iter(batches.loader(0, (0, 0), None)))
next(iter(batches.val_loader(recipe.evaluation.eval_tokens)))
print(sorted(m for m in sys.modules if m.split(".")[0] in ("fsspec", "s3fs", "aiobotocore", "gcsfs")))
"""
    from tests.helpers import offline_env

    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=offline_env(), timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_the_doctor_reads_a_data_url(store_data, s3_server, tmp_path):
    """Complete data: the data rows pass with the cache's size against the data; a missing bucket: one row,
    one line, no traceback, no credential."""

    from tests.helpers import offline_env

    env = offline_env() | s3_server.env | {"HF_PRETRAIN_HOME": str(tmp_path / "home")}
    env |= {"HF_PRETRAIN_STORE_RETRY_DELAYS": "0.2"}
    url, _, _ = store_data
    out = {}
    for name, data_dir in (("good", url), ("missing", "s3://no-such-bucket-hf/data")):
        args = ["doctor", "--recipe", "smoke", "--data_dir", data_dir, "--output_dir", str(tmp_path / name)]
        result = cli(*args, cwd=Path.cwd(), env=env)
        out[name] = result.stdout + result.stderr
    assert "all of it fits; no block is fetched twice" in out["good"], out["good"][-3000:]
    data_rows = [
        line for line in out["missing"].splitlines() if "no-such-bucket-hf" in line and "does not exist" in line
    ]
    assert data_rows, out["missing"][-3000:]
    assert "Traceback" not in out["missing"] and FAKE_SECRET not in out["missing"] + out["good"]


def test_prepare_with_a_cache_dir_it_cannot_make_is_one_line_not_a_traceback(tmp_path):

    (tmp_path / "a_file").write_text("x")
    env = offline_env() | {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}  # never reached
    args = ["prepare", "--recipe", "smoke", "--data_dir", "s3://b/d", "--cache-dir", str(tmp_path / "a_file" / "cache")]
    result = cli(*args, cwd=Path.cwd(), env=env, timeout=120)
    assert result.returncode == 78, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "set --cache_dir to a folder this machine can write" in lines[0], result.stderr


def test_the_doctor_on_an_unreachable_data_url_answers_in_one_row_within_seconds(tmp_path):
    """Was every data check retrying its own reads: 150 s with one line on the screen (measured, port 9)."""
    import time

    from tests.helpers import offline_env

    env = offline_env() | {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # nothing listens: connection refused
        "AWS_ACCESS_KEY_ID": "AKIAFAKE",
        "AWS_SECRET_ACCESS_KEY": FAKE_SECRET,
        "HF_PRETRAIN_HOME": str(tmp_path / "home"),
    }
    command = [sys.executable, "-m", "hf_pretrain.cli", "doctor", "--recipe", "smoke", "--data_dir", "s3://any/data"]
    command += ["--output_dir", str(tmp_path / "run")]
    started = time.monotonic()  # a cold start: the time bound counts the interpreter's, as a user's does
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 78, result.stdout[-3000:] + result.stderr[-3000:]
    assert time.monotonic() - started < 45  # one probe (botocore's own retries), then the table
    rows = [line for line in result.stdout.splitlines() if "FAIL" in line]
    assert len(rows) == 1 and "does not answer while listing the data" in rows[0], result.stdout
    assert "Traceback" not in result.stdout + result.stderr and FAKE_SECRET not in result.stdout + result.stderr


@pytest.mark.slow
def test_a_store_cut_during_the_upload_is_retried_then_a_clear_line(s3_server, smoke_data, monkeypatch):
    from hf_pretrain.store.data.data_upload import UploadIncomplete, upload_prepared
    from hf_pretrain.store.urls import StoreURL, filesystem

    monkeypatch.setenv("HF_PRETRAIN_STORE_RETRY_DELAYS", "1,1")
    copy = _copy_prepared(smoke_data, smoke_data.parent / "smoke_upload_cut")
    url = StoreURL.parse(s3_server.make_bucket("upload-cut") + "/smoke")
    fs = filesystem(url)
    s3_server.proxy.cut()
    try:
        with monkeypatch.context() as patched:
            the_store_returns_at_the_first_retry(patched, s3_server.proxy)
            upload_prepared(copy, url, fs, log=lambda _: None)  # came back: every file retried until it is in
        assert json.loads(fs.cat_file(url.join("meta.json").path)) == json.loads((copy / "meta.json").read_text())
        again = StoreURL.parse(s3_server.make_bucket("upload-cut-2") + "/smoke")
        monkeypatch.setenv("HF_PRETRAIN_STORE_RETRY_DELAYS", "0.1")
        s3_server.proxy.cut()
        with pytest.raises(UploadIncomplete) as failed:
            upload_prepared(copy, again, filesystem(again), log=lambda _: None)
    finally:
        s3_server.proxy.restore()
    message = str(failed.value)
    assert "\n" not in message and "the same command uploads what the store lacks" in message
    assert FAKE_SECRET not in message
    assert not filesystem(again).exists(again.join("meta.json").path)  # never "complete" in the store


def test_refused_credentials_are_one_line_without_the_secret_and_not_retried(monkeypatch):
    """moto accepts any key, so the store's answer is stood in for: s3fs raises PermissionError on a 403."""
    from hf_pretrain.store.store_calls import StoreError, store_call

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    calls = []

    def refused():
        calls.append(1)
        raise PermissionError(f"SignatureDoesNotMatch for secret {FAKE_SECRET}")

    with pytest.raises(StoreError) as refusal:
        store_call("reading", "s3://bucket/data/meta.json", refused)
    message = str(refusal.value)
    assert len(calls) == 1 and "\n" not in message and FAKE_SECRET not in message
    assert "refused the credentials" in message and "AWS_SECRET_ACCESS_KEY" in message


def test_a_shard_deleted_from_the_store_fails_the_preflight_and_prepare_uploads_it_again(
    s3_server, smoke_data, tmp_path
):
    """Issue 57: a shard gone from the store (an interrupted sync): the doctor said "data pass", training
    stopped at step 2 saying "prepare it again", and `prepare` said "already prepared ... nothing was
    uploaded". Now the preflight names the shard and the fix; `prepare` on a machine without the data says
    where it can come from, and on the machine that prepared it sends it again."""
    import hashlib
    import shutil

    from hf_pretrain.exit_codes import EXIT_CONFIG
    from hf_pretrain.store.cache import local_copy
    from hf_pretrain.store.data.data_upload import upload_prepared
    from hf_pretrain.store.urls import StoreURL, filesystem

    url = s3_server.make_bucket("shard-deleted") + "/smoke"
    store = StoreURL.parse(url)
    fs = filesystem(store)
    homes = {name: tmp_path / name / "home" for name in ("A", "B")}
    prepared_on_a = local_copy(store, "data", homes["A"])  # machine A prepared it: its copy in its cache
    shutil.copytree(smoke_data, prepared_on_a, ignore=shutil.ignore_patterns("logs", "*.blocks", "blocks.json"))
    upload_prepared(prepared_on_a, store, fs, log=lambda _: None)
    meta = json.loads((smoke_data / "meta.json").read_text())
    shard = meta["sources"][0]["splits"]["train"]["files"][0]
    fs.rm_file(store.join(shard["file"]).path)

    def on(machine: str, *args: str):
        env = offline_env() | s3_server.env | {"HF_PRETRAIN_HOME": str(homes[machine])}
        return cli(*args, cwd=Path.cwd(), env=env, timeout=600)

    doctor = on("B", "doctor", "--recipe", "smoke", "--data_dir", url, "--output_dir", str(tmp_path / "run"))
    said = doctor.stdout + doctor.stderr
    lines = said.splitlines()
    rows = [i for i, line in enumerate(lines) if f"{url} lacks {shard['file']}" in line]
    assert doctor.returncode != 0 and len(rows) == 1 and "FAIL" in lines[rows[0]], said[-3000:]
    fix = lines[rows[0] + 1]  # the table's fix, on its own line under the row
    assert "fix: run `hf-pretrain prepare --recipe smoke" in fix and "on the machine that prepared the data" in fix

    elsewhere = on("B", "prepare", "--recipe", "smoke", "--data_dir", url)
    lines = [line for line in elsewhere.stderr.splitlines() if line.strip()]
    assert elsewhere.returncode == EXIT_CONFIG and len(lines) == 1, elsewhere.stdout + elsewhere.stderr
    assert (
        f"{url} lacks {shard['file']}" in lines[0] and "run this same command on the machine that prepared" in lines[0]
    )
    assert f"--data_dir {url}-prepared" in lines[0]  # or a new prefix, with the exact command
    assert not fs.exists(store.join(shard["file"]).path)

    mended = on("A", "prepare", "--recipe", "smoke", "--data_dir", url)
    assert mended.returncode == 0, mended.stdout + mended.stderr
    assert "uploading them again" in mended.stdout and "already prepared" not in mended.stdout
    assert hashlib.sha256(fs.cat_file(store.join(shard["file"]).path)).hexdigest() == shard["sha256"]


# ---------------------------------------------------------------------- a store gone silent (issue 59)
def test_a_read_from_a_store_gone_silent_fails_within_its_bound_naming_the_url(
    store_data, machine, s3_server, monkeypatch
):
    """The store accepts connections and answers nothing: one block's read fails within `read_bound_s`
    (the client's read timeout x botocore's attempts x s3fs's tries), where s3fs's nested retries alone
    waited four times that and the product's tries three times more; the line names the URL, not the cache."""
    import time

    from hf_pretrain.store.data.data_cache import StoreData
    from hf_pretrain.store.store_calls import StoreError, read_bound_s

    url, _, _ = store_data
    monkeypatch.setenv("HF_PRETRAIN_STORE_TIMEOUTS", "1,1")  # a bound of 1 x 3 x 2 = 6 s
    monkeypatch.setenv("HF_PRETRAIN_STORE_RETRY_DELAYS", "0.1")
    home = machine("silent")
    data = StoreData(url, None, 10**9)
    file = next(iter(data.sizes))
    s3_server.proxy.stall()
    try:
        began = time.monotonic()
        with pytest.raises(StoreError) as failed:
            data.block(file, 0)
        took = time.monotonic() - began
    finally:
        s3_server.proxy.restore()
    assert read_bound_s() == 6 and took < read_bound_s() + 3, took
    message = str(failed.value)
    assert f"{url}/{file}" in message and "did not answer within 6 s" in message, message
    assert str(home) not in message and "\n" not in message and FAKE_SECRET not in message


def _blocks_of_step(url: str, step: int, home: Path, monkeypatch) -> list[tuple[str, int]]:
    """The blocks the short run's step `step` reads, as the loader plans them (data/loader.py)."""
    from hf_pretrain.store.data import data_cache
    from tests.helpers import build_train_loader, short_run

    monkeypatch.setenv("HF_PRETRAIN_HOME", str(home))
    monkeypatch.setattr(data_cache, "_SYNCED", {})
    keys = {k: v for k, v in short_run(url, str(home / "unused")).items() if k not in ("phases", "report_to")}
    recipe = load_recipe("smoke", {**keys, "num_workers": 0})
    grad_accum = recipe.grad_accum_steps(1)
    sampler = build_train_loader(recipe, 0, 1, grad_accum, step - 1).batch_sampler
    batches = iter(sampler.inner)
    return sorted({block for _ in range(grad_accum) for block in sampler.blocks_for(next(batches))})


@pytest.mark.slow
def test_the_final_evaluation_never_waits_on_a_store_gone_silent(store_data, s3_server, tmp_path, monkeypatch):
    """Issue 59: the final evaluation read its validation blocks from the store, and one read never returned
    (the watchdog ended the run 601 s later, exit 69). Held before its last step once every block that step
    reads is in the cache, the store goes silent: the run ends 0 with its final evaluation, which reads
    nothing from the store (the validation data was fetched at the start)."""
    import threading
    import time

    from tests.helpers import launch_command, short_run, start_merged

    url, _, _ = store_data
    needed = _blocks_of_step(url, 12, tmp_path / "planner", monkeypatch)
    home, release, run = tmp_path / "home", tmp_path / "release", tmp_path / "run"
    release.mkdir()
    env = (
        offline_env()
        | s3_server.env
        | {
            "HF_PRETRAIN_HOME": str(home),
            "HF_PRETRAIN_FAULTS": "hold:12",
            "HF_PRETRAIN_RELEASE": str(release),
            "HF_PRETRAIN_STORE_TIMEOUTS": "1,2",
            "HF_PRETRAIN_STORE_RETRY_DELAYS": "0.2",
        }
    )
    process = start_merged(launch_command(**short_run(url, run)), tmp_path, env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()

    def cached(file: str, block: int) -> bool:
        return any(home.rglob(f"blocks/rank0/{file}/{block:07d}"))

    deadline = time.monotonic() + 600
    while not (any("holding before step 12" in line for line in lines) and all(cached(*b) for b in needed)):
        assert process.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
        time.sleep(0.2)
    s3_server.proxy.stall()
    try:
        (release / "12").touch()
        process.wait(timeout=300)
        reader.join(timeout=10)
    finally:
        s3_server.proxy.restore()
    out = "".join(lines)
    assert process.returncode == 0, out[-3000:]
    evaluations = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"val_loss"' in x]
    assert [r["step"] for r in evaluations][-1] == 12, evaluations
    assert "Traceback" not in out and FAKE_SECRET not in out


def test_a_data_read_that_fails_mid_run_stops_with_a_checkpoint_and_75_not_78():
    """Inside the loop a failed read is a store that stopped answering, not bad input: the step is dropped,
    the last finished one checkpointed, exit 75 (an engine relaunches), the line naming the data's URL."""
    from hf_pretrain.exit_codes import EXIT_PREEMPTED
    from hf_pretrain.store.store_calls import StoreError
    from hf_pretrain.training.step_attempt import StepAttempt

    def silent(step: int):
        raise StoreError("reading s3://bucket/data/train/00000.bin: the store did not answer within 6 s (1 tries)")

    result, stop = StepAttempt(silent, "cpu")(9)
    assert result is None and stop.exit_code == EXIT_PREEMPTED and stop.saves
    said = stop.message("runs/x/checkpoints/step_00000008")
    assert said.startswith("stopped after step 8: the data could not be read: reading s3://bucket/data/train/00000.bin")
    assert "checkpoint runs/x/checkpoints/step_00000008" in said and "\n" not in said
