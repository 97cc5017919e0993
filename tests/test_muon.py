"""`optimizer: muon`: which tensors Muon trains, its state in a checkpoint, and real runs with it."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

from hf_pretrain import bench
from hf_pretrain.bench.quality import Curve, QualityRequest, beaten_by_first_model, savings, summary_lines
from hf_pretrain.config import load_recipe
from hf_pretrain.model.llama import build_model, llama_config
from hf_pretrain.optim.build import build_optimizer, set_learning_rate
from hf_pretrain.optim.muon import MUON_GROUP, MuonAdamW
from tests.helpers import CARD, bench_children_started_warm, data_of, launch_training
from tests.test_gpu_paths import launch_fsdp
from tests.test_train import checkpoint_weights, train_losses


def smoke_model(**overrides):
    recipe = load_recipe("smoke", {"optimizer": "muon", **overrides})
    torch.manual_seed(0)
    return recipe, build_model(llama_config(recipe.model, 4096))


def test_every_decoder_matrix_is_on_muon_and_nothing_else():
    recipe, model = smoke_model()
    optimizer = build_optimizer(model, recipe.optim, fused=False)
    on_muon = {id(p) for g in optimizer.param_groups if g[MUON_GROUP] for p in g["params"]}
    for name, param in model.named_parameters():
        matrix = name.startswith("model.layers.") and param.ndim == 2
        assert (id(param) in on_muon) == matrix, name
    names = {n for n, p in model.named_parameters() if id(p) in on_muon}
    layers = recipe.model.num_hidden_layers
    assert len(names) == 7 * layers  # q, k, v, o, gate, up, down in every layer
    # the embedding (tied to the head) decays on AdamW; norms never decay
    adamw = [g for g in optimizer.param_groups if not g[MUON_GROUP]]
    assert model.model.embed_tokens.weight in adamw[0]["params"] and adamw[0]["weight_decay"] == 0.1
    assert all(p.ndim == 1 for p in adamw[1]["params"]) and adamw[1]["weight_decay"] == 0.0


def test_adamw_recipe_builds_plain_adamw():
    recipe = load_recipe("smoke")
    model = build_model(llama_config(recipe.model, 4096))
    assert type(build_optimizer(model, recipe.optim, fused=False)) is torch.optim.AdamW


def test_the_schedule_drives_both_rates_and_muon_learning_rate_scales_the_matrices():
    recipe, model = smoke_model(learning_rate=2e-3, muon_learning_rate=1e-2)
    optimizer = build_optimizer(model, recipe.optim, fused=False)
    set_learning_rate(optimizer, 1e-3)  # half the peak
    rates = {g[MUON_GROUP]: g["lr"] for g in optimizer.param_groups}
    assert rates == {True: pytest.approx(5e-3), False: pytest.approx(1e-3)}
    # the inner optimizers read the same group objects
    assert optimizer.muon.param_groups[0]["lr"] == pytest.approx(5e-3)


def _one_step(model, optimizer, batch):
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def test_state_dict_round_trip_continues_bitwise():
    recipe, model = smoke_model()
    optimizer = build_optimizer(model, recipe.optim, fused=False)
    batches = torch.randint(0, 4096, (4, 2, 33), generator=torch.Generator().manual_seed(1))
    for batch in batches[:2]:
        _one_step(model, optimizer, batch)
    assert any("momentum_buffer" in s for s in optimizer.state.values())  # Muon's state
    assert any("exp_avg_sq" in s for s in optimizer.state.values())  # AdamW's
    saved_model, saved_optimizer = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    expected = [_one_step(model, optimizer, b) for b in batches[2:]]

    _, resumed = smoke_model()
    resumed.load_state_dict(saved_model)
    reloaded = build_optimizer(resumed, recipe.optim, fused=False)
    reloaded.load_state_dict(saved_optimizer)
    assert [_one_step(resumed, reloaded, b) for b in batches[2:]] == expected
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), resumed.parameters(), strict=True))


def test_an_adamw_state_is_refused_by_name():
    recipe, model = smoke_model()
    adamw = build_optimizer(model, load_recipe("smoke").optim, fused=False)
    muon = build_optimizer(model, recipe.optim, fused=False)
    assert isinstance(muon, MuonAdamW)
    with pytest.raises(ValueError, match="not Muon \\+ AdamW's"):
        muon.load_state_dict(adamw.state_dict())


@pytest.mark.slow
def test_muon_learns_faster_than_adamw_at_equal_tokens(smoke_data, tmp_path):
    """The same 40 steps, init and batches: Muon's final loss is lower by a margin (measured 0.2-0.4)."""
    runs = {}
    for optimizer in ("adamw", "muon"):
        run_dir = tmp_path / optimizer
        launch_training(
            smoke_data,
            run_dir,
            optimizer=optimizer,
            max_steps=40,
            learning_rate=3e-3,
            eval_interval=40,
            save_interval=40,
        )
        runs[optimizer] = train_losses(run_dir)
    adamw, muon = (sum(runs[k][-5:]) / 5 for k in ("adamw", "muon"))
    print(f"last 5 steps: adamw {adamw:.3f}, muon {muon:.3f}")
    assert muon < adamw - 0.1, f"muon {muon:.3f} vs adamw {adamw:.3f} over the last 5 steps"


@pytest.mark.slow
def test_muon_resumes_bitwise_and_fsdp2_matches_one_process(smoke_data, tmp_path):
    reference = tmp_path / "reference"
    launch_training(smoke_data, reference, optimizer="muon")
    resumed = tmp_path / "resumed"
    launch_training(smoke_data, resumed, optimizer="muon", stop_at_step=5)
    log = launch_training(smoke_data, resumed, optimizer="muon")
    assert "resumed from" in log
    assert train_losses(resumed) == train_losses(reference)
    ref, got = checkpoint_weights(reference, 12), checkpoint_weights(resumed, 12)
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    # Several processes: FSDP2 shards each matrix, and Muon's Newton-Schulz runs on the DTensor (global
    # semantics: the same math, with gathers). Under DDP Muon steps on the whole all-reduced gradient, as
    # AdamW does; the optimizer has no code of its own for it (tests/test_train.py holds DDP to one process).
    fsdp = tmp_path / "fsdp"
    launch_fsdp(smoke_data, fsdp, optimizer="muon")
    assert train_losses(fsdp) == pytest.approx(train_losses(reference), rel=2e-4)


@pytest.mark.slow
def test_resuming_an_adamw_run_with_muon_is_refused_naming_the_key(reference_run, smoke_data, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run[0] / "checkpoints" / "step_00000008", run_dir / "checkpoints" / "step_00000008")
    log = launch_training(smoke_data, run_dir, optimizer="muon", check=False)
    assert "preflight failed, nothing was started" in log, log[-3000:]
    assert "optimizer adamw -> muon since the checkpoint of step 8" in log, log[-3000:]
    assert "go back to --optimizer adamw" in log


def test_tokens_to_reach_interpolates_between_finished_models():
    curve = Curve("v", 1, tokens=[100, 200, 400], val_loss=[5.0, 4.0, 3.5])
    assert curve.tokens_to_reach(5.5) == 100  # reached by the first finished model already
    assert curve.tokens_to_reach(4.0) == pytest.approx(200)
    assert curve.tokens_to_reach(3.75) == pytest.approx(200 * 2**0.5)  # halfway in log tokens
    assert curve.tokens_to_reach(3.0) is None
    base = Curve("base", 1, tokens=[100, 200, 400], val_loss=[5.2, 4.4, 3.75])
    assert savings([base, curve], "base") == {"v": [pytest.approx(1 - 2**0.5 / 2)]}


def test_a_saving_reached_by_the_first_finished_model_is_said_as_a_lower_bound(tmp_path):
    request = QualityRequest(
        load_recipe("smoke"), None, data_of(load_recipe("smoke")), tmp_path, [], [1, 2], steps=16, points=2
    )
    base = [Curve("base", seed, tokens=[100, 200], val_loss=[5.0, 4.0]) for seed in (1, 2)]
    early = [Curve("early", seed, tokens=[100, 200], val_loss=[3.9, 3.5]) for seed in (1, 2)]
    late = [Curve("late", seed, tokens=[100, 200], val_loss=[4.5, 3.5]) for seed in (1, 2)]
    assert beaten_by_first_model(base + early + late, "base") == {"early": 2}
    said = "\n".join(summary_lines(request, base + early + late))
    assert "early: 50.0% fewer tokens or more (2 seed(s) reach it with the first finished model" in said
    assert "late: " in said and "late: 50.0%" not in said and "or more" not in said.split("late: ")[1]


@pytest.mark.slow
def test_quality_mode_on_a_tiny_grid(smoke_data, tmp_path, capsys, monkeypatch):
    """Two variants, two seeds, two finished models each: the table, the saving with its spread, the shrink.
    Its eight bench children start warm (tests/helpers.py)."""
    bench_children_started_warm(monkeypatch)
    out = tmp_path / "quality"
    argv = ["--recipe", "smoke", "--data_dir", str(smoke_data), "--num_hidden_layers", "1"]
    argv += ["--quality", "--variants", "optimizer=adamw,muon", "--seeds", "1,2", "--steps", "8"]
    argv += ["--points", "2", "--output", str(out), "--global_batch_tokens", "1024", "--micro_batch_size", "8"]
    assert bench.main(argv) == 0
    said = capsys.readouterr().out
    assert "model shrunk for the bench: num_hidden_layers 4 -> 1" in said
    result = json.loads((out / "quality.json").read_text())
    curves = result["curves"]
    assert [(c["variant"], c["seed"]) for c in curves] == [
        ("optimizer=adamw", 1),
        ("optimizer=adamw", 2),
        ("optimizer=muon", 1),
        ("optimizer=muon", 2),
    ]
    assert all(c["tokens"] == [4096, 8192] and not c["failed"] for c in curves)
    # the same init per seed: the seeds differ, the variants of one seed start alike
    assert curves[0]["val_loss"] != curves[1]["val_loss"]
    assert len(result["savings"]["optimizer=muon"]) == 2
    assert "optimizer=muon: " in said and ("(sd over 2 seeds)" in said or "never reaches" in said)
    print(said)
    assert (out / "quality.md").read_text().startswith("model shrunk")


def test_the_memory_estimate_knows_muons_single_moment():
    from hf_pretrain.economics.memory import decoder_matrix_parameters
    from tests.helpers import estimate_memory

    adamw, muon = load_recipe("1b"), load_recipe("1b", {"optimizer": "muon"})
    matrices = decoder_matrix_parameters(muon.model)
    assert matrices == 16 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192)  # 939.5M of the 1.04B
    saved = estimate_memory(adamw, 32000, CARD).optimizer - estimate_memory(muon, 32000, CARD).optimizer
    assert saved == 4 * matrices  # 3.76 GB less at the 1b shape
    # the split the estimate assumes is the optimizer's own
    recipe, model = smoke_model()
    on_muon = sum(
        p.numel()
        for g in build_optimizer(model, recipe.optim, fused=False).param_groups
        if g[MUON_GROUP]
        for p in g["params"]
    )
    assert on_muon == decoder_matrix_parameters(recipe.model)
