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
# issue 57: each trained into a local folder (` s3:`, `s3`, `file:`) and exited 0, or was a traceback
TYPOS += [" s3://bkt/x", "s3//bkt/x", "file:///tmp/x"]
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
    from hf_pretrain.store.urls import StoreUnavailable, check_location

    with pytest.raises(StoreUnavailable, match=r"write it as s3://bkt/runs/x"):
        check_location("s3:/bkt/runs/x")
    with pytest.raises(StoreUnavailable, match=r"write it as s3://bkt/x"):
        check_location("S3://bkt/x")
    # the intent named (issue 57): a URL with a space around it, without its colon, a file URL's path
    with pytest.raises(StoreUnavailable, match=r"^' s3://bkt/x' has blank space around a URL; write it as s3://bkt/x$"):
        check_location(" s3://bkt/x")
    with pytest.raises(StoreUnavailable, match=r"without its colon; write it as s3://bkt/x, or \./s3//bkt/x for a"):
        check_location("s3//bkt/x")
    with pytest.raises(StoreUnavailable, match=r"is a file URL; write the local folder's path itself: /tmp/my run$"):
        check_location("file:///tmp/my%20run")
    for fine in ("runs/x", "./s3:/x", "C:/x", "hold:12", "s3://bkt/x", "/abs/path", " runs/x", "./s3//x"):
        check_location(fine, any_arg=True)  # local paths, a fault's spelling, a real URL: no refusal


def test_train_launched_without_the_cli_refuses_a_typo_too(capsys):
    """`accelerate launch hf_pretrain/train.py` does not pass through cli.py: train.py checks itself."""
    from hf_pretrain import train

    assert train.main(["--recipe", "smoke", "--output_dir", "s3:/bkt/runs/x"]) == EXIT_CONFIG
    assert "write it as s3://bkt/runs/x" in capsys.readouterr().err
    assert not Path("s3:").exists()


EMPTY = {  # issue 57: an engine's task with `RUN_URL=` empty trained into the working directory, exit 0
    "train": ["--recipe", "smoke", "--output_dir", ""],
    "doctor": ["--recipe", "smoke", "--data_dir", " "],
    "check": ["--recipe", "smoke", "--output_dir", "", "--data_dir", "s3://bkt/data"],
    "prepare": ["--recipe", "smoke", "--data_dir="],
}


def exit_code(main, argv: list[str]) -> int:
    """What `main(argv)` exits with, returned or raised (argparse's refusal raises SystemExit)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("command", sorted(EMPTY))
def test_an_empty_run_or_data_location_is_refused_in_one_line_naming_the_key(command, capsys):
    assert exit_code(cli.main, [command, *EMPTY[command]]) == EXIT_CONFIG
    err = capsys.readouterr().err.strip().splitlines()
    key, folder = ("data_dir", "data/smoke") if command in ("doctor", "prepare") else ("output_dir", "runs/smoke")
    assert err == [
        f"hf-pretrain {command}: error: {key} is empty (an unset variable in the command line?): give a folder "
        f"or a store URL, e.g. --{key} {folder} or --{key} s3://BUCKET/{folder}"
    ], err
    assert not list(Path.cwd().iterdir()), "nothing may be written before the refusal"


def test_train_launched_without_the_cli_refuses_an_empty_output_dir(capsys):
    from hf_pretrain import train

    assert exit_code(train.main, ["--recipe", "smoke", "--output_dir", ""]) == EXIT_CONFIG
    assert "output_dir is empty" in capsys.readouterr().err
    assert not list(Path.cwd().iterdir())


def test_the_check_table_names_a_run_as_given_and_leaves_an_empty_path_alone():
    """`"".replace("", shown)` put the shown name between every character of every row."""
    from hf_pretrain.preflight.checks import _named_as_given
    from hf_pretrain.preflight.result import CheckResult

    rows = [CheckResult("output_dir", "fail", "cannot write here", "give another --output_dir")]
    assert _named_as_given(rows, "", None) == rows
    named = _named_as_given(rows + [CheckResult("resume", "pass", "no checkpoint in /c/run")], "/c/run", "s3://b/r")
    assert [r.reason for r in named] == ["cannot write here", "no checkpoint in s3://b/r"]


def test_a_dot_dot_url_never_leaves_the_cache():
    from hf_pretrain.store.urls import StoreUnavailable, StoreURL

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
    from hf_pretrain.store.urls import StoreURL, filesystem

    parsed = StoreURL.parse(url)
    return filesystem(parsed), parsed


def complete_in_store(url: str) -> list[int]:
    from hf_pretrain.store.run.pull import complete_steps

    fs, parsed = store_of(url)
    return complete_steps(fs, parsed)


UPLOAD_INTO_A_BLACK_HOLE = """
import sys, time
from pathlib import Path
from hf_pretrain.store.run.transfer import put_files
from hf_pretrain.store.run.uploader import Uploader
from hf_pretrain.store.urls import StoreURL, filesystem
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
    from hf_pretrain.store.run.uploader import Uploader

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


def test_a_checkpoint_past_its_upload_deadline_lets_the_newer_one_go_first(s3_bucket, s3_server, tmp_path, monkeypatch):
    """Once a rate is measured, a checkpoint's upload has a deadline (UPLOAD_SLACK x its bytes at that
    rate, at least UPLOAD_FLOOR_S, here 1 s): step 8, every request answered 503 SlowDown, passes it and
    says so once; the newer step 12 goes first when the store takes writes again, and step 8, dropped as
    retention would drop it, never holds it up.

    Nothing here races the uploader's thread: step 12 is queued from that thread as step 8 starts (before
    step 8's clock does), and step 8's deadline line raises the floor from that thread before step 12
    starts, so that step 12, throttled until the test lifts the throttle, waits out a loaded machine
    instead of passing a 1 s deadline of its own (CI once saw it do so)."""
    from hf_pretrain.store.run import uploader as uploading
    from hf_pretrain.store.run.uploader import Uploader

    monkeypatch.setattr(uploading, "UPLOAD_FLOOR_S", 1.0)
    run, url = tmp_path / "run", f"{s3_bucket}/run"
    fs, parsed = store_of(url)
    said: list[str] = []
    twelve = fake_checkpoint(run, 12, size=200_000)  # saved while step 8 is on its way (queued below)
    queued: list[int] = []

    def on_change() -> None:  # the uploader's thread, as an upload starts (and the test's, on a submit)
        if uploader.progress.uploading == 8 and not queued:
            queued.append(12)
            uploader.submit(twelve, 12)

    def say(line: str) -> None:
        said.append(line)
        if line.startswith("step 8: its upload passed its deadline"):
            monkeypatch.setattr(uploading, "UPLOAD_FLOOR_S", 600.0)  # step 12's deadline: past the test

    uploader = Uploader(fs, parsed, run, keep=5, say=say, on_change=on_change)
    uploader.submit(fake_checkpoint(run, 4, size=200_000), 4)
    assert uploader.wait(60), uploader.progress.last_error  # the rate measured: 200 kB on this server
    s3_server.proxy.throttle(1.0)
    try:
        uploader.submit(fake_checkpoint(run, 8, size=200_000), 8)
        deadline = time.monotonic() + 60
        while not any(line.startswith("step 8: its upload passed its deadline") for line in said):
            assert time.monotonic() < deadline, said
            time.sleep(0.1)
    finally:
        s3_server.proxy.throttle(0.0)
    assert queued == [12]
    assert uploader.wait(120), uploader.progress.last_error
    uploader.close()
    assert complete_in_store(url) == [12, 4]
    late = [line for line in said if "passed its deadline" in line]
    assert len(late) == 1 and "MB/s measured, at least 1 s" in late[0], said


def test_a_short_object_never_makes_a_checkpoint_complete(s3_bucket, s3_server, tmp_path):
    """The store keeps a cut-short object (a throttled part, an unflushed write): the sizes are checked
    before the manifest goes, the short one is sent again, and at the manifest's write every object is whole."""
    from hf_pretrain.store.run.uploader import Uploader

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
    from hf_pretrain.store.location import Where
    from hf_pretrain.store.run.run_sync import RunInStore

    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path / "home"))
    url = f"{s3_bucket}/run"
    argv = ["--recipe", "smoke", "--output_dir", url, "--data_dir", str(tmp_path)]
    recipe, _ = parse_recipe_args(argv, prog="test", description="")
    local = Where.of(recipe).run.local
    for step in (4, 8, 12):
        fake_checkpoint(local, step)
    (local / "final").mkdir()
    (local / "final" / "model.safetensors").write_bytes(b"w" * 1000)
    store_section = {"url": url, "last_step": 4, "not_in_store": [8, 12, "final"]}
    (local / "status.json").write_text(json.dumps({"state": "finished", "store": store_section}))
    fs, parsed = store_of(url)
    fs.pipe_file(f"{parsed.path}/run.json", b'{"run_id": "earlier"}')  # the session that trained it wrote this
    said: list[str] = []
    store = RunInStore.begin(Where.of(recipe).run, recipe.store, recipe.checkpoints, say=said.append)
    store.wait()
    assert store.behind() is None
    store.close()
    assert complete_in_store(url) == [12, 8]  # step 4 stays local: the store never had it, none named it
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

    from hf_pretrain.run_folder.run_dir import read_status, update_status

    (tmp_path / "status.json").write_text("{}")
    rounds = 200
    other_process = (
        "import sys\nfrom hf_pretrain.run_folder.run_dir import update_status\n"
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
    from hf_pretrain.run_commands import run_status
    from hf_pretrain.store.run.lease import Lease

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

    record = json.loads(fs.cat_file(lease.path))  # the machine dies: its lease stays behind and goes stale
    fs.pipe_file(lease.path, json.dumps({**record, "heartbeat": record["heartbeat"] - 3600}).encode())
    assert run_status.main([url]) == 0
    said = capsys.readouterr().out
    assert said.splitlines()[0].startswith(f"{url}: killed, step 8 of 12"), said

    # issue 57: a process that ended by itself released its lease; its status.json saying running is a last
    # write that did not reach the store, not a kill
    lease.release()
    assert run_status.main([url]) == 0
    said = capsys.readouterr().out
    assert said.splitlines()[0].startswith(f"{url}: ended, its last status not in the store, step 8"), said
    assert "killed" not in said


def test_status_skips_a_checkpoint_whose_objects_do_not_match_its_manifest(s3_bucket, s3_server, tmp_path, capsys):
    from hf_pretrain.run_commands import run_status

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
    from hf_pretrain.store.location import Where
    from hf_pretrain.store.run.run_sync import RunInStore

    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path / "home"))
    url = f"{s3_bucket}/run"
    argv = ["--recipe", "smoke", "--output_dir", url, "--data_dir", str(tmp_path), "--store_wait_s", "600"]
    recipe, _ = parse_recipe_args(argv, prog="test", description="")
    store = RunInStore.begin(Where.of(recipe).run, recipe.store, recipe.checkpoints, say=lambda line: None)
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
    assert store.lost_the_run()  # status.json's `next` then offers no rerun here (train.py)
    behind = store.behind()  # the last line's: no advice to rerun here, which would fight the new holder
    assert "step 4" in behind and "the run is other's now" in behind and "rerun" not in behind, behind


# ------------------------------------------------------------------------------------ end to end


def data_in_store(smoke_data: Path, bucket: str) -> str:
    """The prepared smoke data uploaded as `prepare --data_dir s3://...` leaves it: its URL."""
    import shutil

    from hf_pretrain.store.data.data_upload import upload_prepared
    from hf_pretrain.store.urls import StoreURL, filesystem

    url = f"{bucket}/data"
    copy = smoke_data.parent / f"smoke_for_{bucket.split('//')[1]}"
    if not copy.exists():
        shutil.copytree(smoke_data, copy, ignore=shutil.ignore_patterns("logs", "*.blocks", "blocks.json"))
    upload_prepared(copy, StoreURL.parse(url), filesystem(StoreURL.parse(url)), log=lambda _: None)
    return url


def trainer_command(data: str, url: str, **overrides) -> list[str]:
    from tests.helpers import launch_command, short_run

    keys = short_run(data, url, **overrides)
    return launch_command(**{key: value for key, value in keys.items() if value is not None})  # None: left out


def trainer(data: str, url: str, env: dict, **overrides):
    """The trainer of tests/test_run_in_store.py, its output read line by line with the time of each."""
    from tests.helpers import start_merged

    process = start_merged(trainer_command(data, url, **overrides), **env)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in process.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return process, lines, reader


def a_machine(folder: Path, s3_server, **env: str) -> dict:
    from tests.helpers import offline_env

    folder.mkdir(parents=True, exist_ok=True)
    return {"cwd": folder, "env": {**offline_env(), **s3_server.env, "HF_PRETRAIN_HOME": str(folder / "home"), **env}}


def test_a_store_that_never_answers_at_the_start_is_said_at_once_then_refused_within_its_bound(
    smoke_data, s3_bucket, s3_server, tmp_path, monkeypatch
):
    """Issue 57: a store that accepts connections and answers nothing kept the start silent for minutes (185 s)
    before its line. A line naming the URL and the client's bound comes while the store is waited for, long
    before the refusal that ends the wait (exit 78, one line, no traceback)."""
    from hf_pretrain.exit_codes import EXIT_PREFLIGHT
    from hf_pretrain.store.reach import SILENT_S
    from hf_pretrain.store.schemes import TIMEOUTS_VARIABLE
    from hf_pretrain.store.urls import request_bound_s

    read_s = 5  # short client timeouts: the refusal in 36 s, not 126 s; still far past the waiting line's SILENT_S
    monkeypatch.setenv(TIMEOUTS_VARIABLE, f"1,{read_s}")  # the trainer's client (its env copies this one's), and here
    bound_s = request_bound_s()
    a = a_machine(tmp_path / "A", s3_server)
    url = f"{s3_bucket}/run"
    s3_server.proxy.stall()
    try:
        started = time.monotonic()
        process, lines, reader = trainer(str(smoke_data), url, a)
        process.wait(timeout=bound_s * 4)  # the refusal ends it: nothing here waits on a clock of its own
        reader.join(timeout=10)
    finally:
        s3_server.proxy.restore()
    out = "\n".join(text for _, text in lines)
    assert process.returncode == EXIT_PREFLIGHT, out[-3000:]
    waiting = [(t, text) for t, text in lines if text.startswith("store: no answer yet from")]
    refused = [(t, text) for t, text in lines if "does not answer" in text]
    assert len(waiting) == 1 and len(refused) == 1 and "Traceback" not in out, out[-3000:]
    (said_at, said), (refused_at, refusal) = waiting[0], refused[0]
    assert url in said and f"waiting for it at most {bound_s:.0f} s (read timeout {read_s:g} s x" in said, said
    assert url in refusal and refusal.startswith("train.py: "), refusal
    # read as the lines arrived: the waiting line within the bound from the start, and well before the refusal,
    # which only the client's timeouts end; that within the bound said (botocore's 4 attempts for "3" overran it)
    assert said_at - started < bound_s, (said_at - started, bound_s)
    assert (bound_s - SILENT_S) / 2 < refused_at - said_at < bound_s, (refused_at - said_at, bound_s)


def test_the_bound_docs_moving_runs_states_is_the_clients(monkeypatch):
    """The 126 s docs/moving-runs.md states twice is what the client's bounds add up to (it said 120 s
    while botocore made 4 attempts of the 3 set: 185 s)."""
    from hf_pretrain.store.schemes import TIMEOUTS_VARIABLE
    from hf_pretrain.store.urls import StoreURL, client_options, request_bound_s
    from tests.helpers import ROOT

    monkeypatch.delenv(TIMEOUTS_VARIABLE, raising=False)
    text = " ".join((ROOT / "docs" / "moving-runs.md").read_text().split())
    bound = f"{request_bound_s():.0f} s"
    assert f"waiting for it at most {bound}" in text and f"{bound} at most" in text, bound
    retries = client_options(StoreURL.parse("s3://bkt/x"))["config_kwargs"]["retries"]
    assert retries == {"mode": "standard", "total_max_attempts": 3}, retries  # every attempt counted, the first too


STORE_WAIT_S = 8
# past store_wait_s, the end of a run spends at most run_sync.CLOSE_S (20 s) on the store's last writes;
# the rest of the margin is local work after the last step on a loaded 2-core machine (final/ written,
# status.json, the interpreter's exit). Before issue 47 the process never exited (21 minutes and more).
END_MARGIN_S = 20 + 60


@pytest.mark.slow
def test_a_black_holed_store_mid_run_ends_in_time_and_the_next_start_uploads_the_rest(
    smoke_data, s3_bucket, s3_server, tmp_path, monkeypatch, capsys
):
    """Held before step 5 once step 4 is in the store, the store becomes a black hole; the run trains
    on to 12, ends within store_wait_s plus the margin, its last line and status.json name steps 8 and
    12 and final/ as not in the store; the same command with the store back uploads all of them first.
    On the way: every checkpoint in the store said in a line, and no line names the cache."""
    from tests.object_store_server import FAKE_SECRET

    run_url, release = f"{s3_bucket}/run", tmp_path / "release"
    release.mkdir()
    data = str(smoke_data)  # local: a black hole in the data's store would stop the steps (the loader's bounds)
    a = a_machine(tmp_path / "A", s3_server, HF_PRETRAIN_FAULTS="hold:5", HF_PRETRAIN_RELEASE=str(release))
    process, lines, reader = trainer(data, run_url, a, store_wait_s=STORE_WAIT_S)
    deadline = time.monotonic() + 600
    while not complete_in_store(run_url):  # the run waits before step 5: it cannot end meanwhile
        assert process.poll() is None and time.monotonic() < deadline, "\n".join(t for _, t in lines)[-3000:]
        time.sleep(0.2)
    s3_server.proxy.stall()
    try:
        (release / "5").touch()
        process.wait(timeout=900)
        ended = time.monotonic()
        reader.join(timeout=10)
    finally:
        s3_server.proxy.restore()
    out = "\n".join(text for _, text in lines)
    assert process.returncode == 0, out[-4000:]
    last_step = max(t for t, text in lines if '"step": 12' in text or text.startswith("step 12"))
    assert ended - last_step < STORE_WAIT_S + END_MARGIN_S, out[-3000:]
    assert f"step 4: in {run_url}/checkpoints/step_00000004" in out
    assert "not in the store" in lines[-1][1] and "step 8, step 12, final/" in lines[-1][1], lines[-3:]
    # said by the end of training, then by the last line with why (the store silent even at the close);
    # not also when the wait for the uploads ends (it was three times)
    assert sum("step 8, step 12" in text for _, text in lines) == 2, out[-3000:]
    assert f"store: stopped waiting for the uploads after store_wait_s ({STORE_WAIT_S} s)" in out
    home = str(tmp_path / "A" / "home")
    local = next(Path(home).glob("runs/s3/*/run"))
    status = json.loads((local / "status.json").read_text())
    assert status["store"]["not_in_store"] == [8, 12, "final"], status["store"]
    assert status["rerun"] is True and "uploads what the store lacks first" in status["next"], status
    assert status["command"].startswith("python hf_pretrain/train.py --recipe smoke"), status["command"]
    assert complete_in_store(run_url) == [4]

    from hf_pretrain.run_commands import run_status

    standing = run_status.describe(run_status.read_run(local))  # the local copy's status: the store lines
    assert f"step 4 is the newest checkpoint in {run_url}" in standing and "step 8, step 12, final/" in standing

    b_env = {**a, "env": {k: v for k, v in a["env"].items() if not k.startswith("HF_PRETRAIN_FAULTS")}}
    again, lines2, reader2 = trainer(data, run_url, b_env, store_wait_s=300)
    again.wait(timeout=600)
    reader2.join(timeout=10)
    out2 = "\n".join(text for _, text in lines2)
    assert again.returncode == 0, out2[-4000:]
    for step in (8, 12):
        assert f"step {step} is not in {run_url} yet: uploading it first" in out2
    assert f"final/: in {run_url}/final" in out2
    assert complete_in_store(run_url)[:2] == [12, 8]
    fs, parsed = store_of(run_url)
    assert fs.exists(f"{parsed.path}/final/config.json")
    # Issue 57: `status` after the recovery still quoted the first session's "not in the store" warning (its
    # reason in status.json, here and in the store) and its advice to rerun here. The store holds it all now.
    assert "warning: not in the store" in status["reason"]  # the first session's, read above
    mended = json.loads((local / "status.json").read_text())
    assert json.loads(fs.cat_file(f"{parsed.path}/status.json"))["reason"] == mended["reason"]
    assert "not in the store" not in mended["reason"] and mended["reason"].startswith("done: 12 steps"), mended
    assert mended["rerun"] is False and mended["next"].startswith("nothing: the run is complete"), mended
    assert mended["store"]["not_in_store"] == [], mended["store"]
    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path / "viewer"))  # `status URL` from another machine
    assert cli.main(["status", run_url]) == 0
    for standing in (capsys.readouterr().out, run_status.describe(run_status.read_run(local))):
        assert ": finished (exit 0), step 12 of 12" in standing and "not in the store" not in standing, standing
    for said in (out, out2):
        assert home not in said, [line for line in said.splitlines() if home in line]
        assert FAKE_SECRET not in said


# ------------------------------------------------------------------------------------ 5. a run remembers its data


@pytest.mark.slow
def test_a_local_copy_deleted_mid_run_stops_in_one_line_and_the_rerun_goes_on_from_the_store(
    smoke_data, s3_bucket, s3_server, tmp_path
):
    """Held before step 6 once step 4 is in the store, the run's local copy is deleted (a cache cleaned
    by hand or by a tool): the run stops after the step in one line, exit 74, no traceback; the same
    command goes on from step 4 in the store, not calling the last session killed."""
    import shutil

    from tests.helpers import run_captured

    run_url, release = f"{s3_bucket}/run", tmp_path / "release"
    release.mkdir()
    a = a_machine(tmp_path / "A", s3_server, HF_PRETRAIN_FAULTS="hold:6", HF_PRETRAIN_RELEASE=str(release))
    process, lines, reader = trainer(str(smoke_data), run_url, a)
    deadline = time.monotonic() + 600
    # step 4 in the store and the loop at its hold before step 6: deleted while step 5 trained, the copy is
    # missed after step 5 instead (a loaded machine once got there after the upload)
    held = "injected fault: holding before step 6"
    while 4 not in complete_in_store(run_url) or not any(held in text for _, text in lines):
        assert process.poll() is None and time.monotonic() < deadline, "\n".join(t for _, t in lines)[-3000:]
        time.sleep(0.2)
    local = next(Path(a["env"]["HF_PRETRAIN_HOME"]).glob("runs/s3/*/run"))
    # deleted in one move, as the run sees it: the uploader removes step 4's staging folder just after its
    # manifest, and an rmtree walking the folder meanwhile would meet a vanished entry
    local.rename(tmp_path / "cleaned")
    shutil.rmtree(tmp_path / "cleaned", ignore_errors=True)  # tidiness only: the uploader may still be in it
    (release / "6").touch()
    process.wait(timeout=600)
    reader.join(timeout=10)
    out = "\n".join(text for _, text in lines)
    assert process.returncode == 74, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert f"stopped after step 6: the local copy of {run_url} ({local}) was deleted while the run trained" in out
    again = a_machine(tmp_path / "A", s3_server)  # the same machine, the same command, no fault
    rerun = run_captured(trainer_command(str(smoke_data), run_url), **again, timeout=600)
    said = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, said[-3000:]
    assert f"resumed from {run_url}/checkpoints/step_00000004 at step 4" in said
    assert "SIGKILL" not in said, said[-3000:]


def test_a_run_url_alone_brings_its_data_url_from_the_store(s3_bucket, s3_server, tmp_path, capsys):
    """The command names only the run's URL: the data URL comes from the run's record in the store, said
    in one line; a --data_dir on the command line wins (checked against the run's data as always)."""
    from hf_pretrain.config import parse_recipe_args
    from hf_pretrain.store.location import Where
    from hf_pretrain.store.run.run_record import with_remembered_data

    url = f"{s3_bucket}/run"
    put_run(url, tmp_path, steps=(4,))
    only_the_run = ["--recipe", "smoke", "--output_dir", url]
    recipe, _ = parse_recipe_args(only_the_run, prog="test", description="")
    said: list[str] = []
    remembered, where = with_remembered_data(recipe, Where.of(recipe), only_the_run, said.append)
    assert remembered.data.data_dir == "s3://corpus/smoke-prepared" and where.data.in_store
    assert str(where.data) == "s3://corpus/smoke-prepared" and where.run.in_store
    assert said == [f"data: s3://corpus/smoke-prepared (the run's own record in {url}; --data_dir overrides it)"]
    for named in (["--data_dir", "elsewhere"], ["--data-dir=elsewhere"]):
        recipe, _ = parse_recipe_args(only_the_run + named, prog="test", description="")
        kept, where = with_remembered_data(recipe, Where.of(recipe), only_the_run + named, said.append)
        assert kept.data.data_dir == "elsewhere" and not where.data.in_store
    assert len(said) == 1


def test_the_command_in_status_json_is_the_one_typed_and_holds_no_secret(monkeypatch, tmp_path):
    from hf_pretrain.run_folder.run_lock import command_line
    from tests.helpers import ROOT

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sEcReT-value-1234")
    typed = [str(ROOT / "hf_pretrain" / "train.py"), "--hub_token", "hf_" + "x" * 30, "--note", "sEcReT-value-1234"]
    said = command_line(typed)
    assert said == "python hf_pretrain/train.py --hub_token '***' --note ***", said
    assert str(ROOT) not in said
    numbers = [
        str(ROOT / "hf_pretrain" / "train.py"),
        "--global_batch_tokens",
        "4096",
        "--eval-tokens=512",
        "--aws-secret=k",
    ]
    assert command_line(numbers) == (
        "python hf_pretrain/train.py --global_batch_tokens 4096 --eval-tokens=512 '--aws-secret=***'"
    )  # a flag that merely contains "token" is a figure a reader needs
    assert command_line(["/somewhere/.venv/bin/hf-pretrain", "train", "--output_dir", "s3://b/r"]) == (
        "hf-pretrain train --output_dir s3://b/r"
    )
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")  # set by every `accelerate launch`
    assert command_line([str(ROOT / "hf_pretrain" / "train.py")]) == "accelerate launch hf_pretrain/train.py"


# ------------------------------------------------------------------------------------ 6. smaller items


def test_stop_of_a_url_whose_newest_checkpoint_lacks_train_state_reads_the_one_before(
    s3_bucket, s3_server, tmp_path, monkeypatch, capsys
):
    from hf_pretrain.store.location import Location
    from hf_pretrain.store.run.reading import stop_facts

    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path / "home"))
    url = f"{s3_bucket}/run"
    put_run(url, tmp_path, steps=(4, 8), status={"state": "stopped"})
    fs, parsed = store_of(url)
    fs.rm_file(f"{parsed.path}/checkpoints/step_00000008/train_state.json")
    said: list[str] = []
    _, holder, saved = stop_facts(Location.of(url), say=said.append)
    assert holder is None and saved["step"] == 4
    assert said == [f"{url}/checkpoints/step_00000008 has no readable train_state.json; the one before is read"]


def test_gguf_of_a_url_says_which_command_reads_it(capsys):
    from hf_pretrain.publish import gguf

    assert gguf.main(["s3://bkt/exports/1b"]) == EXIT_CONFIG
    err = capsys.readouterr().err.strip()
    assert "s3:/bkt" not in err.replace("s3://bkt", "")  # the URL as given, never mangled into a path
    assert "hf-pretrain export --checkpoint s3://bkt/exports/1b --out model --gguf" in err and "\n" not in err


def test_a_view_keeps_only_the_checkpoint_it_read(s3_bucket, s3_server, tmp_path, monkeypatch):
    """`views/` held every checkpoint ever pulled (optimizer state included): each read keeps one."""
    from hf_pretrain.store.location import Location
    from hf_pretrain.store.run.reading import readable

    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path / "home"))
    url = f"{s3_bucket}/run"
    put_run(url, tmp_path, steps=(4,), status={"state": "running"})
    view = readable(Location.of(url), say=lambda line: None)
    assert [p.name for p in (view / "checkpoints").iterdir()] == ["step_00000004"]
    fs, parsed = store_of(url)
    folder = fake_checkpoint(tmp_path / "later", 8)
    fs.put(str(folder), f"{parsed.path}/checkpoints/{folder.name}", recursive=True)
    assert readable(Location.of(url), say=lambda line: None) == view
    assert [p.name for p in (view / "checkpoints").iterdir()] == ["step_00000008"]


def test_a_run_deleted_from_the_store_starts_fresh_not_from_the_hidden_copy(
    s3_bucket, s3_server, tmp_path, monkeypatch
):
    from hf_pretrain.config import parse_recipe_args
    from hf_pretrain.store.location import Where
    from hf_pretrain.store.run.run_sync import RunInStore

    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path / "home"))
    url = f"{s3_bucket}/run"
    argv = ["--recipe", "smoke", "--output_dir", url, "--data_dir", str(tmp_path)]
    recipe, _ = parse_recipe_args(argv, prog="test", description="")
    local = Where.of(recipe).run.local
    fake_checkpoint(local, 6)  # this machine trained the run once; then the run was deleted from the store
    said: list[str] = []
    store = RunInStore.begin(Where.of(recipe).run, recipe.store, recipe.checkpoints, say=said.append)
    store.close()
    assert not (local / "checkpoints").exists()
    assert list(local.parent.glob("run.set-aside-*/checkpoints/step_00000006"))
    assert "holds no run (deleted there?)" in "\n".join(said) and "step 6" not in "\n".join(said)


@pytest.mark.slow
def test_a_run_moves_with_its_url_alone_and_status_reads_it_from_anywhere(
    smoke_data, s3_bucket, s3_server, tmp_path, monkeypatch, capsys
):
    """Data and run in the store from the first command on. While machine A trains (held before step 9,
    step 8 in the store), a machine that never saw the run asks `status URL`: running, step 8 of 12, the
    lease fresh, the data URL. A is killed: `killed`. Machine B, its command naming only the run URL,
    finds the data from the run's record, says so in one line, and finishes the run; no line of its
    output names a cache."""
    import signal

    from hf_pretrain.run_commands import run_status

    run_url, release = f"{s3_bucket}/run", tmp_path / "release"
    release.mkdir()
    data = data_in_store(smoke_data, s3_bucket)
    a = a_machine(tmp_path / "A", s3_server, HF_PRETRAIN_FAULTS="hold:9", HF_PRETRAIN_RELEASE=str(release))
    process, lines, reader = trainer(data, run_url, a)
    deadline = time.monotonic() + 600
    while 8 not in complete_in_store(run_url):  # the run waits before step 9: it cannot end meanwhile
        assert process.poll() is None and time.monotonic() < deadline, "\n".join(t for _, t in lines)[-3000:]
        time.sleep(0.2)

    fresh = tmp_path / "fresh"
    monkeypatch.setenv("HF_PRETRAIN_HOME", str(fresh / "home"))
    capsys.readouterr()
    assert run_status.main([run_url]) == 0
    said = capsys.readouterr().out
    assert said.splitlines()[0].startswith(f"{run_url}: running, step 8 of 12"), said
    assert "(fresh)" in said and f"data: {data}" in said and str(fresh) not in said
    assert not list((fresh / "home").rglob("*.safetensors")), "status pulled weights"

    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert run_status.main([run_url]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(f"{run_url}: killed, step 8 of 12")

    b = a_machine(tmp_path / "B", s3_server)
    moved, lines_b, reader_b = trainer(None, run_url, b)
    moved.wait(timeout=900)
    reader_b.join(timeout=10)
    out = "\n".join(text for _, text in lines_b)
    assert moved.returncode == 0, out[-4000:]
    assert f"data: {data} (the run's own record in {run_url}; --data_dir overrides it)" in out
    assert "done: 12 steps" in out and f"step 12: in {run_url}/checkpoints/step_00000012" in out
    assert not list((tmp_path / "B").rglob("data/smoke")), "the data came from the store"
    for cache in (str(tmp_path / "B" / "home"), str(tmp_path / "A" / "home")):
        assert cache not in out, [line for line in out.splitlines() if cache in line]


@pytest.mark.slow
def test_the_doctor_on_a_fresh_machine_judges_the_resume_on_the_stores_newest_checkpoint(
    reference_run, smoke_data, s3_bucket, s3_server, tmp_path
):
    """A run URL whose newest checkpoint is in the store alone (a fresh machine's copy is empty): the doctor's
    resume row is judged on that checkpoint's train state, and says the pull (a row no test had read)."""
    import s3fs

    from tests.helpers import SHORT_RUN, cli

    url = f"{s3_bucket}/run"
    fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)
    checkpoint = reference_run[0] / "checkpoints" / "step_00000008"
    fs.put(str(checkpoint), f"{url}/checkpoints/step_00000008".removeprefix("s3://"), recursive=True)
    flags = [part for key, value in SHORT_RUN.items() for part in (f"--{key}", str(value))]
    machine = a_machine(tmp_path / "B", s3_server)
    said = cli("doctor", "--recipe", "smoke", *flags, "--data_dir", str(smoke_data), "--output_dir", url, **machine)
    resume = next(line for line in said.stdout.splitlines() if line.lstrip().startswith("resume"))
    assert resume.split()[1] == "pass", said.stdout[-3000:]
    assert "goes on from step 8 (step 8 is in the store; training pulls it into this machine's copy first)" in resume
    # the bench line of the cost row names the run's URL, not its copy in this machine's cache
    bench = next(line for line in said.stdout.splitlines() if "hf-pretrain bench" in line)
    assert f"--output_dir {url} " in bench and "home/runs" not in bench, bench
