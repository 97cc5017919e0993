"""Issue 12, "scale": checkpoint hashing off the training thread, milestones that keep their weights
only, and run files that stay cheap to read and resume at 90,000 steps."""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_pretrain.checkpoints import saving, store
from hf_pretrain.checkpoints.manifest import CheckpointError, verify_checkpoint, write_manifest
from hf_pretrain.checkpoints.resume_decision import resumable
from hf_pretrain.checkpoints.saving import CheckpointSaveError
from hf_pretrain.checkpoints.store import keep_weights_only, prune_checkpoints
from hf_pretrain.publish import export_command
from hf_pretrain.run_folder.run_dir import read_jsonl, truncate_jsonl
from tests.helpers import launch_training, save_with_stand_ins


@pytest.fixture(scope="module")
def accelerator():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 4)
    accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
    return accelerator


save = save_with_stand_ins


# ---------------------------------------------------------------------- the seal in the background
def test_a_periodic_save_returns_before_its_hashing_and_completes_on_the_seal_thread(
    accelerator, tmp_path, monkeypatch
):
    release, hashed_on = threading.Event(), []

    def slow_manifest(folder: Path, *known) -> None:
        hashed_on.append(threading.current_thread().name)
        assert release.wait(30)
        write_manifest(folder, *known)

    monkeypatch.setattr(saving, "write_manifest", slow_manifest)
    sealed = []
    sealing = save(accelerator, tmp_path, 1, background=True, on_sealed=sealed.append)
    final = tmp_path / "checkpoints" / "step_00000001"
    # back on the training thread with the state written and the hashing still to do
    assert (final.parent / "step_00000001.tmp" / "optimizer.bin").is_file() and not final.exists()
    release.set()
    assert sealing.wait() is None
    assert hashed_on == ["hf-pretrain-seal"] and sealed == [final]
    assert verify_checkpoint(final)["step"] == 1  # the manifest was written before the rename


def test_a_background_seal_that_fails_stops_the_next_save_and_leaves_the_previous_checkpoint(
    accelerator, tmp_path, monkeypatch
):
    save(accelerator, tmp_path, 1)  # inline: complete on return

    def full_disk(folder: Path, *known) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / "manifest.json"))

    monkeypatch.setattr(saving, "write_manifest", full_disk)
    sealing = save(accelerator, tmp_path, 2, background=True)
    assert "No space left on device" in sealing.wait()
    monkeypatch.undo()
    with pytest.raises(CheckpointSaveError, match=r"saving the step 2 checkpoint.*step_00000001 is intact"):
        save(accelerator, tmp_path, 3, background=True, previous=sealing)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_00000001"]
    verify_checkpoint(root / "step_00000001")


# ---------------------------------------------------------------------- weights-only milestones
def fake_checkpoint(root: Path, step: int) -> Path:
    folder = root / "checkpoints" / f"step_{step:08d}"
    folder.mkdir(parents=True)
    save_file({"w": torch.randn(8, 8), "count": torch.arange(3)}, folder / "model.safetensors")
    (folder / "optimizer.bin").write_bytes(os.urandom(1024))
    (folder / "random_states_0.pkl").write_bytes(b"rng")
    (folder / "config.json").write_text("{}")
    (folder / "train_state.json").write_text(json.dumps({"step": step}))
    write_manifest(folder)
    return folder


def test_a_milestone_keeps_its_bf16_weights_and_a_kill_while_slimming_is_finished_later(tmp_path, monkeypatch):
    folder = fake_checkpoint(tmp_path, 4)
    weights = load_file(folder / "model.safetensors")
    keep_weights_only(folder)
    state = verify_checkpoint(folder)  # a new manifest, checked in full
    assert state["weights_only"] and state["step"] == 4
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "manifest.json",
        "model.safetensors",
        "train_state.json",
    ]
    slim = load_file(folder / "model.safetensors")
    assert slim["w"].dtype == torch.bfloat16 and torch.equal(slim["w"], weights["w"].bfloat16())
    assert torch.equal(slim["count"], weights["count"])  # integers stay as they are
    with pytest.raises(CheckpointError, match="kept its weights only"):
        resumable(folder)

    # killed between its two renames: the slim copy is complete, the checkpoint's own name is free
    other = fake_checkpoint(tmp_path, 8)
    renames = []

    def rename_then_die(source, target):
        renames.append(target)
        if len(renames) == 2:
            raise KeyboardInterrupt  # stands for the kill
        os.rename(source, target)

    monkeypatch.setattr(store.os, "replace", rename_then_die)
    with pytest.raises(KeyboardInterrupt):
        keep_weights_only(other)
    monkeypatch.undo()
    assert not other.exists()
    prune_checkpoints(tmp_path, keep=5, milestone_interval=4, weights_only=True)
    assert verify_checkpoint(other)["weights_only"]
    assert sorted(p.name for p in other.parent.iterdir()) == ["step_00000004", "step_00000008"]


@pytest.mark.slow
def test_milestones_of_a_run_keep_bf16_weights_that_export_reads(reference_run, smoke_data, tmp_path):
    run_dir = tmp_path / "run"
    launch_training(smoke_data, run_dir, milestone_interval=4, keep_checkpoints=1)
    root = run_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_00000004", "step_00000008", "step_00000012"]
    for step in (4, 8):
        assert verify_checkpoint(root / f"step_{step:08d}")["weights_only"]
        assert not list((root / f"step_{step:08d}").glob("optimizer*"))
    assert not verify_checkpoint(root / "step_00000012").get("weights_only")  # the newest stays resumable
    reference = load_file(reference_run[0] / "checkpoints" / "step_00000008" / "model.safetensors")
    milestone = load_file(root / "step_00000008" / "model.safetensors")
    assert all(torch.equal(milestone[k], reference[k].bfloat16()) for k in reference)  # the same run, in bf16
    out = tmp_path / "export"
    assert export_command.main(["--checkpoint", str(root / "step_00000004"), "--out", str(out)]) == 0
    assert (out / "model.safetensors").is_file()


# ---------------------------------------------------------------------- run files at 90,000 steps
def write_records(path: Path, steps: range) -> None:
    with path.open("w") as f:
        for step in steps:
            f.write(json.dumps({"kind": "train", "step": step, "loss": 1.0}) + "\n")
            if step % 100 == 0:
                f.write(json.dumps({"kind": "eval", "step": step, "val_loss": 1.0}) + "\n")


def test_a_resume_cuts_the_tail_of_the_records_without_reading_the_rest(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    write_records(path, range(1, 90_001))
    with path.open("a") as f:
        f.write('{"kind": "train", "step": 90001, "lo')  # a write cut short by a kill
    parsed = []
    real_loads = json.loads
    monkeypatch.setattr(json, "loads", lambda text, *a, **k: parsed.append(1) or real_loads(text, *a, **k))
    truncate_jsonl(path, after_step=89_900)
    monkeypatch.undo()
    assert len(parsed) < 200  # the tail only, not 90,000 records
    records = read_jsonl(path)
    assert records[-1] == {"kind": "eval", "step": 89_900, "val_loss": 1.0}
    assert len(records) == 89_900 + 899
    truncate_jsonl(path, after_step=90_000)  # nothing past it: the file is left alone
    assert len(read_jsonl(path)) == 89_900 + 899


def test_a_torn_last_record_is_skipped_when_reading(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "comp')
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    path.write_text('{"step": 1}\n{"step": 2, "comp\n{"step": 3}\n')
    with pytest.raises(ValueError):  # damage inside the file is not a torn write: say so
        read_jsonl(path)


def test_a_checkpoint_of_the_sha256_days_still_verifies(accelerator, tmp_path):
    """Manifests written before the checksum was named (format 1) are SHA-256, and still say so."""
    import hashlib

    save(accelerator, tmp_path, 1)
    folder = tmp_path / "checkpoints" / "step_00000001"
    listed = json.loads((folder / "manifest.json").read_text())
    assert listed["format_version"] == 2 and listed["checksum"] == "xxh3_128"
    old = {
        name: {"bytes": entry["bytes"], "sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest()}
        for name, entry in listed["files"].items()
    }
    (folder / "manifest.json").write_text(json.dumps({"format_version": 1, "files": old}))
    assert verify_checkpoint(folder)["step"] == 1
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model.safetensors fails its checksum \(sha256\)"):
        verify_checkpoint(folder)
