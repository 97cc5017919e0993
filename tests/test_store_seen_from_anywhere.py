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


# ------------------------------------------------------------------------------------ 2. a store that stops answering


def fake_checkpoint(run: Path, step: int, size: int = 4096, max_steps: int = 12) -> Path:
    """A sealed checkpoint folder (weights of `size` bytes, its train state, its manifest): the uploader
    and the readers need nothing more of one."""
    from hf_pretrain.checkpoints.layout import checkpoint_path
    from hf_pretrain.checkpoints.manifest import write_manifest

    folder = checkpoint_path(run, step)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(os.urandom(size))
    state = {"step": step, "max_steps": max_steps, "tokens_seen": step * 2048}
    (folder / "train_state.json").write_text(json.dumps(state))
    write_manifest(folder)
    return folder


def store_of(url: str):
    """The product's own client of `url` (its timeouts and retries), and the parsed URL."""
    from hf_pretrain.object_store.urls import StoreURL, filesystem

    parsed = StoreURL.parse(url)
    return filesystem(parsed), parsed


def complete_in_store(url: str) -> list[int]:
    from hf_pretrain.object_store.pull import complete_steps

    fs, parsed = store_of(url)
    return complete_steps(fs, parsed)


UPLOAD_INTO_A_BLACK_HOLE = """
import sys, time
from pathlib import Path
from hf_pretrain.object_store.transfer import put_files
from hf_pretrain.object_store.uploader import Uploader
from hf_pretrain.object_store.urls import StoreURL, filesystem
url, run, wait_s = StoreURL.parse(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
uploader = Uploader(filesystem(url), url, run, keep=3, say=lambda line: None)
uploader.submit(run / "checkpoints" / "step_00000004", 4)
began = time.monotonic()
done = uploader.wait(wait_s)
uploader.close(timeout=1)
print(f"done={done} waited={time.monotonic() - began:.1f} missing={uploader.missing()}", flush=True)
# final/ at a run's end goes up from the main thread, with the same deadline
began = time.monotonic()
files = [(p, url.join("final", p.name).path) for p in (run / "checkpoints" / "step_00000004").iterdir()]
sent = put_files(filesystem(url), files, keep_trying=lambda: time.monotonic() < began + wait_s)
print(f"sent={sent} waited={time.monotonic() - began:.1f}", flush=True)
print(f"exiting {time.time()}", flush=True)
"""


def test_a_black_holed_store_bounds_the_wait_and_the_process_exits(s3_bucket, s3_server, tmp_path):
    """The store accepts connections and answers nothing: `wait(store_wait_s)` returns in its time, the
    step is named as missing, and the interpreter's exit joins no upload blocked in a request (it did:
    a ThreadPoolExecutor's worker, in s3fs's put_file, kept a finished run alive for 21 minutes)."""
    import subprocess
    import sys

    from tests.helpers import offline_env

    run = tmp_path / "run"
    fake_checkpoint(run, 4, size=1 << 20)
    s3_server.proxy.stall()
    try:
        done = subprocess.run(
            [sys.executable, "-c", UPLOAD_INTO_A_BLACK_HOLE, f"{s3_bucket}/run", str(run), "3"],
            env={**offline_env(), **s3_server.env},  # the client's own timeouts: read 20 s, a request 120 s
            capture_output=True,
            text=True,
            timeout=120,
        )
        exited = time.time()
    finally:
        s3_server.proxy.restore()
    assert done.returncode == 0, done.stderr[-2000:]
    said = done.stdout.splitlines()
    assert said[0].startswith("done=False") and "missing=[4]" in said[0], said
    assert said[1].startswith("sent=False"), said
    for line in said[:2]:  # store_wait_s, plus the 0.2 s poll and the join of `close(timeout=1)`
        assert 3 <= float(line.split("waited=")[1].split()[0]) < 3 + 2, said
    shutdown_s = exited - float(said[2].split()[1])
    assert shutdown_s < 10, f"the interpreter's exit waited {shutdown_s:.0f} s on a blocked upload"
    assert not complete_in_store(f"{s3_bucket}/run")


def test_a_throttling_store_still_completes_every_checkpoint(s3_bucket, s3_server, tmp_path):
    """A third of the requests answered 503 SlowDown (S3 under load): every checkpoint completes, each
    object the size of its file, and the 503s were really sent."""
    from hf_pretrain.object_store.uploader import Uploader

    run, url = tmp_path / "run", f"{s3_bucket}/run"
    fs, parsed = store_of(url)
    before = s3_server.proxy.throttled
    s3_server.proxy.throttle(0.35)
    try:
        uploader = Uploader(fs, parsed, run, keep=5, say=lambda line: None)
        for step in (4, 8, 12):
            uploader.submit(fake_checkpoint(run, step, size=200_000), step)
            assert uploader.wait(120), uploader.progress.last_error
        uploader.close()
    finally:
        s3_server.proxy.throttle(0.0)
    assert s3_server.proxy.throttled - before >= 3
    assert complete_in_store(url) == [12, 8, 4]
    for step in (4, 8, 12):
        name = f"step_{step:08d}"
        assert fs.size(f"{parsed.path}/checkpoints/{name}/model.safetensors") == 200_000


def test_a_short_object_never_makes_a_checkpoint_complete(s3_bucket, s3_server, tmp_path):
    """The store keeps a cut-short object (a throttled part, an unflushed write): the sizes are checked
    before the manifest goes, the short one is sent again, and at the manifest's write every object is whole."""
    from hf_pretrain.object_store.uploader import Uploader

    run, url = tmp_path / "run", f"{s3_bucket}/run"
    fs, parsed = store_of(url)
    folder = fake_checkpoint(run, 4, size=100_000)
    real_put, torn = fs.put_file, []

    def put_file(lpath, rpath, **kwargs):
        if rpath.endswith("model.safetensors") and not torn:  # the first time: half of it arrives
            torn.append(rpath)
            return fs.pipe_file(rpath, Path(lpath).read_bytes()[:50_000])
        if rpath.endswith("manifest.json"):
            size = fs.size(rpath.replace("manifest.json", "model.safetensors"))
            assert size == 100_000, f"the manifest went up beside a {size}-byte object"
        return real_put(lpath, rpath, **kwargs)

    fs.put_file = put_file
    uploader = Uploader(fs, parsed, run, keep=3, say=lambda line: None)
    uploader.submit(folder, 4)
    assert uploader.wait(60), uploader.progress.last_error
    uploader.close()
    assert torn and complete_in_store(url) == [4]
    assert fs.size(torn[0]) == 100_000


def test_the_next_start_uploads_every_missing_step_and_final_first(s3_bucket, s3_server, tmp_path, monkeypatch):
    """status.json of a session whose store was down names steps 8 and 12 and final/ as not in the store:
    the next start uploads all three (the step before the newest too, and final/), then says so."""
    from hf_pretrain.config import parse_recipe_args
    from hf_pretrain.object_store.run_sync import RunInStore, working_copy

    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path / "home"))
    url = f"{s3_bucket}/run"
    argv = ["--recipe", "smoke", "--output_dir", url, "--data_dir", str(tmp_path)]
    recipe, _ = parse_recipe_args(argv, prog="test", description="")
    local = working_copy(recipe)
    for step in (4, 8, 12):
        fake_checkpoint(local, step)
    (local / "final").mkdir()
    (local / "final" / "model.safetensors").write_bytes(b"w" * 1000)
    store_section = {"url": url, "last_step": 4, "not_in_store": [8, 12, "final"]}
    (local / "status.json").write_text(json.dumps({"state": "finished", "store": store_section}))
    said: list[str] = []
    store = RunInStore.begin(recipe, say=said.append)
    store.wait()
    assert store.behind() is None
    store.close()
    assert complete_in_store(url) == [12, 8]  # step 4 stays local: the store never had it, none named it
    fs, parsed = store_of(url)
    assert fs.size(f"{parsed.path}/final/model.safetensors") == 1000
    text = "\n".join(said)
    for step in (8, 12):
        assert f"step {step} is not in {url} yet: uploading it first" in text
        assert f"step {step}: in {url}/checkpoints/step_{step:08d}" in text
    assert "final/ is not in" in text and f"final/: in {url}/final" in text
    assert str(tmp_path / "home") not in text, text


# ------------------------------------------------------------------------------------ 3. one writer of status.json


def test_two_writers_of_status_json_at_once_lose_nothing(tmp_path):
    """The session and a URL run's store thread write status.json at once (and the watchdog from another
    process): each read-modify-write holds the one lock, so neither's last change is lost."""
    import subprocess
    import sys

    from hf_pretrain.run_dir import read_status, update_status

    (tmp_path / "status.json").write_text("{}")
    rounds = 200
    other_process = (
        "import sys\nfrom hf_pretrain.run_dir import update_status\n"
        f"for i in range({rounds}):\n    update_status(sys.argv[1], lambda s, i=i: {{**s, 'watchdog': i}})\n"
    )
    process = subprocess.Popen([sys.executable, "-c", other_process, str(tmp_path)])

    def writer(key: str) -> None:
        for i in range(rounds):
            update_status(tmp_path, lambda s, i=i: {**s, key: i})

    threads = [threading.Thread(target=writer, args=(k,)) for k in ("session", "store")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert process.wait(timeout=120) == 0
    status = read_status(tmp_path)
    assert status == {"session": rounds - 1, "store": rounds - 1, "watchdog": rounds - 1}, status


# ------------------------------------------------------------------------------------ 3. `status URL` from the store


def put_run(url: str, tmp_path: Path, steps=(4, 8), status: dict | None = None) -> None:
    """A run in the store as a training machine leaves it: complete checkpoints, its records."""
    fs, parsed = store_of(url)
    source = tmp_path / "source"
    for step in steps:
        folder = fake_checkpoint(source, step, max_steps=12)
        fs.put(str(folder), f"{parsed.path}/checkpoints/{folder.name}", recursive=True)
    recipe = "train:\n  max_steps: 12\ndata:\n  data_dir: s3://corpus/smoke-prepared\n"
    fs.pipe_file(f"{parsed.path}/resolved_recipe.yaml", recipe.encode())
    if status is not None:
        fs.pipe_file(f"{parsed.path}/status.json", json.dumps(status).encode())


def test_status_of_a_url_answers_from_the_store_on_a_fresh_machine(s3_bucket, s3_server, tmp_path, monkeypatch, capsys):
    """A machine that never saw the run: state, step N of M and the newest complete checkpoint in the
    store (no `--verify`, no weights pulled), how far the store is behind, the lease, the data URL; a
    live run with a fresh lease is `running`, never `killed`; the cache's path is on no line."""
    from hf_pretrain import run_status
    from hf_pretrain.object_store.lease import Lease

    home = tmp_path / "home"
    monkeypatch.setenv("HF_PRETRAIN_HOME", str(home))
    url = f"{s3_bucket}/run"
    section = {"url": url, "last_step": 8, "steps_behind": 3, "not_in_store": [11], "updated": "now"}
    put_run(url, tmp_path, status={"state": "running", "updated": "2026-01-01T00:00:00+0000", "store": section})
    fs, parsed = store_of(url)
    lease = Lease(fs, parsed, heartbeat_s=30)
    lease.acquire()  # the training machine, alive

    assert run_status.main([url]) == 0
    said = capsys.readouterr().out
    assert said.splitlines()[0].startswith(f"{url}: running, step 8 of 12"), said
    assert "killed" not in said
    assert f"last checkpoint: {url}/checkpoints/step_00000008 (step 8; complete in the store" in said
    assert f"step 8 is the newest checkpoint in {url}" in said and "not in the store yet: step 11" in said
    assert "lease: " in said and "(fresh)" in said
    assert "data: s3://corpus/smoke-prepared" in said
    assert str(home) not in said, said
    assert not list(home.rglob("model.safetensors")), "status pulled weights"

    lease.release()  # the machine is gone, its status.json still says running: killed
    assert run_status.main([url]) == 0
    said = capsys.readouterr().out
    assert said.splitlines()[0].startswith(f"{url}: killed, step 8 of 12"), said


def test_status_skips_a_checkpoint_whose_objects_do_not_match_its_manifest(s3_bucket, s3_server, tmp_path, capsys):
    from hf_pretrain import run_status

    url = f"{s3_bucket}/run"
    put_run(url, tmp_path, status={"state": "stopped"})
    fs, parsed = store_of(url)
    fs.pipe_file(f"{parsed.path}/checkpoints/step_00000008/model.safetensors", b"short")
    assert run_status.main([url]) == 0
    said = capsys.readouterr().out
    assert "step 4 of 12" in said and "step_00000008: model.safetensors is 5 bytes" in said, said


def test_a_machine_that_lost_its_lease_stops_writing_the_store(s3_bucket, s3_server, tmp_path, monkeypatch):
    """Another machine took the run over: this one's heartbeat sees it, and from then on neither its
    status.json nor its lease release reaches the store, and its end waits for nothing."""
    from hf_pretrain.config import parse_recipe_args
    from hf_pretrain.object_store.run_sync import RunInStore

    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path / "home"))
    url = f"{s3_bucket}/run"
    argv = ["--recipe", "smoke", "--output_dir", url, "--data_dir", str(tmp_path), "--store_wait_s", "600"]
    recipe, _ = parse_recipe_args(argv, prog="test", description="")
    store = RunInStore.begin(recipe, say=lambda line: None)
    fs, parsed = store_of(url)
    theirs = {
        "host": "other",
        "pid": 1,
        "run_id": "theirs",
        "since": "now",
        "heartbeat": time.time(),
        "heartbeat_s": 30,
    }
    fs.pipe_file(f"{parsed.path}/lease.json", json.dumps(theirs).encode())
    fs.pipe_file(f"{parsed.path}/status.json", b'{"state": "finished", "pid": 1}')
    assert store._heartbeat() is False  # what the store's thread does every store_heartbeat_s
    assert store.lease.lost_to is not None and store.lease.lost_to.host == "other"
    (store.local / "status.json").write_text(json.dumps({"state": "running", "pid": os.getpid()}))
    store.on_checkpoint_saved(fake_checkpoint(store.local, 4), 4)
    began = time.monotonic()
    store.session_started()
    store.wait()
    store.close()
    assert time.monotonic() - began < 30  # not store_wait_s (600 s)
    assert json.loads(fs.cat_file(f"{parsed.path}/status.json")) == {"state": "finished", "pid": 1}
    assert not complete_in_store(url)  # step 4 was saved after the takeover: not this machine's to upload
    assert json.loads(fs.cat_file(f"{parsed.path}/lease.json"))["run_id"] == "theirs"
    assert "lost to other" in json.loads((store.local / "status.json").read_text())["store"]["lease"]
