"""Real training runs through `accelerate launch`, on CPU: outputs, resume, DDP, golden losses."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_pretrain.run_folder.run_dir import read_jsonl
from tests.helpers import SHORT_RUN, launch_training
from tests.regenerate_golden import CORPUS, GOLDEN, golden_losses

# How far the golden curve may move, relative, at any step. Measured on the 12-step golden run
# (docs/testing.md): the same run under OMP_NUM_THREADS 1 or 2, 1 or 2 processes, a fresh or a reused
# process, MKL_CBWR=COMPATIBLE and ATEN_CPU_CAPABILITY=default (other kernels, other summation
# orders) moves it by at most 1.3e-7; one-line changes to the math move it by 3.2e-5 (weight_decay
# 0.1 -> 0.11), 1.6e-4 (adam_eps 1e-8 -> 1e-7), 1.8e-4 (rms_norm_eps 1e-5 -> 1e-6), 5.8e-4 (adam_beta2
# 0.95 -> 0.96) and 2.5e-3 (learning rate +1%). 1e-5 sits ~75x above the drift and 3-250x below those.
GOLDEN_RTOL = 1e-5


def train_losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def checkpoint_weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step_{step:08d}" / "model.safetensors")


@pytest.mark.slow
def test_short_run_writes_every_output_and_a_loadable_model(reference_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir, log = reference_run
    for name in (
        "resolved_recipe.yaml",
        "metrics.jsonl",
        "samples.jsonl",
        "final/config.json",
        "final/model.safetensors",
        "final/tokenizer.json",
        "checkpoints",
    ):
        assert (run_dir / name).exists(), name
    losses = train_losses(run_dir)
    assert len(losses) == SHORT_RUN["max_steps"]
    assert losses[-1] < losses[0]
    records = read_jsonl(run_dir / "metrics.jsonl")
    first = next(r for r in records if r["kind"] == "train")
    assert set(first) >= {"step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed"}
    assert first["tokens"] == SHORT_RUN["global_batch_tokens"]
    assert 0.0 <= first["data_wait_share"] <= 1.0
    assert first["cost"] == pytest.approx(first["elapsed"] / 3600 * 2.0)
    assert first["projected_cost"] == pytest.approx(first["cost"] * 12)
    phases = json.loads((run_dir / "phases.json").read_text())
    assert [p["name"] for p in phases] == ["warmup", "first-half", "second-half"]
    assert "| warmup | 0-2 |" in (run_dir / "phases.md").read_text()
    assert list(run_dir.rglob("events.out.tfevents.*")), "report_to=tensorboard wrote no event file"
    assert any(r["kind"] == "eval" and r["val_loss"] > 0 for r in records)
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert {s["prompt"] for s in samples} == {
        "The capital of France is",
        "def fibonacci(n):",
        "In a shocking discovery, scientists found that",
    }
    assert {s["step"] for s in samples} == {6, 12}
    # keep_checkpoints=2 of the saves at 4, 8, 12
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000008", "step_00000012"]
    state = json.loads((run_dir / "checkpoints" / "step_00000012" / "train_state.json").read_text())
    assert state["step"] == 12 and state["tokens_seen"] == 12 * SHORT_RUN["global_batch_tokens"]

    model = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "final")
    ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 5
    # the final model is the last checkpoint's weights
    final = load_file(run_dir / "final" / "model.safetensors")
    last = checkpoint_weights(run_dir, 12)
    assert torch.equal(final["model.norm.weight"], last["model.norm.weight"])
    assert "world size 1" in log or "1 process(es)" in log


def test_make_smoke_checks_that_its_run_learned(tmp_path):
    """The full `smoke` recipe learning (its loss falls by more than a third) is checked by `make smoke` on the
    run it trains (tests/smoke_learned.py; CI runs it before the suite), not trained a second time here: the
    check passes a run that learned and fails, in one line, one that did not or did not finish."""
    from tests.smoke_learned import verdict

    run_dir = tmp_path / "smoke"
    run_dir.mkdir()
    losses = {10: 8.05, 100: 5.67, 250: 4.55}
    lines = [{"kind": "train", "step": step, "loss": loss} for step, loss in losses.items()]
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [*lines, {"kind": "eval", "step": 250}]))
    learned, said = verdict(run_dir)
    assert learned is False and "no final/model.safetensors" in said
    (run_dir / "final").mkdir()
    (run_dir / "final" / "model.safetensors").write_bytes(b"")
    assert verdict(run_dir) == (
        True,
        f"{run_dir}: the smoke recipe learns: loss 8.050 at step 10 -> 4.550 at step 250 (57% of it)",
    )
    lines[-1]["loss"] = 5.5  # 68% of the first: not below two thirds
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines))
    learned, said = verdict(run_dir)
    assert not learned and "did not learn" in said and "\n" not in said


@pytest.mark.slow
def test_stop_and_resume_gives_the_uninterrupted_curve_bitwise(reference_run, smoke_data, tmp_path):
    reference_dir, _ = reference_run
    run_dir = tmp_path / "resumed"
    first = launch_training(smoke_data, run_dir, stop_at_step=5)
    assert "stopped at step 5" in first
    assert not (run_dir / "final").exists()
    second = launch_training(smoke_data, run_dir)
    assert "resumed from" in second and "at step 5" in second
    assert train_losses(run_dir) == train_losses(reference_dir)  # bitwise, step by step
    ref, got = checkpoint_weights(reference_dir, 12), checkpoint_weights(run_dir, 12)
    assert all(torch.equal(ref[k], got[k]) for k in ref)


@pytest.mark.slow
def test_two_process_ddp_matches_one_process(reference_run, two_process_run):
    reference_dir, _ = reference_run
    run_dir, log = two_process_run
    assert "2 process(es) x 1 micro-batches" in log  # really distributed: world size 2
    ref, got = train_losses(reference_dir), train_losses(run_dir)
    assert len(got) == len(ref)
    assert got == pytest.approx(ref, rel=2e-4)
    ref_w, got_w = checkpoint_weights(reference_dir, 12), checkpoint_weights(run_dir, 12)
    for key in ref_w:
        torch.testing.assert_close(got_w[key], ref_w[key], rtol=1e-3, atol=2e-4)
    # eval_tokens are the same tokens on 1 or 2 processes, so the validation curves agree too
    ref_val, got_val = (
        [r["val_loss"] for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "eval"]
        for d in (reference_dir, run_dir)
    )
    assert len(got_val) == len(ref_val) == 2 and got_val == pytest.approx(ref_val, rel=2e-4)


@pytest.mark.slow
def test_golden_losses(tmp_path):
    """The first steps of the smoke model against a recorded curve: a change to the math shows here,
    on any platform (the corpus is a file in tests/assets, not the Python install's own docs)."""
    golden = json.loads(GOLDEN.read_text())
    assert golden["overrides"] == SHORT_RUN
    assert golden["corpus_sha256"] == hashlib.sha256(CORPUS.read_bytes()).hexdigest(), (
        "tests/assets/golden_corpus.jsonl changed: `python -m tests.regenerate_golden` re-records the curve"
    )
    assert golden_losses(tmp_path) == pytest.approx(golden["losses"], rel=GOLDEN_RTOL), (
        "the golden loss curve moved: if the math changed on purpose, re-record it with "
        "`python -m tests.regenerate_golden`"
    )


@pytest.mark.slow
def test_every_progress_line_carries_its_own_steps_loss_the_stop_step_too(smoke_data, tmp_path):
    """A log (no terminal) gets one progress line per step. It used to draw step N with step N-1's
    figures first (the bar moved before the step's record), and at a stop nothing redrew it: the stop
    step seemed to log the loss of the step before (issue 33, seen on an H100 with --log_interval 1).
    Each line's loss is now the one metrics.jsonl records for that step, the stop step's included."""
    import re

    run_dir = tmp_path / "run"
    log = launch_training(smoke_data, run_dir, log_interval=1, stop_at_step=6, save_interval=3)
    recorded = {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("kind") == "train"}
    assert sorted(recorded) == [1, 2, 3, 4, 5, 6]
    drawn = {}
    for frame in re.split(r"[\r\n]", log):
        match = re.search(r"train:.*?\b(\d+)/\d+ .*?loss=([0-9.]+)", frame)
        if match:
            drawn.setdefault(int(match.group(1)), set()).add(float(match.group(2)))
    assert 6 in drawn, log[-2000:]
    for step, losses in drawn.items():
        assert losses == {round(recorded[step], 3)}, (step, losses, recorded[step])
