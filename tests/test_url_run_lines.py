"""A URL run's lines name its URL, and `status URL` tells a person where it stands, at every moment of its life
(issue 57): before its first checkpoint (it was "is not a run folder", exit 78, for the 1b's first half hour),
stopped by a signal (its stop line named the cache's copy, `<HF_PRETRAIN_HOME>/runs/s3/...`, and `status`
said "rerun the same command" without the command status.json records). Against a local S3 server (moto)."""

from __future__ import annotations

import signal

import pytest

from hf_pretrain.exit_codes import EXIT_PREEMPTED
from tests.helpers import cli, start_merged
from tests.stacks import communicate_or_diagnose
from tests.test_run_in_store import machine, store_fs, train_command, wait_until


@pytest.mark.slow
def test_a_signalled_url_run_names_its_url_and_status_says_where_it_stands(smoke_data, s3_bucket, s3_server, tmp_path):
    url, release = f"{s3_bucket}/run", tmp_path / "release"
    release.mkdir()
    # held before step 1 (no checkpoint anywhere yet) until the test lets it go: it cannot outrun the checks
    a = machine(tmp_path / "A", s3_server, HF_PRETRAIN_FAULTS="hold:1", HF_PRETRAIN_RELEASE=str(release))
    cache = str(tmp_path / "A" / "home")
    trainer = start_merged(train_command(smoke_data, url, max_steps=60, eval_interval=30), **a)
    wait_until(lambda: store_fs().exists(f"{url.removeprefix('s3://')}/lease.json"), trainer)

    laptop = machine(tmp_path / "laptop", s3_server)
    live = cli("status", url, **laptop, timeout=120)
    assert live.returncode == 0, live.stdout + live.stderr
    assert live.stdout.startswith(f"{url}: running"), live.stdout
    assert "last checkpoint: none yet" in live.stdout and "is not a run folder" not in live.stderr

    trainer.send_signal(signal.SIGINT)  # recorded during the hold, acted on after the step
    (release / "1").touch()
    out = communicate_or_diagnose(trainer, 600)[0]
    assert trainer.returncode == EXIT_PREEMPTED, out[-3000:]
    stop_line = next(line for line in out.splitlines() if line.startswith("stopped by SIGINT"))
    assert stop_line.startswith(f"stopped by SIGINT after step 1; checkpoint {url}/checkpoints/step_00000001."), (
        stop_line
    )
    assert cache not in stop_line
    disk_row = next(line for line in out.splitlines() if line.startswith("disk space"))
    assert f"free on {url}" not in disk_row and "free on the disk of the cache that holds" in disk_row, disk_row

    stopped = cli("status", url, **laptop, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert stopped.stdout.startswith(f"{url}: preempted (exit {EXIT_PREEMPTED}), step 1 of 60"), stopped.stdout
    assert "next: rerun the same command" in stopped.stdout
    command = next(line for line in stopped.stdout.splitlines() if line.startswith("  the command: "))
    assert "hf_pretrain/train.py --recipe smoke" in command and f"--output_dir {url}" in command, command
    assert cache not in stopped.stdout


def test_a_hangs_stacks_in_a_url_run_are_named_as_this_machines_copy_of_its_url(tmp_path):
    """The stacks of a hang stay on the machine (hangs/ is not uploaded: the process ends at once): the line
    names where they are, and that it is the cache's copy of the URL, not a place of the user's (issue 57)."""
    import json

    from hf_pretrain.run_folder.run_dir import RunDir
    from hf_pretrain.training.watchdog import Watchdog

    copy = tmp_path / "home" / "runs" / "s3" / "bkt" / "run"
    copy.mkdir(parents=True)
    (copy / "store.json").write_text(json.dumps({"url": "s3://bkt/run"}))
    dog = object.__new__(Watchdog)  # its naming alone: no accelerator, no thread
    dog.run_dir, dog.folder = RunDir(copy), RunDir(copy).hangs / "session-1"
    assert (
        dog._stacks_at() == f"{copy}/hangs/session-1 (on this machine only: the cache's working copy of s3://bkt/run)"
    )
    local = RunDir(tmp_path / "runs" / "local")
    dog.run_dir, dog.folder = local, local.hangs / "session-1"
    assert dog._stacks_at() == str(local.hangs / "session-1")  # a local run's folder is the user's own
