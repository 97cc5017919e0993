"""The SkyPilot task's run block, run on this machine as SkyPilot runs it on a node (bash in the synced
workdir, its SKYPILOT_* variables, a fresh HOME each time: a new machine), the run and the data in the S3
server on localhost, relaunched by the task's own recovery rules read from the shipped YAML (a preemption
always; an exit code in `recover_on_exit_codes`; any other non-zero code only within
`max_restarts_on_errors`), until the job ends. Certain at every point: each node is held before a step
(faults.py `hold`) when it is signalled or killed, and released only once it has said what it does."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_pretrain.engines.tasks import SKYPILOT, max_restarts_on_errors, read_task, recover_on_exit_codes
from hf_pretrain.exit_codes import EXIT_CONFIG, EXIT_OK, EXIT_PREEMPTED
from tests.helpers import ROOT, SHORT_RUN, offline_env

TASK = read_task(next(p for p in SKYPILOT if p.name == "1b.yaml"))
# the smoke model on the tests' short schedule (`phases` is reporting only: it stays the recipe's)
TRAIN_ARGS = " ".join(f"--{k} {v}" for k, v in SHORT_RUN.items() if k != "phases")
CHECK_ARGS = "--parts health --budget_s 60"  # the gate, kept to the GPU's health (one line each here: no GPU)


def session_processes(sid: int) -> list[int]:
    """Every process of a node: those of the run block's session."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3]) == sid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


@dataclass
class Node:
    """One SkyPilot node running the task's run block; its output read by a thread, line by line."""

    process: subprocess.Popen
    lines: list[tuple[float, str]] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self):
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            with self.changed:
                self.lines.append((time.monotonic(), line))
                self.changed.notify_all()
        with self.changed:
            self.lines.append((time.monotonic(), ""))  # the end
            self.changed.notify_all()

    def wait_for(self, text: str, timeout: float = 600) -> float:
        """When a line holding `text` came (the node ending first fails the test)."""
        with self.changed:
            seen = 0
            while True:
                for when, line in self.lines[seen:]:
                    if text in line:
                        return when
                    if line == "":
                        raise AssertionError(f"the node ended before `{text}`:\n{self.log()[-3000:]}")
                seen = len(self.lines)
                assert self.changed.wait(timeout), f"no `{text}` in {timeout} s:\n{self.log()[-3000:]}"

    def signal_all(self, sig: int) -> None:
        for pid in session_processes(self.process.pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def log(self) -> str:
        return "".join(line for _, line in self.lines)


def start_node(tmp_path: Path, attempt: int, s3_server, envs: dict[str, str], faults: str = "") -> Node:
    """A fresh machine: an empty HOME whose setup (the task's venv) is this checkout's venv, SkyPilot's
    variables for a one-node cluster, the task's envs and secrets (the S3 server's keys)."""
    home = tmp_path / f"node{attempt}" / "home"
    venv_bin = home / "hf-pretrain-venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "activate").write_text(f'export PATH="{Path(sys.executable).parent}:$PATH"\n')
    env = {k: v for k, v in offline_env().items() if k != "HF_PRETRAIN_HOME"}  # the run's cache: under HOME
    env |= s3_server.env | {"HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env |= {"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "1", "SKYPILOT_NODE_IPS": "127.0.0.1"}
    env |= {"SKYPILOT_NUM_GPUS_PER_NODE": "1", "SKYPILOT_TASK_ID": f"sky-managed-test_{attempt}"}
    env |= {k: str(v) for k, v in TASK["envs"].items() if v is not None} | envs
    if faults:
        env |= {"HF_PRETRAIN_FAULTS": faults, "HF_PRETRAIN_RELEASE": str(tmp_path / "release")}
    run = ["bash", "-c", TASK["run"]]  # SkyPilot runs the block with bash in the synced workdir (the clone)
    process = subprocess.Popen(
        run, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    return Node(process)


def release(tmp_path: Path, step: int) -> None:
    (tmp_path / "release").mkdir(exist_ok=True)
    (tmp_path / "release" / str(step)).touch()


def relaunch(code: int | None, restarts_on_errors: int) -> bool:
    """SkyPilot's rule, from the task: a preempted node (None) always; a code it names always; another
    non-zero code within max_restarts_on_errors (here: how many are left)."""
    if code is None:
        return True
    if code == EXIT_OK:
        return False
    return code in recover_on_exit_codes(TASK) or restarts_on_errors > 0


def test_the_recovery_rules_are_the_tasks_own():
    from hf_pretrain.exit_codes import EXIT_FAILED, EXIT_FAULTY_HOST, EXIT_LOCKED

    assert relaunch(None, 0) and relaunch(EXIT_PREEMPTED, 0) and relaunch(EXIT_FAULTY_HOST, 0)
    assert not any(relaunch(code, 0) for code in (EXIT_OK, EXIT_LOCKED, EXIT_CONFIG, EXIT_FAILED))
    assert relaunch(EXIT_FAILED, 1)  # within max_restarts_on_errors, had the task allowed any


def data_in_store(smoke_data: Path, url: str) -> str:
    """The prepared smoke data uploaded as `prepare --data_dir URL` leaves it (block checksums, meta.json last)."""
    from hf_pretrain.store.data.data_upload import upload_prepared
    from hf_pretrain.store.urls import StoreURL, filesystem

    copy = smoke_data.parent / "smoke_for_engine"
    if not copy.exists():
        shutil.copytree(smoke_data, copy, ignore=shutil.ignore_patterns("logs", "*.blocks", "blocks.json"))
    upload_prepared(copy, StoreURL.parse(url), filesystem(StoreURL.parse(url)), log=lambda _: None)
    return url


def complete_in_store(url: str) -> list[int]:
    import s3fs

    from hf_pretrain.store.run.pull import complete_steps
    from hf_pretrain.store.urls import StoreURL

    return complete_steps(s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False), StoreURL.parse(url))


def wait_for_the_store(url: str, step: int, node: Node, timeout: float = 300) -> None:
    """While the node is held (it cannot go on), until its checkpoint of `step` is complete in the store."""
    deadline = time.monotonic() + timeout
    while step not in complete_in_store(url):
        assert node.process.poll() is None, node.log()[-3000:]
        assert time.monotonic() < deadline, f"step {step} never reached the store:\n{node.log()[-3000:]}"
        time.sleep(0.2)


def preempted_with_notice(tmp_path, s3_server, envs, figures) -> int:
    """Node 1, held before step 4: SIGTERM to every process, as a machine's shutdown sends it."""
    node = start_node(tmp_path, 1, s3_server, envs, faults="hold:4")
    node.wait_for("holding before step 4")
    sent = time.monotonic()
    node.signal_all(signal.SIGTERM)
    node.wait_for("writing a checkpoint")  # the trainer recorded the signal: now it may finish the step
    release(tmp_path, 4)
    code = node.process.wait(timeout=600)
    figures["sigterm_to_exit_s"] = time.monotonic() - sent
    assert code == EXIT_PREEMPTED and "Traceback" not in node.log(), node.log()[-3000:]
    figures["ended_1"] = time.monotonic()
    return code


def preempted_without_notice(tmp_path, s3_server, envs, run_url, figures) -> None:
    """Node 2, a new machine: goes on from step 4; held before 9 until step 8 is in the store, then gone (SIGKILL)."""
    node = start_node(tmp_path, 2, s3_server, envs, faults="hold:5,hold:9")
    figures["relaunch_to_step_after_sigterm_s"] = node.wait_for("holding before step 5") - figures["ended_1"]
    release(tmp_path, 5)
    node.wait_for("holding before step 9")
    assert "at step 4" in node.log(), node.log()[-3000:]  # resumed from the checkpoint node 1 wrote on SIGTERM
    wait_for_the_store(run_url, 8, node)
    figures["killed_2"] = time.monotonic()
    node.signal_all(signal.SIGKILL)
    node.process.wait(timeout=60)


@pytest.mark.slow
def test_the_task_survives_a_sigterm_and_a_sigkill_and_finishes_bit_for_bit(
    reference_run, smoke_data, s3_bucket, s3_server, tmp_path
):
    run_url = f"{s3_bucket}/run"
    data_url = data_in_store(smoke_data, f"{s3_bucket}/data")
    envs = {"RUN_URL": run_url, "DATA_URL": data_url, "RECIPE": "smoke", "TRAIN_ARGS": TRAIN_ARGS}
    envs["CHECK_ARGS"] = CHECK_ARGS
    restarts_on_errors, figures = max_restarts_on_errors(TASK), {}

    assert relaunch(preempted_with_notice(tmp_path, s3_server, envs, figures), restarts_on_errors)
    preempted_without_notice(tmp_path, s3_server, envs, run_url, figures)
    assert relaunch(None, restarts_on_errors)  # the node is gone: SkyPilot's preemption recovery

    node = start_node(tmp_path, 3, s3_server, envs, faults="hold:9")
    figures["sigkill_to_next_step_s"] = node.wait_for("holding before step 9") - figures["killed_2"]
    release(tmp_path, 9)
    code = node.process.wait(timeout=600)
    assert code == EXIT_OK and not relaunch(code, restarts_on_errors), node.log()[-3000:]
    assert "at step 8" in node.log() and "took over the lease" in node.log(), node.log()[-3000:]

    reference = load_file(reference_run[0] / "final" / "model.safetensors")
    in_store = tmp_path / "final_from_store.safetensors"
    import s3fs

    s3fs.S3FileSystem(skip_instance_cache=True).get_file(f"{run_url}/final/model.safetensors", str(in_store))
    finished = load_file(in_store)
    assert reference.keys() == finished.keys()
    assert all(torch.equal(reference[k], finished[k]) for k in reference)
    print({k: round(v, 1) for k, v in figures.items() if k.endswith("_s")})  # docs/engines.md's measured figures


@pytest.mark.slow
def test_a_refusal_ends_the_job_once_with_78_and_one_line(s3_bucket, s3_server, tmp_path):
    envs = {"RUN_URL": f"{s3_bucket}/run", "DATA_URL": f"{s3_bucket}/data", "RECIPE": "smoke", "CHECK_ARGS": CHECK_ARGS}
    envs["TRAIN_ARGS"] = f"{TRAIN_ARGS} --micro_batch_size -1"
    node = start_node(tmp_path, 1, s3_server, envs)
    code = node.process.wait(timeout=300)
    node.reader.join(timeout=60)  # the whole output read
    log = node.log()
    assert code == EXIT_CONFIG and not relaunch(code, max_restarts_on_errors(TASK)), log[-3000:]
    ours = [line for line in log.splitlines() if line.startswith(("hf-pretrain", "train.py"))]
    assert len(ours) == 1 and "micro_batch_size" in ours[0] and "Traceback" not in log, log[-3000:]
