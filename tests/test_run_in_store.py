"""A run whose output_dir is an object-store URL (issue 40), against a local S3 server (moto).

The acceptance run: prepared into `s3://` and trained there from folder A, and SIGKILLed once a checkpoint reached the store,
then the same command from folder B with an empty cache finishes it, bit for bit equal to the
uninterrupted reference run. Then the faults: the store cut mid-upload, a checksum mismatch on
download, a store that cannot be used at the start, a second machine on the same URL, and secrets.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_pretrain.exit_codes import EXIT_LOCKED, EXIT_PREFLIGHT
from tests.helpers import (
    OUTSIDE_CHECKOUT,
    cli,
    launch_command,
    offline_env,
    run_captured,
    short_run,
    start_merged,
)
from tests.object_store_server import FAKE_KEY_ID, FAKE_SECRET
from tests.stacks import communicate_or_diagnose, lose_processes


def train_command(data_dir: Path, url: str, **overrides) -> list[str]:
    """`python hf_pretrain/train.py` on the short smoke run, into `url`."""
    return launch_command(**short_run(data_dir, url, **overrides))


def machine(folder: Path, s3_server, **env: str) -> dict:
    """Another machine: its own working folder and an empty cache, only the store's address shared."""
    folder.mkdir(parents=True, exist_ok=True)
    home = str(folder / "home")
    return {"cwd": folder, "env": {**offline_env(), **s3_server.env, "HF_PRETRAIN_HOME": home, **env}}


def working_copy(machine_folder: Path, url: str) -> Path:
    """Where a machine made by `machine` keeps its local copy of the run at `url` (the product's own rule)."""
    from hf_pretrain.store.cache import local_copy
    from hf_pretrain.store.urls import StoreURL

    return local_copy(StoreURL.parse(url), "runs", machine_folder / "home")


def store_fs():
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)


def complete_in_store(url: str) -> list[int]:
    from hf_pretrain.store.run.pull import complete_steps
    from hf_pretrain.store.urls import StoreURL

    return complete_steps(store_fs(), StoreURL.parse(url))


def final_objects(url: str) -> dict[str, tuple[str, str]]:
    """The store's final/ objects of the run at `url`: name -> (ETag, LastModified), read afresh."""
    prefix = f"{url.removeprefix('s3://')}/final/"
    found = store_fs().find(prefix, detail=True)
    return {path.removeprefix(prefix): (info["ETag"], str(info["LastModified"])) for path, info in found.items()}


def wait_until(condition, process: subprocess.Popen, timeout: float = 180, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if process.poll() is not None:
            raise AssertionError(f"the trainer ended first:\n{process.communicate()[0][-3000:]}")
        time.sleep(poll)
    raise AssertionError("timed out")


HELD = {"HF_PRETRAIN_FAULTS": "hold:9"}  # the machine to lose trains to step 8 and waits there (faults.py)


def lose_the_machine_after_a_checkpoint(process: subprocess.Popen, url: str, s3_server, kill) -> None:
    """Lose a machine started with `HELD` once a complete checkpoint is in the store. The run waits
    before step 9 until it is killed, so it cannot reach its end first however fast the machine is
    (issue 49: polling for the checkpoint and killing after raced the short run's last uploads). The
    network goes first, so nothing more reaches the store during the kill, then the processes (`kill`)."""
    wait_until(lambda: complete_in_store(url), process)
    s3_server.proxy.cut()
    try:
        kill()
        process.wait(timeout=60)
    finally:
        s3_server.proxy.restore()


def every_file_text(*folders: Path) -> str:
    return "".join(p.read_bytes().decode("latin-1") for f in folders for p in f.rglob("*") if p.is_file())


@pytest.mark.slow
def test_a_run_killed_on_one_machine_finishes_on_another_bit_for_bit(reference_run, s3_bucket, s3_server, tmp_path):
    """The issue's acceptance run: the data prepared into the store too, so machine B shares no disk with A."""
    url, data_url = f"{s3_bucket}/run", f"{s3_bucket}/data"
    a, b = machine(tmp_path / "A", s3_server, **HELD), machine(tmp_path / "B", s3_server)
    prepared = cli("prepare", "--recipe", "smoke", "--data_dir", data_url, **a, timeout=600)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    first = start_merged(train_command(data_url, url), **a)
    lose_the_machine_after_a_checkpoint(first, url, s3_server, kill=lambda: first.send_signal(signal.SIGKILL))
    log_a = communicate_or_diagnose(first, 60)[0]
    assert first.returncode == -signal.SIGKILL, log_a[-2000:]
    assert not store_fs().exists(f"{url}/final"), "the run finished before the kill"

    second = run_captured(train_command(data_url, url), **b, timeout=600)
    log_b = second.stdout + second.stderr
    assert second.returncode == 0, log_b[-3000:]
    assert "took over the lease" in log_b  # the killed holder's lease, its pid gone
    assert "resumed from" in log_b and "starting from step 0" not in log_b

    reference = load_file(reference_run[0] / "final" / "model.safetensors")
    local_b = working_copy(tmp_path / "B", url)
    finished = load_file(local_b / "final" / "model.safetensors")
    assert reference.keys() == finished.keys()
    assert all(torch.equal(reference[k], finished[k]) for k in reference)
    in_store = tmp_path / "final_from_store.safetensors"
    store_fs().get_file(f"{url}/final/model.safetensors", str(in_store))
    assert all(torch.equal(reference[k], v) for k, v in load_file(in_store).items())

    status = json.loads(store_fs().cat_file(f"{url}/status.json"))
    assert status["state"] == "finished" and status["store"]["last_step"] == 12, status
    assert status["store"]["steps_behind"] == 0 and status["store"]["last_error"] is None
    assert not store_fs().exists(f"{url}/lease.json")  # released at the end

    # the run is named by its URL, never by a machine's cache path: the recipe as run, status.json
    caches = (str(tmp_path / "A" / "home"), str(tmp_path / "B" / "home"))
    for name in ("resolved_recipe.yaml", "status.json"):
        text = store_fs().cat_file(f"{url}/{name}").decode()
        assert url in text and not any(cache in text for cache in caches), (name, text)
    assert f"output_dir: {url}\n" in (local_b / "resolved_recipe.yaml").read_text()
    assert status["checkpoint"] == f"{url}/checkpoints/step_00000012", status

    # (f) no credential anywhere: logs, both local copies (status.json, metrics, recipe), the store's objects
    store_copy = tmp_path / "store_copy"
    store_fs().get(f"{url}/", str(store_copy), recursive=True)
    text = (
        prepared.stdout + prepared.stderr + log_a + log_b + every_file_text(tmp_path / "A", tmp_path / "B", store_copy)
    )
    assert FAKE_SECRET not in text and FAKE_KEY_ID not in text


@pytest.mark.slow
def test_the_store_cut_mid_upload_training_goes_on_and_the_upload_completes(smoke_data, s3_bucket, s3_server, tmp_path):
    """Certain at every point (issue 49): the run waits before step 4 until the store is cut, so step 4's
    checkpoint goes up into the cut, and before step 9 until the test has seen training go on without it."""
    url, release = f"{s3_bucket}/run", tmp_path / "release"
    release.mkdir()
    a = machine(tmp_path / "A", s3_server, HF_PRETRAIN_FAULTS="hold:4,hold:9", HF_PRETRAIN_RELEASE=str(release))
    local = working_copy(tmp_path / "A", url)
    # store_wait_s above the default: on a loaded machine a request caught by the cut may wait out the
    # store client's own timeouts and retries (minutes) before ours take over, and the end waits for it
    trainer = start_merged(train_command(smoke_data, url, store_wait_s=900), **a)
    wait_until(lambda: _logged_steps(local) == 3, trainer)  # held before step 4
    s3_server.proxy.cut()  # the store's server is gone before step 4 is saved and goes up
    try:
        (release / "4").touch()
        wait_until(lambda: _logged_steps(local) == 8, trainer, timeout=300)  # training went on, to the hold at 9
        status = json.loads((local / "status.json").read_text())
        assert status["state"] == "running"
    finally:
        s3_server.proxy.restore()
        (release / "9").touch()
    out = communicate_or_diagnose(trainer, 1200)[0]
    assert trainer.returncode == 0, out[-3000:]
    assert complete_in_store(url)[:1] == [12], (out[-3000:], (local / "status.json").read_text())
    status = json.loads((local / "status.json").read_text())
    assert status["store"]["last_step"] == 12 and status["store"]["steps_behind"] == 0, status["store"]

    # nothing torn is used: a fresh machine pulls the newest checkpoint, verified against its manifest
    from hf_pretrain.store.run.pull import pull_run
    from hf_pretrain.store.urls import StoreURL

    said = []
    assert pull_run(store_fs(), StoreURL.parse(url), tmp_path / "fresh", say=said.append) == 12, said
    assert not any("fails" in line for line in said)


@pytest.mark.slow
def test_a_finished_run_goes_further_on_another_machine(smoke_data, s3_bucket, s3_server, tmp_path):
    """Issue 57: machine A finishes a wsd run in the store; machine B, its cache empty, asks for more steps.
    B had only pulled the newest checkpoint (step 4) and refused: "step_00000003 has no manifest.json", the
    checkpoint before the decay it goes on from being in the store all along."""
    url = f"{s3_bucket}/run"
    wsd = {"lr_schedule": "wsd", "decay_fraction": 0.2, "save_interval": 2, "eval_interval": 0}
    a, b = machine(tmp_path / "A", s3_server), machine(tmp_path / "B", s3_server)
    first = run_captured(train_command(smoke_data, url, max_steps=4, **wsd), **a, timeout=600)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    assert {3, 4} <= set(complete_in_store(url)), complete_in_store(url)  # step 3: the last before the decay
    finished_final = final_objects(url)
    assert any(name.endswith("model.safetensors") for name in finished_final), finished_final

    # The same command relaunched on a fresh node (a restart loop): it ran the loop with nothing to train,
    # said "done: 4 steps" and rebuilt and re-sent final/ (2 GB for the 1b) every time.
    again = run_captured(
        train_command(smoke_data, url, max_steps=4, **wsd), **machine(tmp_path / "C", s3_server), timeout=600
    )
    log = again.stdout + again.stderr
    assert again.returncode == 0, log[-3000:]
    assert f"the run in {url} finished at step 4: nothing to train. To go further" in log, log[-3000:]
    assert "done:" not in log and "final/" not in log, log[-3000:]
    assert final_objects(url) == finished_final  # every object's ETag and LastModified as machine A left them

    further = run_captured(train_command(smoke_data, url, max_steps=8, **wsd), **b, timeout=600)
    log = further.stdout + further.stderr
    assert further.returncode == 0, log[-3000:]
    assert f"final/: in {url}/final" in log, log[-3000:]
    went_further = final_objects(url)  # step 8's weights replaced step 4's in the store
    assert went_further["model.safetensors"] != finished_final["model.safetensors"], (went_further, finished_final)
    assert "store: step 3 too: going further to max_steps 8 starts from it" in log, log[-3000:]
    assert "going further" in log and f"resumed from {url}/checkpoints/step_00000003 at step 3" in log, log[-3000:]
    assert complete_in_store(url)[0] == 8
    status = json.loads(store_fs().cat_file(f"{url}/status.json"))
    assert status["state"] == "finished" and status["store"]["last_step"] == 8, status
    state = json.loads(store_fs().cat_file(f"{url}/checkpoints/step_00000008/train_state.json"))
    assert [entry["branch_step"] for entry in state["lineage"]] == [3], state["lineage"]


HUB_TOKEN = "hf_" + "FakeHubTokenForTheRedactionTest"  # a Hub token's shape, held by the trainer's HF_TOKEN


def test_a_credential_in_a_recipe_value_is_written_nowhere(smoke_data, s3_bucket, s3_server, tmp_path):
    """Issue 57: `--description "key $AWS_SECRET_ACCESS_KEY"` was written verbatim into resolved_recipe.yaml,
    here and in the store. Every file of the run goes through the redaction of its printed lines."""
    url = f"{s3_bucket}/run"
    a = machine(tmp_path / "A", s3_server, HF_TOKEN=HUB_TOKEN)
    said = f"key {FAKE_SECRET} id {FAKE_KEY_ID} hub {HUB_TOKEN}"
    ran = run_captured(train_command(smoke_data, url, max_steps=2, description=said), **a, timeout=600)
    log = ran.stdout + ran.stderr
    assert ran.returncode == 0, log[-3000:]
    local = working_copy(tmp_path / "A", url)
    recipe = (local / "resolved_recipe.yaml").read_text()
    assert "description: key *** id *** hub ***" in recipe, recipe
    assert store_fs().cat_file(f"{url}/resolved_recipe.yaml").decode() == recipe
    store_copy = tmp_path / "store_copy"
    store_fs().get(f"{url}/", str(store_copy), recursive=True)
    text = log + every_file_text(tmp_path / "A", store_copy)  # tensorboard's event files, status.json too
    assert not [secret for secret in (FAKE_SECRET, FAKE_KEY_ID, HUB_TOKEN) if secret in text]


def _logged_steps(local: Path) -> int:
    try:
        return sum(1 for line in (local / "metrics.jsonl").read_text().splitlines() if '"kind": "train"' in line)
    except OSError:
        return 0


def test_a_checksum_mismatch_on_download_falls_back_and_names_the_file(reference_run, s3_bucket, tmp_path):
    from hf_pretrain.store.run.pull import pull_run
    from hf_pretrain.store.urls import StoreURL

    url, fs = f"{s3_bucket}/run", store_fs()
    steps = sorted(p.name for p in (reference_run[0] / "checkpoints").iterdir() if p.name[5:].isdigit())
    for name in steps[-2:]:
        fs.put(str(reference_run[0] / "checkpoints" / name), f"{url}/checkpoints/{name}", recursive=True)
    newest = f"{url}/checkpoints/{steps[-1]}/model.safetensors"
    damaged = bytearray(fs.cat_file(newest))
    damaged[-1] ^= 0xFF  # same size, one bit pattern changed: only the checksum can tell
    fs.pipe_file(newest, bytes(damaged))

    said = []
    step = pull_run(fs, StoreURL.parse(url), tmp_path / "copy", say=said.append)
    assert step == int(steps[-2][5:])
    assert any("model.safetensors fails its checksum" in line and steps[-1] in line for line in said), said
    assert (tmp_path / "copy" / "checkpoints" / steps[-2]).is_dir()
    assert not (tmp_path / "copy" / "checkpoints" / steps[-1]).exists()


def _start(smoke_data, url, env, tmp_path) -> subprocess.CompletedProcess:
    return run_captured(train_command(smoke_data, url), tmp_path, {**offline_env(), **env}, timeout=300)


def test_a_store_that_cannot_be_used_is_refused_at_the_start_in_one_line(smoke_data, s3_server, tmp_path):
    env = {**s3_server.env, "HF_PRETRAIN_HOME": str(tmp_path / "home")}
    missing = _start(smoke_data, "s3://no-such-bucket-here/run", env, tmp_path)
    unreachable = _start(smoke_data, "s3://any-bucket/run", {**env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, tmp_path)
    for result, says in ((missing, "bucket 'no-such-bucket-here' does not exist"), (unreachable, "does not answer")):
        assert result.returncode == EXIT_PREFLIGHT, result.stderr[-2000:]
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and says in lines[0] and "Traceback" not in result.stderr, result.stderr
        assert FAKE_SECRET not in result.stdout + result.stderr
    assert not (tmp_path / "home" / "runs").exists()  # before any work


@pytest.mark.parametrize("url", ["ftp://x/y", "s3://Bad_Bucket!/x"])
def test_a_malformed_data_dir_url_is_refused_in_one_line_before_the_preflight(smoke_data, url, tmp_path):
    """Was the preflight's table with two failed rows (after 30 s of retries for a bad bucket name)."""
    command = train_command(smoke_data, str(tmp_path / "run"))
    command[command.index("--data_dir") + 1] = url
    result = run_captured(command, tmp_path, offline_env(), timeout=300)
    assert result.returncode == EXIT_PREFLIGHT, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "is not a store hf-pretrain knows" in lines[0] or "is not a bucket name" in lines[0]
    assert not (tmp_path / "run").exists()


def test_a_second_machine_on_the_same_url_is_refused_naming_the_first(smoke_data, s3_bucket, s3_server, tmp_path):
    url = f"{s3_bucket}/run"
    lease = {"host": "gpu-box-7", "pid": 4242, "run_id": "abc", "since": "2026-11-26T10:00:00+0000"}
    store_fs().pipe_file(
        f"{url}/lease.json", json.dumps({**lease, "heartbeat": time.time(), "heartbeat_s": 30}).encode()
    )
    result = _start(smoke_data, url, {**s3_server.env, "HF_PRETRAIN_HOME": str(tmp_path / "home")}, tmp_path)
    assert result.returncode == EXIT_LOCKED, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "gpu-box-7" in lines[0] and "2026-11-26T10:00:00" in lines[0], result.stderr
    assert json.loads(store_fs().cat_file(f"{url}/lease.json"))["host"] == "gpu-box-7"  # untouched


def test_a_stale_lease_is_taken_over_and_a_live_one_is_not(s3_bucket):
    from hf_pretrain.store.run.lease import STALE_BEATS, Lease, LeaseHeld
    from hf_pretrain.store.urls import StoreURL

    url, fs = StoreURL.parse(f"{s3_bucket}/run"), store_fs()
    first = Lease(fs, url, heartbeat_s=10)
    assert first.acquire() is None
    with pytest.raises(LeaseHeld, match="is trained by"):
        Lease(fs, url, heartbeat_s=10).acquire()
    # the first holder's machine is lost: its heartbeat ages past STALE_BEATS beats
    record = json.loads(fs.cat_file(url.join("lease.json").path))
    record |= {"host": "lost-spot-instance", "heartbeat": time.time() - STALE_BEATS * 10 - 1}
    fs.pipe_file(url.join("lease.json").path, json.dumps(record).encode())
    second = Lease(fs, url, heartbeat_s=10)
    assert "lost-spot-instance" in second.acquire()
    first.beat()  # the old holder, back from the dead, sees it lost the lease and writes nothing
    assert first.lost_to is not None and first.lost_to.run_id == second.run_id
    assert json.loads(fs.cat_file(url.join("lease.json").path))["run_id"] == second.run_id
    second.release()
    assert not fs.exists(url.join("lease.json").path)


def test_a_local_run_never_imports_a_store_client():
    code = (
        "import sys; from hf_pretrain.config import load_recipe; from hf_pretrain.train import in_store, Where;"
        "import hf_pretrain.training.loop; local = load_recipe('smoke', {'output_dir': 'runs/x'});"
        "recipe, where, store = in_store(local, Where.of(local));"
        "assert store is None and recipe.train.output_dir == 'runs/x' and not where.run.in_store;"
        "bad = [m for m in ('s3fs', 'gcsfs', 'hf_pretrain.store.run.run_sync') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=OUTSIDE_CHECKOUT, env=offline_env(), check=True)


def test_export_report_and_status_read_a_run_url(reference_run, s3_bucket, s3_server, tmp_path, monkeypatch, capsys):
    from hf_pretrain.publish import export_command
    from hf_pretrain.run_commands import report, run_status

    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path / "home"))
    url, fs = f"{s3_bucket}/run", store_fs()
    newest = max(p.name for p in (reference_run[0] / "checkpoints").iterdir() if p.name[5:].isdigit())
    fs.put(str(reference_run[0] / "checkpoints" / newest), f"{url}/checkpoints/{newest}", recursive=True)
    for name in ("metrics.jsonl", "resolved_recipe.yaml", "status.json", "samples.jsonl"):
        fs.put_file(str(reference_run[0] / name), f"{url}/{name}")

    assert export_command.main(["--checkpoint", url, "--out", str(tmp_path / "model"), "--dtype", "fp32"]) == 0
    exported = load_file(tmp_path / "model" / "model.safetensors")
    final = load_file(reference_run[0] / "final" / "model.safetensors")
    assert all(torch.equal(final[k], exported[k]) for k in final)
    assert report.main([url, "--output", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "report.md").is_file() or list((tmp_path / "report").glob("*.md"))
    assert (
        export_command.main(["--checkpoint", "s3://no-such-bucket-x/run", "--out", str(tmp_path / "m2")])
        == EXIT_PREFLIGHT
    )
    capsys.readouterr()
    assert run_status.main([url]) == 0
    said = capsys.readouterr().out
    assert "finished" in said and newest.split("_")[-1].lstrip("0") in said.replace(",", "")
    assert run_status.main(["s3://no-such-bucket-x/run"]) == EXIT_PREFLIGHT


@pytest.mark.slow
def test_a_stop_written_into_the_store_reaches_the_trainer(smoke_data, s3_bucket, s3_server, tmp_path):
    url, release = f"{s3_bucket}/run", tmp_path / "release"
    release.mkdir()
    # held before step 3 until the request is on this machine: it cannot finish first (issue 49)
    a = machine(tmp_path / "A", s3_server, HF_PRETRAIN_FAULTS="hold:3", HF_PRETRAIN_RELEASE=str(release))
    local = working_copy(tmp_path / "A", url)
    trainer = start_merged(train_command(smoke_data, url, max_steps=60, eval_interval=30), **a)
    wait_until(lambda: _logged_steps(local) == 2, trainer)
    laptop = machine(tmp_path / "laptop", s3_server)
    stop = cli("stop", url, **laptop, timeout=120)
    assert stop.returncode == 0, stop.stderr
    assert f"asked the run in {url} " in stop.stdout and f"{url}/stop_request.json" in stop.stdout
    assert str(tmp_path / "laptop" / "home") not in stop.stdout  # the URL, not the view's cache path
    wait_until(lambda: (local / "stop_request.json").exists(), trainer)  # mirrored from the store
    (release / "3").touch()
    out = communicate_or_diagnose(trainer, 600)[0]
    assert trainer.returncode == 0, out[-3000:]
    assert "a stop request for" in out
    assert _logged_steps(local) < 60  # it stopped early
    assert json.loads(store_fs().cat_file(f"{url}/status.json"))["state"] in ("finished", "stopped")


@pytest.fixture
def guarded_store():
    """A store that checks keys and policies (a moto server of its own; the shared one lets all in)."""
    pytest.importorskip("moto.server", reason="the object-store tests need the dev extra (moto[server])")
    from tests.object_store_server import running_authenticating_s3_server

    with running_authenticating_s3_server() as server:
        yield server


def test_wrong_credentials_and_a_read_only_key_are_refused_at_the_start_in_one_line(
    smoke_data, guarded_store, tmp_path
):
    url = f"{guarded_store.bucket}/run"
    home = {"HF_PRETRAIN_HOME": str(tmp_path / "home")}
    key_id, secret = guarded_store.writer
    cases = (
        (("AKIANOSUCHKEY0000000", FAKE_SECRET), "refused the credentials", "does not exist in our records"),
        ((key_id, FAKE_SECRET), "refused the credentials", "signature"),
        (guarded_store.reader, "may not write to", "Access Denied"),
    )
    for key, says, store_said in cases:
        result = _start(smoke_data, url, {**guarded_store.env(key), **home}, tmp_path)
        assert result.returncode == EXIT_PREFLIGHT, result.stderr[-2000:]
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert says in lines[0] and store_said.lower() in lines[0].lower() and url in lines[0], lines[0]
        assert key[1] not in result.stdout + result.stderr  # the secret never shows, refused or not
    assert not (tmp_path / "home" / "runs").exists()  # before any work

    import s3fs

    writer = guarded_store.env(guarded_store.writer)
    fs = s3fs.S3FileSystem(
        key=writer["AWS_ACCESS_KEY_ID"], secret=writer["AWS_SECRET_ACCESS_KEY"], endpoint_url=guarded_store.endpoint
    )
    assert fs.ls(guarded_store.bucket.removeprefix("s3://")) == []  # nothing written: no probe, no lease


def two_process_command(data_dir: Path, url: str, **overrides) -> list[str]:
    """`accelerate launch` of two CPU processes (DDP over gloo) on the short smoke run, into `url`."""
    return launch_command(processes=2, **short_run(data_dir, url, **overrides))


@pytest.mark.slow
def test_two_processes_resume_a_url_run_on_another_machine_bit_for_bit(
    smoke_data, two_process_run, s3_bucket, s3_server, tmp_path
):
    """Each machine's first process pulls; the other waits for the pull before it reads the copy (had it
    read the empty copy, it would start from step 0 beside a first process that resumed)."""
    reference = two_process_run[0]  # uninterrupted, two processes, a local folder
    url = f"{s3_bucket}/run"
    a, b = machine(tmp_path / "A", s3_server, **HELD), machine(tmp_path / "B", s3_server)
    first = subprocess.Popen(
        two_process_command(smoke_data, url), **a, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        # The launcher and its two workers, lost together (a process group would leave the workers: each
        # is in a session of its own, and they would stop gracefully with a checkpoint).
        lose_the_machine_after_a_checkpoint(first, url, s3_server, kill=lambda: lose_processes(first))
    finally:
        lose_processes(first)
    log_a = communicate_or_diagnose(first, 60)[0]
    # No worker outlived its launcher to stop gracefully (what a process group's kill left in CI).
    assert "exited: finishing this step" not in log_a, log_a[-2000:]
    assert not store_fs().exists(f"{url}/final"), "the run finished before the kill"
    resumed_at = complete_in_store(url)[0]

    second = subprocess.run(two_process_command(smoke_data, url), **b, capture_output=True, text=True, timeout=600)
    log = second.stdout + second.stderr
    assert second.returncode == 0, log[-4000:]
    assert "resumed from" in log and f"step {resumed_at}" in log and "starting from step 0" not in log, log[-4000:]
    local_b = working_copy(tmp_path / "B", url)
    expected = load_file(reference / "final" / "model.safetensors")
    finished = load_file(local_b / "final" / "model.safetensors")
    assert expected.keys() == finished.keys()
    assert all(torch.equal(expected[k], finished[k]) for k in expected)


def test_a_runs_half_uploads_are_removed_at_its_next_start_and_no_one_elses(s3_bucket, tmp_path, monkeypatch):
    from hf_pretrain.config import load_recipe
    from hf_pretrain.store.location import Where
    from hf_pretrain.store.run.run_sync import RunInStore
    from hf_pretrain.store.run.uploader import WRITER, Uploader
    from hf_pretrain.store.urls import StoreURL

    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path / "home"))
    url, fs = f"{s3_bucket}/run", store_fs()
    fs.pipe_file(f"{url}/run.json", b'{"run_id": "run-a"}')
    folders = {  # step: (writer, complete)
        4: ("run-a", True),
        8: ("run-a", False),  # this run's, cut short: removed
        12: ("run-b", False),  # another run's: left
        16: (None, False),  # nobody's mark: left
        20: ("run-a", True),
    }
    for step, (writer, complete) in folders.items():
        folder = f"{url}/checkpoints/step_{step:08d}"
        fs.pipe_file(f"{folder}/model.safetensors", b"weights")
        if writer:
            fs.pipe_file(f"{folder}/{WRITER}", json.dumps({"run_id": writer}).encode())
        if complete:
            fs.pipe_file(f"{folder}/manifest.json", b"{}")
            fs.pipe_file(f"{folder}/train_state.json", json.dumps({"step": step}).encode())

    said = []
    recipe = load_recipe("smoke", {"output_dir": url, "keep_checkpoints": 2})
    from hf_pretrain.store.run import run_sync

    monkeypatch.setattr(run_sync, "pull_run", lambda *a, **k: None)  # what the store holds is not a real run
    run = RunInStore.begin(Where.of(recipe).run, recipe.store, recipe.checkpoints, say=said.append)
    try:
        left = {int(p.rstrip("/")[-8:]) for p in fs.ls(f"{url}/checkpoints", detail=False)}
        assert left == {4, 12, 16, 20}, said
        assert any("removed" in line and "step_00000008" in line for line in said), said
        assert any("left" in line and "step_00000012" in line and "run-b" in line for line in said), said
        assert run.uploader.run_id == "run-a"  # every session of the run marks its uploads with the run's id

        # the uploader marks a folder as this run's before its first byte; retention counts complete folders only
        local = tmp_path / "local" / "checkpoints" / "step_00000024"
        local.mkdir(parents=True)
        (local / "model.safetensors").write_bytes(b"w" * 1000)
        (local / "train_state.json").write_text(json.dumps({"step": 24}))
        (local / "manifest.json").write_text("{}")
        uploader = Uploader(fs, StoreURL.parse(url), tmp_path / "local", keep=2, say=said.append, run_id="run-a")
        uploader.submit(local, 24)
        assert uploader.wait(60)
        uploader.close()
        mark = json.loads(fs.cat_file(f"{url}/checkpoints/step_00000024/{WRITER}"))
        assert mark["run_id"] == "run-a"
        left = {int(p.rstrip("/")[-8:]) for p in fs.ls(f"{url}/checkpoints", detail=False)}
        assert left == {12, 16, 20, 24}, left  # 2 complete kept (20, 24); the halves neither counted nor touched
    finally:
        run.close()


def test_a_holder_whose_lease_ran_out_writes_nothing_until_the_store_proves_it_still_holds_it(s3_bucket, tmp_path):
    """The holder's side of the lease's clock (issue 57): past `STALE_BEATS - MARGIN_BEATS` heartbeats without a
    renewal it may be taken over, so the uploader's writes are refused; a renewal conditional on the lease as it
    last wrote it gives them back, and a lease gone from the store meanwhile (taken, trained, released) is lost."""
    from hf_pretrain.store.run.lease import MARGIN_BEATS, STALE_BEATS, Lease
    from hf_pretrain.store.run.uploader import NotHolding, Uploader
    from hf_pretrain.store.urls import StoreURL

    url, fs = StoreURL.parse(f"{s3_bucket}/run"), store_fs()
    lease = Lease(fs, url, heartbeat_s=10)
    assert lease.acquire() is None and lease.may_write()
    uploader = Uploader(fs, url, tmp_path, keep=2, may_write=lease.may_write)
    try:
        lease.renewed -= (STALE_BEATS - MARGIN_BEATS) * 10 + 1  # its heartbeats went unanswered that long
        assert lease.expired() and not lease.may_write()
        with pytest.raises(NotHolding):
            uploader.fs.pipe_file(url.join("status.json").path, b"{}")
        assert not fs.exists(url.join("status.json").path)
        lease.beat()  # the store answers again, and the lease is still this run's: renewed
        assert lease.lost_to is None and lease.may_write()
        uploader.fs.pipe_file(url.join("status.json").path, b"{}")

        lease.renewed -= (STALE_BEATS - MARGIN_BEATS) * 10 + 1
        fs.rm_file(url.join("lease.json").path)  # another machine took it over, finished and released it
        lease.beat()
        assert lease.lost_to is not None and "no one now" in lease.lost_to.describe() and not lease.may_write()
        assert not fs.exists(url.join("lease.json").path)  # not recreated: the run is not this one's any more
        lease.release()  # nothing to release, nothing touched
    finally:
        uploader.close()


def test_the_takeover_says_the_holders_heartbeat_is_older_than_the_lease_not_that_it_is_gone(s3_bucket):
    from hf_pretrain.store.run.lease import STALE_BEATS, Lease
    from hf_pretrain.store.urls import StoreURL

    url, fs = StoreURL.parse(f"{s3_bucket}/run"), store_fs()
    record = {"host": "cut-off-box", "pid": 4242, "run_id": "abc", "since": "2026-11-26T10:00:00+0000"}
    record |= {"heartbeat": time.time() - STALE_BEATS * 2 - 5, "heartbeat_s": 2}
    fs.pipe_file(url.join("lease.json").path, json.dumps(record).encode())
    note = Lease(fs, url, heartbeat_s=2).acquire()
    assert "cut-off-box" in note and "its last heartbeat is older than the lease" in note and "gone" not in note


def _direct(s3_server) -> dict[str, str]:
    """The store's own address, around the proxy: a machine the proxy's cut does not reach."""
    host, port = s3_server.proxy.target
    return {"AWS_ENDPOINT_URL": f"http://{host}:{port}"}


def _store_section(local: Path) -> dict:
    try:
        return json.loads((local / "status.json").read_text()).get("store") or {}
    except (OSError, ValueError):
        return {}


@pytest.mark.slow
def test_the_machine_cut_off_from_the_store_stops_writing_it_and_ends_73_once_another_took_over(
    smoke_data, s3_bucket, s3_server, tmp_path
):
    """Issue 57 (round 8's A38): machine A, held before step 9 with step 8 in the store, is cut off from the
    store (the proxy); machine B, which still reaches the store (its own address), takes the run over once
    A's lease is stale and finishes it. A, back on the network, must find the run lost: nothing of it in the
    store after its lease ran out (not status.json, not a checkpoint, not final/), exit 73 in one line.
    Every wait is on a state the runs write themselves (the store's checkpoint, A's status.json, the lease)."""
    from hf_pretrain.store.run.lease import Holder

    url, release = f"{s3_bucket}/run", tmp_path / "release"
    release.mkdir()
    a = machine(tmp_path / "A", s3_server, HF_PRETRAIN_FAULTS="hold:9", HF_PRETRAIN_RELEASE=str(release))
    b = machine(tmp_path / "B", s3_server, **_direct(s3_server))
    local_a = working_copy(tmp_path / "A", url)
    loser = start_merged(train_command(smoke_data, url, store_heartbeat_s=2), **a)
    try:
        wait_until(lambda: 8 in complete_in_store(url), loser)
        s3_server.proxy.cut()
        wait_until(lambda: _store_section(local_a).get("lease", "").startswith("run out"), loser)

        import s3fs

        direct = s3fs.S3FileSystem(
            skip_instance_cache=True, use_listings_cache=False, endpoint_url=_direct(s3_server)["AWS_ENDPOINT_URL"]
        )

        def stale() -> bool:
            record = json.loads(direct.cat_file(f"{url}/lease.json"))
            return Holder(**{k: record[k] for k in Holder.__dataclass_fields__}).is_stale()

        wait_until(stale, loser)  # B would be refused (73) before: it starts once it may take over
        winner = run_captured(train_command(smoke_data, url, store_heartbeat_s=2), **b, timeout=600)
        log_b = winner.stdout + winner.stderr
        assert winner.returncode == 0, log_b[-3000:]
        assert "took over the lease" in log_b and "its last heartbeat is older than the lease" in log_b, log_b[-3000:]
        assert "resumed from" in log_b and "holder is gone" not in log_b
        store_after_b = {path: info.get("ETag") for path, info in direct.find(url, detail=True).items()}
        assert f"{url}/final/model.safetensors".removeprefix("s3://") in store_after_b

        s3_server.proxy.restore()
        wait_until(lambda: _store_section(local_a).get("lease", "").startswith("lost to"), loser)
        (release / "9").touch()
        out = communicate_or_diagnose(loser, 300)[0]
    finally:
        s3_server.proxy.restore()
        (release / "9").touch()
        if loser.poll() is None:
            loser.kill()
    assert loser.returncode == EXIT_LOCKED, out[-3000:]
    ending = [line for line in out.splitlines() if line.startswith("stopped after step 9:")]
    assert len(ending) == 1 and url in ending[0] and "exit 73" in ending[0], out[-3000:]
    assert "Traceback" not in out and "was not renewed for" in out, out[-3000:]
    assert "this machine lost the run" in ending[0] and "nothing of this session is missing" not in out
    # the store is exactly as B left it: A wrote nothing once its lease ran out
    store_now = {path: info.get("ETag") for path, info in direct.find(url, detail=True).items()}
    assert store_now == store_after_b
    status = json.loads(direct.cat_file(f"{url}/status.json"))
    assert status["state"] == "finished", status
    local_status = json.loads((local_a / "status.json").read_text())
    assert local_status["state"] == "lost" and local_status["exit_code"] == EXIT_LOCKED, local_status
    assert not (local_a / "checkpoints" / "step_00000009").exists()  # no checkpoint of a run that is another's
