"""`hf-pretrain export` on the reference run: the folder, its logits, its loaders, its card, FSDP."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from accelerate import Accelerator
from huggingface_hub import ModelCard
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, pipeline

from hf_pretrain.checkpoints.load import load_checkpoint_model
from hf_pretrain.checkpoints.manifest import CheckpointError, write_manifest
from hf_pretrain.checkpoints.store import resolve_checkpoint
from hf_pretrain.config import load_recipe
from hf_pretrain.exit_codes import EXIT_CONFIG
from hf_pretrain.model.llama import build_model
from hf_pretrain.optim.build import build_optimizer
from hf_pretrain.publish import export_command
from hf_pretrain.run_folder.run_dir import read_jsonl
from tests.helpers import OUTSIDE_CHECKOUT, SHORT_RUN, offline_env

pytestmark = pytest.mark.slow
INPUT_IDS = torch.randint(0, 4096, (2, 48), generator=torch.Generator().manual_seed(0))


def checkpoint_dir(run_dir, step):
    return run_dir / "checkpoints" / f"step_{step:08d}"


@pytest.fixture(scope="module")
def exports(reference_run, tmp_path_factory):
    """The reference run exported twice, fp32 and bf16 (the default), through the command line."""
    run_dir, _ = reference_run
    root = tmp_path_factory.mktemp("exports")
    common = ["--checkpoint", str(run_dir), "--hardware", "2 CPU cores", "--price_per_hour", "0.5"]
    assert export_command.main([*common, "--out", str(root / "fp32"), "--dtype", "fp32"]) == 0
    assert export_command.main([*common, "--out", str(root / "bf16")]) == 0
    return root


def training_model_logits(run_dir, step):
    """Logits of the model as training restores it: built from the recipe, state loaded by Accelerate."""
    checkpoint = checkpoint_dir(run_dir, step)
    model = build_model(AutoConfig.from_pretrained(checkpoint))
    optimizer = build_optimizer(model, load_recipe(str(run_dir / "resolved_recipe.yaml")).optim, fused=False)
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.load_state(str(checkpoint))
    with torch.no_grad():
        return model.eval()(input_ids=INPUT_IDS).logits


def logits(folder):
    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(folder)(input_ids=INPUT_IDS).logits.float()


def test_export_writes_a_standard_model_folder(exports):
    for dtype, torch_dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        folder = exports / dtype
        names = {p.name for p in folder.iterdir()}
        assert names == {
            "model.safetensors",
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "README.md",
            "loss_curve.png",
        }
        with safe_open(folder / "model.safetensors", "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {torch_dtype}
        config = json.loads((folder / "config.json").read_text())
        assert config["use_cache"] is True and config["architectures"] == ["LlamaForCausalLM"]
    tokenizer = AutoTokenizer.from_pretrained(exports / "bf16")
    generation = json.loads((exports / "bf16" / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tokenizer.eos_token_id
    assert generation["bos_token_id"] == tokenizer.bos_token_id
    assert generation["pad_token_id"] == tokenizer.pad_token_id
    assert sorted(p.name for p in exports.iterdir()) == ["bf16", "fp32"]  # built beside --out, renamed into place


def test_exported_logits_equal_the_training_model(reference_run, exports):
    run_dir, _ = reference_run
    trained = training_model_logits(run_dir, SHORT_RUN["max_steps"])
    assert torch.equal(logits(exports / "fp32"), trained)  # same weights, same math: bit for bit
    assert torch.equal(logits(run_dir / "final"), trained)
    # bf16 rounds each weight to 8 significant bits; the logits move by well under 1% of their range
    torch.testing.assert_close(logits(exports / "bf16"), trained, atol=0.05, rtol=0.02)


def test_export_loads_with_auto_classes_and_a_pipeline(reference_run, exports):
    run_dir, _ = reference_run
    folder = exports / "bf16"
    generator = pipeline("text-generation", model=str(folder))
    out = generator("def fibonacci(n):", max_new_tokens=6, do_sample=False)[0]["generated_text"]
    assert out.startswith("def fibonacci(n):")
    # the tokenizer encodes as the training tokenizer did, through every loader
    text = "The capital of France is Paris.\n\tdef f(x): return x ** 2  # ünïcode"
    expected = AutoTokenizer.from_pretrained(checkpoint_dir(run_dir, 12))(text).input_ids
    assert AutoTokenizer.from_pretrained(folder)(text).input_ids == expected
    assert PreTrainedTokenizerFast.from_pretrained(folder)(text).input_ids == expected
    assert PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))(text).input_ids == expected
    # what a plain-fast-tokenizer loader (transformers 4) reads: no v5-only class or keys
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert not {"backend", "is_local", "local_files_only"} & set(config)
    special = json.loads((folder / "special_tokens_map.json").read_text())
    assert special["eos_token"] == config["eos_token"] == "<|endoftext|>"


def test_model_card_describes_the_run(reference_run, exports):
    run_dir, _ = reference_run
    folder = exports / "bf16"
    card = ModelCard.load(folder / "README.md")
    assert card.data.license == "apache-2.0" and "hf-pretrain" in card.data.tags
    assert card.data.pipeline_tag == "text-generation" and card.data.library_name == "transformers"
    assert not card.data.eval_results  # nothing measured yet
    # the opening sentence, and the same progress as metadata, which the demo Space reads
    # (hf_pretrain/publish/space_template/app.py)
    assert "step 12 of 12, 24,576 tokens." in card.text
    assert card.data.hf_pretrain == {"recipe": "smoke", "step": 12, "max_steps": 12, "tokens_seen": 24_576}
    records = read_jsonl(run_dir / "metrics.jsonl")
    last_train = [r for r in records if r["kind"] == "train"][-1]["loss"]
    last_val = [r for r in records if r["kind"] == "eval"][-1]["val_loss"]
    tokens = SHORT_RUN["max_steps"] * SHORT_RUN["global_batch_tokens"]
    for expected in (
        f"| final train loss | {last_train:.4f} |",
        f"| final validation loss | {last_val:.4f} |",
        f"| tokens | {tokens:,} |",
        "| hardware | 2 CPU cores |",
        "(at $0.5/h)",
        "| layers | 4 |",
        "![Training and validation loss](loss_curve.png)",
        "**Step 6**",
        "**Step 12**",
        "| def fibonacci(n): |",
        "hf-pretrain:eval:start",
    ):
        assert expected in card.text, expected
    assert (folder / "loss_curve.png").read_bytes().startswith(b"\x89PNG")
    # the usage example loads the folder by its name, never this machine's path (issue 45)
    assert 'pipeline("text-generation", model="./bf16")' in card.text and str(folder.parent) not in card.text


def test_an_older_checkpoint_is_exported_as_it_was(reference_run, tmp_path):
    run_dir, _ = reference_run
    assert (
        export_command.main(
            ["--checkpoint", str(checkpoint_dir(run_dir, 8)), "--out", str(tmp_path / "s8"), "--dtype", "fp32"]
        )
        == 0
    )
    saved = load_file(checkpoint_dir(run_dir, 8) / "model.safetensors")
    exported = load_file(tmp_path / "s8" / "model.safetensors")
    assert all(torch.equal(saved[k], exported[k]) for k in saved)
    card = (tmp_path / "s8" / "README.md").read_text()
    step8 = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train" and r["step"] == 8][0]
    assert "| steps | 8 |" in card and f"| final train loss | {step8['loss']:.4f} |" in card
    assert "**Step 12**" not in card  # nothing from after the checkpoint


def test_newest_complete_checkpoint_wins_and_broken_ones_are_skipped(reference_run, tmp_path):
    run_dir, _ = reference_run
    shutil.copytree(run_dir / "checkpoints", tmp_path / "checkpoints")
    weights = checkpoint_dir(tmp_path, 12) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, wrong bytes: only the checksum catches it
    weights.write_bytes(bytes(data))
    notes = []
    assert resolve_checkpoint(tmp_path, log=notes.append).train_state["step"] == 8
    assert "step_00000012" in notes[0] and "fails its checksum" in notes[0]
    shutil.rmtree(checkpoint_dir(tmp_path, 8))
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        resolve_checkpoint(tmp_path)


def test_weights_saved_by_a_compiled_model_and_incomplete_weights(reference_run, tmp_path):
    run_dir, _ = reference_run
    source = checkpoint_dir(run_dir, 12)
    compiled = tmp_path / "compiled"
    shutil.copytree(source, compiled)
    state = load_file(source / "model.safetensors")
    save_file({f"_orig_mod.{k}": v for k, v in state.items()}, compiled / "model.safetensors")
    write_manifest(compiled)
    model = load_checkpoint_model(compiled)
    assert torch.equal(model.model.norm.weight, state["model.norm.weight"])

    state.pop("model.norm.weight")
    save_file(state, compiled / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.norm.weight"):
        load_checkpoint_model(compiled)


def test_fsdp_sharded_checkpoint_exports_the_same_weights(reference_run, exports, tmp_path):
    run_dir, _ = reference_run
    sharded = tmp_path / "run" / "checkpoints" / "step_00000012"
    subprocess.run(
        [sys.executable, "-m", "tests.fsdp_checkpoint", str(checkpoint_dir(run_dir, 12)), str(sharded)],
        cwd=OUTSIDE_CHECKOUT,
        env=offline_env(),
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert (sharded / "pytorch_model_fsdp_0" / ".metadata").is_file()
    assert not (sharded / "model.safetensors").exists()
    assert (
        export_command.main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--dtype", "fp32"])
        == 0
    )
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (
        exports / "fp32" / "model.safetensors"
    ).read_bytes()


def test_export_says_what_is_wrong(reference_run, exports, tmp_path, capsys):
    run_dir, _ = reference_run
    assert export_command.main(["--checkpoint", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]) == EXIT_CONFIG
    assert "neither a checkpoint" in capsys.readouterr().err
    assert export_command.main(["--checkpoint", str(run_dir), "--out", str(exports / "bf16")]) == EXIT_CONFIG
    assert "--overwrite" in capsys.readouterr().err
    assert (exports / "bf16" / "model.safetensors").is_file()  # untouched


def test_the_card_names_local_files_without_the_machines_paths():
    """Issue 38: the card (pushed to the Hub) listed the absolute paths of the user's data files."""
    from hf_pretrain.config import SourceConfig
    from hf_pretrain.publish.model_card import TEMPLATE, source_label

    named = SourceConfig(kind="files", name="notes", paths=["/home/ann/private/notes/*.txt", "/srv/x/a.jsonl"])
    unnamed = SourceConfig(kind="files", paths=["/home/ann/private/corpus.jsonl.gz"])
    assert source_label(named) == "local files `notes` (`*.txt`, `a.jsonl`)"
    assert source_label(unnamed) == "local files `corpus.jsonl.gz`"
    assert source_label(SourceConfig(kind="hub", name="HuggingFaceFW/fineweb-edu")) == "hub `HuggingFaceFW/fineweb-edu`"
    assert "document shares" not in TEMPLATE and "share of the training samples" in TEMPLATE
