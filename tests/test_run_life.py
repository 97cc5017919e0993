"""A run's whole life (issue 11): the wsd schedule, stopping with a finished model (`hf-pretrain stop`,
early stopping), going further, the forecast of the loss curve, shortened runs, a resume after a
change, the data budget and the plan. Pure parts here; the real CPU runs are at the end (slow)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from hf_pretrain.checkpoints.layout import BRANCH_POINT, TRAIN_STATE
from hf_pretrain.checkpoints.manifest import write_manifest
from hf_pretrain.checkpoints.resume_plan import ResumeRefused
from hf_pretrain.checkpoints.resume_rules import plan_continuation
from hf_pretrain.checkpoints.store import prune_checkpoints
from hf_pretrain.config import RecipeError, build_recipe, load_recipe, math_keys
from hf_pretrain.data.loader import StepBatchSampler
from hf_pretrain.economics.cost import Phase
from hf_pretrain.economics.forecast import fit_loss_curve, forecast_fields, going_further, next_phase
from hf_pretrain.economics.planning import plan_command, scaling_laws
from hf_pretrain.exit_codes import EXIT_CONFIG
from hf_pretrain.optim.build import Cooldown, Schedule
from hf_pretrain.publish.model_card import _how_it_ended
from hf_pretrain.run_commands.stop_command import main as stop_main
from hf_pretrain.run_folder.run_dir import RunDir, read_jsonl
from hf_pretrain.run_folder.stop_request import read_stop_request, request_stop
from tests.helpers import (
    OUTSIDE_CHECKOUT,
    SHORT_RUN,
    FakeLog,
    data_budget_row,
    guards_of,
    launch_command,
    launch_training,
    offline_env,
    state_at_start,
)
from tests.stacks import communicate_or_diagnose


def train_config(**overrides):
    return build_recipe(
        {}, {"learning_rate": 1e-3, "min_lr_ratio": 0.1, "warmup_steps": 10, "max_steps": 100, **overrides}
    )


def schedule_of(recipe):
    """The run's schedule, as training builds it: the optim section and the run's length."""
    return Schedule(recipe.optim, max_steps=recipe.train.max_steps)


# ---------------------------------------------------------------------- schedules
def test_wsd_warms_up_holds_the_peak_and_decays_to_the_floor():
    linear = schedule_of(train_config(lr_schedule="wsd", decay_fraction=0.2, decay_shape="linear"))
    assert [linear.lr(s) for s in (1, 10)] == pytest.approx([1e-4, 1e-3])
    assert all(linear.lr(s) == 1e-3 for s in range(10, 81))  # the peak, to step 80 (100 - 20% of it)
    assert linear.lr(90) == pytest.approx(1e-4 + 0.9e-3 * 0.5)  # half way down, linear
    assert linear.lr(100) == pytest.approx(1e-4)
    assert linear.decay_start() == 80 and linear.stable_steps() == (11, 80)
    sqrt = schedule_of(train_config(lr_schedule="wsd", decay_fraction=0.2, decay_shape="1-sqrt"))
    assert sqrt.lr(85) == pytest.approx(1e-4 + 0.9e-3 * (1 - math.sqrt(0.25)))  # falls fast, then flattens
    assert sqrt.lr(100) == pytest.approx(1e-4)


def test_cosine_is_the_schedule_it_always_was():
    train = train_config()
    for step in (0, 5, 9, 10, 50, 99):  # the old closed form, 0-based index
        progress = min(1.0, (step - 10) / 90)
        old = 1e-3 * (step + 1) / 10 if step < 10 else 1e-4 + 0.5 * 0.9e-3 * (1 + math.cos(math.pi * progress))
        assert schedule_of(train).lr(step + 1) == old  # bitwise: the golden curve must not move
    assert schedule_of(train).decay_start() is None and schedule_of(train).stable_steps() == (11, 100)


def test_a_cooldown_decays_from_the_rate_it_starts_at_and_never_passes_max_steps():
    schedule = schedule_of(train_config(lr_schedule="wsd", decay_fraction=0.2, decay_shape="linear"))
    cooldown = schedule.cooldown(40, schedule.default_cooldown_steps(40), "asked")
    assert cooldown == Cooldown(40, 48, "asked")  # 20% of the 40 steps done
    assert schedule.lr(40, cooldown) == 1e-3 and schedule.lr(44, cooldown) == pytest.approx(1e-4 + 0.9e-3 * 0.5)
    assert schedule.lr(48, cooldown) == pytest.approx(1e-4) and schedule.end(cooldown) == 48
    assert schedule.cooldown(95, 30, "late").end == 100
    cosine = schedule_of(train_config())
    assert cosine.default_cooldown_steps(40) == 0  # a cosine stops at once unless asked for a cooldown
    late = cosine.cooldown(50, 10, "asked")
    assert late.end == 60 and cosine.lr(60, late) == pytest.approx(1e-4)


def test_a_run_that_ends_at_its_peak_is_unfinished_and_a_cosines_last_step_is_its_end():
    wsd = schedule_of(train_config(lr_schedule="wsd", decay_fraction=0.2))
    assert not wsd.left_decay_unfinished(100, wsd.lr(100))
    assert wsd.left_decay_unfinished(60, wsd.lr(60))  # stopped in its stable phase
    no_decay = schedule_of(train_config(lr_schedule="wsd", decay_fraction=0.0))
    assert no_decay.lr(100) == 1e-3 and no_decay.left_decay_unfinished(100, no_decay.lr(100))
    cosine = schedule_of(train_config(min_lr_ratio=0.0))
    assert not cosine.left_decay_unfinished(100, cosine.lr(100))
    assert cosine.left_decay_unfinished(50, cosine.lr(50))


# ---------------------------------------------------------------------- overrides a user expects to work
def test_a_shortened_run_drops_the_phases_past_its_end_and_warms_over_a_too_short_run():
    recipe = load_recipe("smoke", {"max_steps": 24})  # phases warmup 20, learning 100, settling 250
    assert recipe.run_phases == {"warmup": 20}
    assert any("learning (step 100), settling (step 250)" in note for note in recipe.notes())
    tiny = load_recipe("smoke", {"max_steps": 6})
    assert tiny.run_phases == {} and tiny.effective_warmup_steps == 6
    assert any("warmup_steps=20 is not below max_steps=6" in note for note in tiny.notes())
    assert [schedule_of(tiny).lr(s) for s in (3, 6)] == pytest.approx([1.5e-3, 3e-3])  # warms over the run
    with pytest.raises(RecipeError, match="phases.bad=0 must be a step"):
        load_recipe("smoke", {"phases": {"bad": 0}})


# ---------------------------------------------------------------------- stop requests
def test_the_stop_command_writes_a_request_the_loop_can_read(tmp_path, capsys):
    run = tmp_path / "run"
    assert stop_main([str(run)]) == EXIT_CONFIG  # not a run folder
    (run / "checkpoints").mkdir(parents=True)
    assert stop_main([str(run), "--cooldown_steps", "7"]) == 0
    assert "decays its learning rate over 7 steps" in capsys.readouterr().out
    assert read_stop_request(run).cooldown_steps == 7
    request_stop(run)
    assert read_stop_request(run).cooldown_steps is None
    RunDir(run).stop_request.write_text("{torn")
    assert read_stop_request(run).cooldown_steps is None  # unreadable still means: stop
    process = subprocess.run(
        [sys.executable, "-m", "hf_pretrain.cli", "stop", "--help"],
        capture_output=True,
        text=True,
        env=offline_env(),
        cwd=OUTSIDE_CHECKOUT,
    )
    assert process.returncode == 0 and "--cooldown_steps" in process.stdout


def guarded_state(tmp_path, **overrides):
    recipe = build_recipe({}, {"output_dir": str(tmp_path), "max_steps": 100, "warmup_steps": 10, **overrides})
    accelerator = SimpleNamespace(num_processes=1, is_main_process=True)
    log = FakeLog()
    return state_at_start(recipe), guards_of(recipe, accelerator, log), log


def test_a_stop_request_starts_a_wsd_cooldown_that_ends_the_run_with_final(tmp_path):
    state, guards, log = guarded_state(tmp_path, lr_schedule="wsd")
    state.step = 40
    assert guards.decide(state, []) is None
    request_stop(tmp_path, cooldown_steps=5)
    assert guards.decide(state, []) is None  # the cooldown begins: the run goes on, decaying
    assert state.cooldown == Cooldown(40, 45, "stop requested (hf-pretrain stop)") and state.decay_start == 40
    assert log.records[-1] == {"kind": "cooldown", "step": 40, "end": 45, "reason": state.cooldown.reason}
    state.step = 45
    stop = guards.decide(state, [])
    assert stop.finished and stop.exit_code == 0 and "decayed from step 40" in stop.reason
    assert not RunDir(tmp_path).stop_request.exists()  # answered


def test_a_cosine_stops_at_once_and_says_its_decay_is_unfinished(tmp_path):
    state, guards, _ = guarded_state(tmp_path)
    state.step = 40
    request_stop(tmp_path)
    stop = guards.decide(state, [])
    assert stop.finished and "did not finish its decay" in stop.reason and "cosine" in stop.reason
    assert _how_it_ended(state.schedule, state.state_dict())[1][0] == "decay"  # the card says so too


def test_early_stopping_on_a_wsd_run_decays_instead_of_cutting(tmp_path):
    state, guards, _ = guarded_state(tmp_path, lr_schedule="wsd", early_stop_patience=1)
    state.step = 50
    guards.observe_val_loss(3.0)
    guards.observe_val_loss(3.5)  # no improvement for 1 evaluation
    assert guards.decide(state, []) is None
    assert state.cooldown.start == 50 and state.cooldown.end == 60 and "early stop" in state.cooldown.reason


def test_pruning_keeps_the_last_checkpoint_before_the_decay(tmp_path):
    root = RunDir(tmp_path).checkpoints
    for step in (10, 20, 30, 40):
        (root / f"step_{step:08d}").mkdir(parents=True)
        (root / f"step_{step:08d}" / TRAIN_STATE).write_text(json.dumps({"step": step, BRANCH_POINT: step == 20}))
        write_manifest(root / f"step_{step:08d}")  # sealed: retention counts only checkpoints that are whole
    prune_checkpoints(tmp_path, keep=1)
    assert sorted(p.name for p in root.iterdir()) == ["step_00000020", "step_00000040"]


# ---------------------------------------------------------------------- going further, resuming after a change
def saved_state(recipe, step, cooldown=None):
    state = state_at_start(recipe)
    state.step, state.cooldown = step, cooldown
    return state.state_dict()


def test_going_further_with_wsd_branches_from_the_last_checkpoint_before_the_decay():
    old = build_recipe({}, {"max_steps": 250, "warmup_steps": 20, "lr_schedule": "wsd"})
    new = build_recipe({}, {"max_steps": 400, "warmup_steps": 20, "lr_schedule": "wsd"})
    plan_ = plan_continuation(saved_state(old, 250), new)
    assert plan_.branch == {
        "branch_step": 200,
        "from_step": 250,
        "from_max_steps": 250,
        "from_end": 250,
        "max_steps": 400,
    }
    assert "the peak holds to step 320" in " ".join(plan_.notes)
    # a stopped run (cooldown from step 90) goes further from step 90; the same max_steps keeps the cooldown
    stopped = saved_state(old, 108, Cooldown(90, 108, "asked"))
    assert plan_continuation(stopped, new).branch["branch_step"] == 90
    assert plan_continuation(stopped, old).branch is None and not plan_continuation(stopped, old).max_steps_changed
    # still in the stable phase: no branch, the decay just moves
    assert plan_continuation(saved_state(old, 150), new).branch is None
    with pytest.raises(ResumeRefused, match="choose max_steps of at least 250"):
        plan_continuation(saved_state(old, 250), build_recipe({}, {"max_steps": 230, "lr_schedule": "wsd"}))


def test_extending_a_cosine_says_what_the_learning_rate_does_and_needs_a_flag():
    old = build_recipe({}, {"max_steps": 250, "warmup_steps": 20, "learning_rate": 3e-3})
    with pytest.raises(
        ResumeRefused,
        match=r"reached learning rate 0.0003 at step 250.*step 251 gets 0.00121 "
        r"\(4.0x\)",
    ) as refused:
        plan_continuation(
            saved_state(old, 250), build_recipe({}, {"max_steps": 400, "warmup_steps": 20, "learning_rate": 3e-3})
        )
    assert "--allow_schedule_change true" in refused.value.fix
    allowed = build_recipe(
        {}, {"max_steps": 400, "warmup_steps": 20, "learning_rate": 3e-3, "allow_schedule_change": True}
    )
    assert "allow_schedule_change" in plan_continuation(saved_state(old, 250), allowed).notes[0]


def test_a_new_batch_or_context_stops_by_name_unless_allowed_which_moves_the_data_position():
    old = build_recipe({}, {"global_batch_tokens": 4096, "micro_batch_size": 16, "seq_len": 128})
    new_batch = {"global_batch_tokens": 8192, "micro_batch_size": 16, "seq_len": 128}
    with pytest.raises(ResumeRefused, match="global_batch_tokens 4096 -> 8192") as refused:
        plan_continuation(saved_state(old, 30), build_recipe({}, new_batch))
    assert "--allow_recipe_change true" in refused.value.fix
    new = build_recipe(
        {}, {"global_batch_tokens": 8192, "micro_batch_size": 16, "seq_len": 256, "allow_recipe_change": True}
    )
    saved = saved_state(old, 30)
    continuation = plan_continuation(saved, new)
    assert continuation.batch_changed == ["global_batch_tokens", "seq_len"]
    state = state_at_start(new)
    state.load_state_dict(saved)
    state.go_on_as(continuation, saved)
    # 30 steps of 32 samples of 128 tokens = 122,880 tokens = sample 480 of 256 tokens, from step 30 on
    assert state.data_origin == (30, 480) and state.data_position(31) == 480 + 32
    sampler = StepBatchSampler(10_000, 16, 2, 1, 0, seed=1, start_step=30, origin=state.data_origin)
    assert sampler.positions(30, 0) == range(480, 496) and sampler.epochs_after(30) == 0
    assert math_keys(new)["data"]["seq_len"] == 256


# ---------------------------------------------------------------------- the forecast
def power_law(tokens, e=2.0, a=3.0, alpha=0.4):
    return e + a * (np.asarray(tokens) / tokens[0]) ** -alpha


def test_the_fit_recovers_a_known_curve_and_shrugs_off_a_spike():
    tokens = np.arange(20, 250) * 4096.0
    losses = power_law(tokens) + np.random.default_rng(0).normal(0, 0.02, len(tokens))
    losses[60] += 2.0  # one spike: the soft-L1 loss keeps it from dragging the curve
    fit = fit_loss_curve(tokens, losses)
    assert fit.exponent == pytest.approx(0.4, abs=0.08) and fit.irreducible == pytest.approx(2.0, abs=0.25)
    far = tokens[-1] * 4
    assert abs(fit.loss_at(far) - power_law(np.array([tokens[0], far]))[1]) < 3 * fit.sd_at(far) + 0.02
    half = fit_loss_curve(tokens[:115], losses[:115])  # the first half predicts the second
    assert abs(half.loss_at(tokens[-1]) - power_law(tokens)[-1]) < 0.05
    assert fit_loss_curve(tokens[:5], losses[:5]) is None  # too few points to say anything


def test_forecast_fields_price_the_next_phase_and_going_further():
    tokens = np.arange(1, 101) * 1000.0
    records = [
        {"kind": "train", "step": s, "tokens": t, "loss": loss, "elapsed": 36.0 * s}
        for s, t, loss in zip(range(1, 101), tokens, power_law(tokens), strict=True)
    ]
    phases = [Phase("a", 0, 100), Phase("b", 100, 200), Phase("c", 200, 400)]
    fields = forecast_fields(records, (11, 400), 400, phases, price_per_hour=10.0)
    assert fields["forecast_loss"] == pytest.approx(power_law(np.array([1000.0, 400_000.0]))[1], abs=1e-3)
    assert fields["usd_left"] == pytest.approx(300 * 36 / 3600 * 10)
    drop = power_law(np.array([1000.0, 100_000.0, 200_000.0]))
    assert fields["next_phase"] == "b"
    assert fields["next_phase_usd_per_loss_point"] == pytest.approx(
        100 * 36 / 3600 * 10 / (drop[1] - drop[2]), rel=1e-3
    )
    assert next_phase(phases, 250, 400) == Phase("rest of the run", 250, 400)
    further = going_further(records, (11, 100), 200_000.0, price_per_hour=10.0)
    assert further.steps == 100 and further.cost == pytest.approx(10.0) and further.usd_per_loss_point > 0


# ---------------------------------------------------------------------- the plan
@pytest.mark.parametrize("compute", [1e18, 7.35e19, 5.76e23])
def test_the_compute_optimal_split_spends_exactly_the_budget(compute):
    n_opt, d_opt = scaling_laws.compute_optimal(compute)
    assert 6 * n_opt * d_opt == pytest.approx(compute, rel=0.01)
    assert 15 < d_opt / n_opt < 35  # about Chinchilla's 20 tokens per parameter


def test_plan_for_the_1b_recipe_with_nothing_else(capsys):
    assert plan_command.main(["--recipe", "1b"]) == 0
    out = capsys.readouterr().out
    assert "11.8B = 11.4 per parameter" in out and "FLOPs" in out and "20.8B" in out
    assert "N_opt 729M parameters x D_opt 16.8B tokens" in out
    assert "time and cost: unknown" in out and "--tokens_per_s" in out and "$1.79/h" in out


def test_plan_run_prices_going_further_and_the_report_draws_the_forecast(tmp_path, capsys):
    from hf_pretrain.config import save_recipe
    from hf_pretrain.run_commands import report

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    recipe = load_recipe("smoke", {"lr_schedule": "wsd", "price_per_hour": 2.0})
    save_recipe(recipe, run.resolved_recipe)
    tokens = np.arange(1, 201) * 4096.0
    with run.metrics.open("w") as f:
        for step, loss in zip(range(1, 201), power_law(tokens), strict=True):
            f.write(
                json.dumps(
                    {
                        "kind": "train",
                        "step": step,
                        "tokens": step * 4096,
                        "loss": loss,
                        "lr": 3e-3,
                        "tokens_per_s": 4096,
                        "elapsed": float(step),
                    }
                )
                + "\n"
            )
    assert plan_command.main(["--run", str(run.path), "--tokens", "2e6"]) == 0
    out = capsys.readouterr().out
    assert "going there: 289 more steps, 0.08 h" in out and "per loss point" in out
    page = report.write_report(run.path, tmp_path / "report")
    assert "## Forecast" in page.read_text() and (tmp_path / "report" / "forecast.png").stat().st_size > 1000


def _write_train_records(path: Path, steps, loss_of, mode: str = "a") -> None:
    with path.open(mode) as f:
        for step in steps:
            record = {"kind": "train", "step": step, "tokens": step * 4096, "loss": loss_of(step), "lr": 3e-3}
            f.write(json.dumps(record | {"tokens_per_s": 4096, "elapsed": float(step)}) + "\n")


def test_plan_run_fits_the_branch_that_went_on_after_a_stop_and_a_refusal_names_a_fix(tmp_path, capsys):
    """Issue 38: a run stopped (a cooldown from step 100) and then taken further from its checkpoint before
    the decay kept the old cooldown record: `plan --run` fitted only the steps before the stop, and with
    too few of them refused without a fix. It fits the lineage that went on, and a refusal says when."""
    from hf_pretrain.config import save_recipe

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    save_recipe(
        load_recipe("smoke", {"lr_schedule": "wsd", "max_steps": 400, "price_per_hour": 2.0}), run.resolved_recipe
    )
    curve = lambda step: float(power_law(np.array([step * 4096.0]))[0])  # noqa: E731
    _write_train_records(run.metrics, range(1, 101), curve, mode="w")
    with run.metrics.open("a") as f:  # the stop's cooldown began at step 100 (the branch point's step)
        f.write(json.dumps({"kind": "cooldown", "step": 100, "end": 120, "reason": "stop request"}) + "\n")
    _write_train_records(run.metrics, range(101, 301), curve)  # went further from step 100: stable again
    assert plan_command.main(["--run", str(run.path), "--tokens", "2e6"]) == 0
    out = capsys.readouterr().out
    assert "the loss curve over steps " in out
    fitted_to = int(out.split("the loss curve over steps ")[1].split(" ")[0].split("-")[1].replace(",", ""))
    assert fitted_to == 300, out  # the code before fitted steps up to 100, the stop

    short = RunDir(tmp_path / "short")
    short.path.mkdir()
    save_recipe(
        load_recipe("smoke", {"lr_schedule": "wsd", "max_steps": 400, "log_interval": 10}), short.resolved_recipe
    )
    _write_train_records(short.metrics, range(10, 60, 10), curve, mode="w")
    assert plan_command.main(["--run", str(short.path)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert (
        "too few to fit the loss curve" in err
        and f"rerun `hf-pretrain plan --run {short.path}` once the run has logged step" in err
    )


# ---------------------------------------------------------------------- data budget
def test_the_doctor_counts_epochs_when_the_plan_outgrows_the_data(smoke_data, tmp_path):
    fits = data_budget_row(load_recipe("smoke", {"data_dir": str(smoke_data)}))
    assert fits.status == "pass" and "0.83 epochs" in fits.reason
    repeats = data_budget_row(load_recipe("smoke", {"data_dir": str(smoke_data), "max_steps": 1000}))
    assert repeats.status == "warn" and "3.33 epochs" in repeats.reason and "logged" in repeats.reason


# ---------------------------------------------------------------------- real runs on CPU
def train_records(run_dir: Path) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def validation_loss(model_dir: Path, data_dir: Path, samples: int = 64) -> float:
    """The mean loss of a saved model on the first validation samples: the same yardstick for any folder."""
    from transformers import AutoModelForCausalLM

    from hf_pretrain.data.loader import PackedDataset
    from hf_pretrain.data.prepared import read_meta, shard_paths

    meta = read_meta(data_dir)
    dataset = PackedDataset(shard_paths(data_dir, meta, "validation"), 128, meta["dtype"])
    tokens = torch.stack([dataset[i] for i in range(min(samples, len(dataset)))])
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        targets = tokens[:, 1:].contiguous()
        return model(input_ids=tokens[:, :-1], labels=targets, shift_labels=targets).loss.item()


WSD = {"lr_schedule": "wsd", "decay_fraction": 0.2, "eval_interval": 0, "save_interval": 1000}


@pytest.mark.slow
def test_stop_now_on_a_running_wsd_job_ends_with_a_decayed_model_better_than_an_abrupt_stop(smoke_data, tmp_path):
    """`hf-pretrain stop` on a live two-process job: both processes begin the decay at the step the
    main one reads the request, then the job saves and writes final/; that model beats the one an
    abrupt stop at that step would have left (the checkpoint the run kept there, its branch point).
    docs/benchmarks.md has the figures, and the comparison at equal compute too."""
    run_dir, overrides = tmp_path / "stopped", {**SHORT_RUN, **WSD, "max_steps": 60, "log_interval": 1}
    command = launch_command(processes=2, data_dir=smoke_data, output_dir=run_dir, **overrides)
    # held before step 25 until the request is written: read at step 25, before the schedule's own decay
    # at 48 however fast the machine is (issue 49)
    release = tmp_path / "release"
    release.mkdir()
    held = {"HF_PRETRAIN_FAULTS": "hold:25", "HF_PRETRAIN_RELEASE": str(release)}
    process = subprocess.Popen(
        command,
        cwd=OUTSIDE_CHECKOUT,
        env={**offline_env(), **held},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while (
            not (run_dir / "metrics.jsonl").exists()
            or train_records(run_dir)[-1:] == []
            or train_records(run_dir)[-1]["step"] < 24
        ):
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0][-3000:]
            time.sleep(0.05)
        assert stop_main([str(run_dir), "--cooldown_steps", "12"]) == 0
        (release / "25").touch()
        log = communicate_or_diagnose(process, 300)[0]
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, log[-3000:]
    cooldown = next(r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "cooldown")
    start, end = cooldown["step"], cooldown["end"]
    assert end == start + 12 and start < 48 and train_records(run_dir)[-1]["step"] == end
    assert f"finished at step {end}" in log and (run_dir / "final" / "model.safetensors").exists()
    assert "2 process(es)" in log
    lrs = {r["step"]: r["lr"] for r in train_records(run_dir)}
    assert lrs[start] == SHORT_RUN_PEAK and lrs[end] == pytest.approx(SHORT_RUN_PEAK * 0.1)
    state = json.loads((run_dir / "checkpoints" / f"step_{end:08d}" / TRAIN_STATE).read_text())
    assert state["cooldown"]["start"] == start and not (run_dir / "stop_request.json").exists()
    assert json.loads((run_dir / "checkpoints" / f"step_{start:08d}" / TRAIN_STATE).read_text())[BRANCH_POINT]
    assert "stopped early" in (run_dir / "final" / "README.md").read_text()
    decayed = validation_loss(run_dir / "final", smoke_data)
    abrupt = validation_loss(run_dir / "checkpoints" / f"step_{start:08d}", smoke_data)
    print(
        f"\nstop asked at step {start}: validation loss {abrupt:.4f} stopping there, {decayed:.4f} after the "
        f"cooldown to step {end}"
    )
    assert decayed < abrupt


SHORT_RUN_PEAK = 3e-3  # the smoke recipe's learning_rate


@pytest.mark.slow
def test_going_further_equals_the_run_planned_that_long_and_every_log_survives_a_resume(smoke_data, tmp_path):
    """A wsd run to 16 steps (stopped and resumed mid-window on the way) extended to 24 is, bitwise, the
    run planned for 24 from the start: it goes on from step 13, its last checkpoint before the decay."""
    common = {**WSD, "log_interval": 5}
    planned = tmp_path / "planned"
    launch_training(smoke_data, planned, max_steps=24, **common)
    run_dir = tmp_path / "extended"
    launch_training(smoke_data, run_dir, max_steps=16, stop_at_step=7, **common)
    launch_training(smoke_data, run_dir, max_steps=16, **common)  # resumes at 7, inside the window of step 10
    assert [r["step"] for r in train_records(run_dir)] == [5, 10, 15, 16]
    log = launch_training(smoke_data, run_dir, max_steps=24, **common)
    assert "going further" in log and "step_00000013" in log
    got, want = train_records(run_dir), train_records(planned)
    assert [r["step"] for r in got] == [r["step"] for r in want] == [5, 10, 15, 20, 24]
    assert [(r["loss"], r["lr"]) for r in got] == [(r["loss"], r["lr"]) for r in want]  # bitwise, every log
    assert got[-1]["lr"] == pytest.approx(SHORT_RUN_PEAK * 0.1)  # it ends with a decay
    ref, ext = load_file(planned / "final" / "model.safetensors"), load_file(run_dir / "final" / "model.safetensors")
    assert all(torch.equal(ref[k], ext[k]) for k in ref)
    assert (run_dir / "final_step_00000016" / "model.safetensors").exists()  # the first ending is kept,
    assert (run_dir / "checkpoints" / "step_00000016.superseded").is_dir()  # out of the way of resume and pruning
    state = json.loads((run_dir / "checkpoints" / "step_00000024" / TRAIN_STATE).read_text())
    assert state["lineage"] == [
        {"branch_step": 13, "from_step": 16, "from_max_steps": 16, "from_end": 16, "max_steps": 24}
    ]
    assert "went further from its checkpoint of step 13" in (run_dir / "final" / "README.md").read_text()


@pytest.mark.slow
def test_a_run_resumed_on_another_number_of_processes_keeps_its_data_order(reference_run, smoke_data, tmp_path):
    """2 processes to step 4, 1 to step 8, 2 to the end: within the DDP tolerance of the 1-process run."""
    run_dir = tmp_path / "moved"
    launch_training(smoke_data, run_dir, processes=2, stop_at_step=4)
    launch_training(smoke_data, run_dir, processes=1, stop_at_step=8)
    log = launch_training(smoke_data, run_dir, processes=2)
    assert "2 process(es) x 1 micro-batches" in log and "at step 8" in log
    ref = [r["loss"] for r in train_records(reference_run[0])]
    assert [r["loss"] for r in train_records(run_dir)] == pytest.approx(ref, rel=2e-4)
    ref_w = load_file(reference_run[0] / "checkpoints" / "step_00000012" / "model.safetensors")
    got_w = load_file(run_dir / "checkpoints" / "step_00000012" / "model.safetensors")
    for key in ref_w:
        torch.testing.assert_close(got_w[key], ref_w[key], rtol=1e-3, atol=2e-4)


@pytest.mark.slow
def test_a_shortened_run_drops_its_late_phases_warms_over_the_run_and_logs_each_epoch(tmp_path):
    """`--max_steps 12` on the smoke recipe (phases at 20, 100, 250; warmup 20) runs, on a corpus small
    enough that 12 steps read it 1.2 times."""
    from tests.regenerate_golden import golden_overrides, prepare_golden_data

    data_dir = tmp_path / "data"
    prepare_golden_data(data_dir)
    log = launch_training(
        data_dir,
        tmp_path / "run",
        short=False,
        max_steps=12,
        log_interval=4,
        eval_interval=0,
        sources=golden_overrides(data_dir)["sources"],
    )
    assert "ends before phase(s) warmup (step 20), learning (step 100), settling (step 250)" in log
    assert "warmup_steps=20 is not below max_steps=12" in log and "1.24 epochs" in log
    epochs = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "epoch"]
    assert epochs == [{"kind": "epoch", "step": 10, "tokens": 40960, "epochs": 1}]
    assert "finished pass 1 over the training data" in log
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()


@pytest.mark.slow
def test_a_new_batch_stops_before_any_work_unless_allowed(reference_run, smoke_data, tmp_path):
    run_dir = tmp_path / "rebatched"
    shutil.copytree(reference_run[0] / "checkpoints" / "step_00000008", run_dir / "checkpoints" / "step_00000008")
    log = launch_training(smoke_data, run_dir, check=False, global_batch_tokens=4096)
    assert "global_batch_tokens 2048 -> 4096 since the checkpoint of step 8" in log
    assert "--allow_recipe_change true" in log and "preflight failed, nothing was started" in log
    log = launch_training(smoke_data, run_dir, global_batch_tokens=4096, allow_recipe_change=True)
    assert "the data stream goes on from the tokens read so far" in log and "at step 8" in log
    state = json.loads((run_dir / "checkpoints" / "step_00000012" / TRAIN_STATE).read_text())
    # 8 steps of 2,048 tokens = 128 samples of 128 tokens; then 4 steps of 32 samples
    assert state["data_origin"] == [8, 128] and state["data_position"] == 128 + 4 * 32
    assert state["tokens_seen"] == 8 * 2048 + 4 * 4096


def test_a_key_added_since_the_checkpoint_counts_as_its_default_not_as_a_change():
    """A checkpoint written before `chunked_loss` and `fp8_recipe` existed recorded no value for them:
    resuming it under their defaults changes nothing (a warning there named them as changed math);
    a value other than the default is still named."""
    from hf_pretrain.checkpoints.resume_rules import changed_math_keys

    recipe = load_recipe("smoke")
    keys = math_keys(recipe)
    # as checkpoints wrote them before the recipe had sections: every run key under `train`
    saved = {"model": keys.pop("model"), "data": keys.pop("data")}
    saved["train"] = {name: value for section in keys.values() for name, value in section.items()}
    assert changed_math_keys({"math_keys": saved}, math_keys(recipe)) == {}
    del saved["train"]["chunked_loss"], saved["train"]["fp8_recipe"]
    assert changed_math_keys({"math_keys": saved}, math_keys(recipe)) == {}
    chunked = build_recipe(recipe.to_dict(), {"chunked_loss": True})
    assert changed_math_keys({"math_keys": saved}, math_keys(chunked)) == {"chunked_loss": (False, True)}


def _folder_snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()
    }


@pytest.mark.slow
def test_a_finished_run_started_again_says_so_writes_nothing_and_status_reads_it(
    reference_run, smoke_data, tmp_path, capsys
):
    """Issue 38: the same command after the run completed said "resumed", drew a full bar and rewrote
    final/, and the doctor said "ready to train". Now it says the run finished and how to go further,
    writes nothing and exits 0; the doctor says the same; `hf-pretrain status` reads it for a person."""
    from hf_pretrain.preflight import doctor
    from hf_pretrain.run_commands.run_status import main as status_main

    run_dir = tmp_path / "run"
    shutil.copytree(reference_run[0], run_dir)
    before = _folder_snapshot(run_dir)
    log = launch_training(smoke_data, run_dir)
    assert f"the run in {run_dir} finished at step 12: nothing to train. To go further" in log, log[-3000:]
    assert "--max_steps" in log and "resumed" not in log
    assert _folder_snapshot(run_dir) == before  # no final/ rewritten, no status, no recipe, no metrics

    args = [f"--{key}={value}" for key, value in {**SHORT_RUN, "data_dir": smoke_data, "output_dir": run_dir}.items()]
    capsys.readouterr()
    assert doctor.main(["--recipe", "smoke", *args]) == 0
    out = capsys.readouterr().out
    assert "ready to train" not in out and "the run finished at step 12, nothing to train" in out

    assert status_main([str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{run_dir}: finished (exit 0), step 12 of 12, ")
    assert f"last checkpoint: {run_dir / 'checkpoints' / 'step_00000012'} (step 12;" in out
    assert "stop request: none" in out and "last logged: step 12, loss " in out
    # docs/survival.md's table: a finished run is exported; going further, with its recorded command, second
    assert f"  next: export it: hf-pretrain export --checkpoint {run_dir} --out exports/run\n  or to go further" in out
    assert "\n  the command: " in out and "hf_pretrain/train.py --recipe smoke" in out, out
    assert status_main([str(run_dir), "--verify"]) == 0 and "every byte checked" in capsys.readouterr().out
    assert _folder_snapshot(run_dir) == before
    assert status_main([str(tmp_path / "nothing")]) == EXIT_CONFIG
