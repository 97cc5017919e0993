"""Continued pretraining from a published model (`init_from`, issue 22).

The base is a tiny Llama made here, of another shape than the smoke recipe's (untied, one KV head,
another RoPE base and epsilon) and with a tokenizer of its own (Llama's conventions: `<s>` added in
front, `</s>` ends documents, no pad token). It is reached as a local folder, and as a Hub id through
a huggingface_hub cache laid out in the test (HF_HUB_OFFLINE=1 throughout: nothing reaches the network).

- prepare tokenizes with its tokenizer (no BPE fitted); the doctor passes the pair and refuses, by name,
  data of another tokenizer, a recipe of another shape, a non-Llama folder, an id not in the cache;
- the first step's loss equals transformers' loss of the base on the same batch (within 1e-5), training
  lowers it, a kill and a resume are bitwise (and the resume reads its checkpoint, not the base: the
  base is gone by then), the export has the base's shape and the card's `base_model` names it;
- 2 CPU processes under DDP and under FSDP2 start from the same weights (the same first loss).
- stop, going further, eval and the demo's export work on a run whose base folder has been deleted.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard, constants
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from hf_pretrain.config import RecipeError, load_recipe
from hf_pretrain.data.prepare_run import prepare
from hf_pretrain.data.prepared import read_meta
from hf_pretrain.data.sources import mixture
from hf_pretrain.data.tokenizer import TokenizerError, load_pretrained_tokenizer, load_tokenizer, tokenizer_hash
from hf_pretrain.exit_codes import EXIT_PREFLIGHT
from hf_pretrain.hub_cache import hub_id_of_folder
from hf_pretrain.model.initialisation import InitFromError, base_model_id, load_base_weights, model_config, open_base
from hf_pretrain.model.llama import build_model
from hf_pretrain.preflight.init_from import check_init_from
from hf_pretrain.store.location import Location
from tests.helpers import OUTSIDE_CHECKOUT, SHORT_RUN, build_train_loader, launch_training, offline_env, run_captured
from tests.test_gpu_paths import assert_resumed_exactly, launch_fsdp, train_losses

# Another shape than smoke's (128 wide, 4 layers, 4/2 heads, tied, theta 1e4, eps 1e-5).
BASE_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "max_position_embeddings": 256,
    "rope_theta": 50000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
BASE_VOCAB = 700  # BPE entries, its three special tokens included (smoke's is 4096)
HUB_ID = "hf-pretrain-test/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
FIRST_LOSS_TOLERANCE = 1e-5
PRETRAIN_STEPS = 40


def init_from_row(recipe):
    """The doctor's init_from row, handed where the data lives as `run_checks` hands it (the door's `Where`)."""
    return check_init_from(recipe, data=Location.of(recipe.data.data_dir))


def llama_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """A byte-level BPE with Llama's special tokens and conventions: `<s>` in front of every encoding."""
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BASE_VOCAB,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", backend.token_to_id("<s>"))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def make_base(folder: Path, tokenizer: PreTrainedTokenizerFast, pretrain_on: Path | None = None, **shape) -> Path:
    """A LlamaForCausalLM folder (fp32 safetensors, config.json, tokenizer) with weights of its own: a
    wider init than a recipe's, from another seed, then (`pretrain_on` a data folder) `PRETRAIN_STEPS`
    steps of AdamW on it in another data order, so that its loss is far from a fresh model's."""
    config = LlamaConfig(
        **{**BASE_SHAPE, **shape},
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=0.08,
    )
    torch.manual_seed(7)
    model = LlamaForCausalLM(config)
    if pretrain_on is not None:
        overrides = {**base_overrides(folder, folder, len(tokenizer)), "data_dir": str(pretrain_on), "seed": 99}
        batches = iter(build_train_loader(load_recipe("smoke", overrides), 0, 1, 1, start_step=0))
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for _ in range(PRETRAIN_STEPS):
            tokens = next(batches)
            model(input_ids=tokens, labels=tokens).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def base_overrides(init_from: str | Path, tokenizer: str | Path, vocab_size: int) -> dict:
    """The flags that make the smoke recipe agree with the base model."""
    return {
        **BASE_SHAPE,
        "vocab_multiple": 1,
        "vocab_size": vocab_size,
        "init_from": str(init_from),
        "tokenizer": str(tokenizer),
    }


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict:
    """The base model as a local folder and in a Hub cache, and the smoke corpus prepared with its tokenizer."""
    root = tmp_path_factory.mktemp("init_from")
    texts = [
        text
        for _, text in zip(
            range(400),
            (t for _, t in mixture(load_recipe("smoke").data.sources, load_recipe("smoke").train.seed)),
            strict=False,
        )
    ]
    tokenizer = llama_tokenizer(texts)
    folder = root / "tiny-llama"
    tokenizer.save_pretrained(folder)
    overrides = base_overrides(folder, folder, len(tokenizer))
    data_dir = root / "data"
    prepare(load_recipe("smoke", {**overrides, "data_dir": str(data_dir)}), log=lambda _: None)
    make_base(folder, tokenizer, pretrain_on=data_dir)
    hub_cache = root / "hub"
    repo = hub_cache / f"models--{HUB_ID.replace('/', '--')}"
    shutil.copytree(folder, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return {"folder": folder, "hub_cache": hub_cache, "data": data_dir, "overrides": overrides, "size": len(tokenizer)}


def recipe_for(base: dict, **overrides):
    return load_recipe("smoke", {**base["overrides"], "data_dir": str(base["data"]), **overrides})


def transformers_first_loss(base: dict, world_size: int = 1) -> float:
    """The base model's loss, computed by transformers alone, on the tokens of the run's first step."""
    recipe = recipe_for(
        base, **{k: v for k, v in SHORT_RUN.items() if k in ("global_batch_tokens", "micro_batch_size")}
    )
    model = LlamaForCausalLM.from_pretrained(base["folder"], dtype=torch.float32).eval()
    grad_accum = recipe.grad_accum_steps(world_size)
    losses = []
    with torch.no_grad():
        for rank in range(world_size):
            batches = iter(build_train_loader(recipe, rank, world_size, grad_accum, start_step=0))
            for _ in range(grad_accum):
                tokens = next(batches)
                losses.append(model(input_ids=tokens, labels=tokens).loss.item())  # transformers shifts
    return sum(losses) / len(losses)


# ---------------------------------------------------------------------- prepare and the checks
def test_prepare_uses_the_base_models_tokenizer_as_it_is(base):
    meta = read_meta(base["data"])
    assert meta["vocab_size"] == base["size"] == BASE_VOCAB
    assert meta["eos_id"] == load_pretrained_tokenizer(base["folder"]).eos_token_id  # `</s>`, not a fitted EOS
    assert meta["tokenizer_hash"] == tokenizer_hash(load_tokenizer(base["data"]))
    tokens = load_tokenizer(base["data"])("def f(x):").input_ids
    assert tokens[0] == load_tokenizer(base["data"]).bos_token_id  # its conventions came along


def test_the_doctor_passes_the_base_and_its_data(base):
    (result,) = init_from_row(recipe_for(base))
    assert result.status == "pass", result
    assert "agrees with the recipe's model keys" in result.reason and "tokenized with its tokenizer" in result.reason
    assert init_from_row(load_recipe("smoke")) == []  # a run from random weights has no such row


def test_data_of_another_tokenizer_is_refused_by_name(base, smoke_data):
    (result,) = init_from_row(recipe_for(base, data_dir=str(smoke_data)))
    assert result.status == "fail"
    assert f"data_dir {smoke_data} was tokenized with another tokenizer than {base['folder']}'s" in result.reason
    # the fix works when pasted: a prepare into a new folder with the base's tokenizer, then that folder
    new = smoke_data.resolve().with_name(f"{smoke_data.name}-prepared")
    assert f"--tokenizer {base['folder']}" in result.fix and f"--data_dir {new}" in result.fix, result.fix
    assert f"give this command `--data_dir {new}`" in result.fix


def test_a_recipe_of_another_shape_is_refused_naming_each_key(base):
    (result,) = init_from_row(recipe_for(base, num_hidden_layers=4, rope_theta=10000.0, vocab_multiple=64))
    assert result.status == "fail"
    assert "num_hidden_layers 4 in the recipe, 3 in config.json" in result.reason
    assert "rope_theta 10000.0 in the recipe, 50000.0 in config.json" in result.reason
    assert "vocab_multiple 64 in the recipe, 1 in config.json" in result.reason  # 700 rows, not 704
    assert "--num_hidden_layers 3 --rope_theta 50000.0 --vocab_multiple 1" in result.fix


def test_a_folder_that_is_not_a_llama_is_refused(base, tmp_path):
    other = tmp_path / "gpt2"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    (result,) = init_from_row(recipe_for(base, init_from=str(other)))
    assert result.status == "fail" and "is a `gpt2` model (GPT2LMHeadModel), not a LlamaForCausalLM" in result.reason
    empty = tmp_path / "empty"
    empty.mkdir()
    (result,) = init_from_row(recipe_for(base, init_from=str(empty)))
    assert result.status == "fail" and "has no config.json" in result.reason


def test_init_from_needs_the_base_models_tokenizer(tmp_path):
    from hf_pretrain.data.prepared import DataMismatchError

    with pytest.raises(DataMismatchError, match="not a newly fitted BPE: set tokenizer to org/base"):
        prepare(load_recipe("smoke", {"init_from": "org/base", "data_dir": str(tmp_path / "d")}), log=print)
    assert not (tmp_path / "d").exists()
    with pytest.raises(RecipeError, match="no rows for tokens added"):
        load_recipe("smoke", {"init_from": "org/base", "tokenizer": "org/base", "special_tokens": ["<|x|>"]})


def test_init_from_an_export_on_the_data_its_run_trained_on_is_judged_by_the_tokenizers_hash(base):
    """`tokenizer: train` (the recipe of the run that made the export) with the data that run prepared:
    the data's tokenizer is byte for byte the export's, so nothing is refused and nothing is tokenized again."""
    recipe = recipe_for(base, tokenizer="train")  # Recipe.validate used to refuse this
    (result,) = init_from_row(recipe)
    assert result.status == "pass", result


def test_a_local_folder_never_goes_through_the_hub(base, monkeypatch):
    def no_hub(*args, **kwargs):
        raise AssertionError("a local folder reached huggingface_hub")

    monkeypatch.setattr("hf_pretrain.hub_cache.snapshot_download", no_hub)
    recipe = recipe_for(base)
    model = build_model(model_config(recipe.model, load_tokenizer(base["data"])))
    assert load_base_weights(model, open_base(str(base["folder"]), weights=True)) == len(model.state_dict())
    assert init_from_row(recipe)[0].status == "pass"


def test_a_hub_id_is_read_from_the_cache(base, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(base["hub_cache"]))
    found = open_base(HUB_ID, weights=True)
    assert found.folder == base["hub_cache"] / f"models--{HUB_ID.replace('/', '--')}" / "snapshots" / COMMIT
    assert found.config.num_key_value_heads == 1 and found.config.rope_parameters["rope_theta"] == 50000.0
    assert load_pretrained_tokenizer(HUB_ID).vocab_size == BASE_VOCAB  # prepare's `tokenizer:` takes the id too
    assert hub_id_of_folder(found.folder) == base_model_id(str(found.folder)) == HUB_ID
    assert base_model_id(str(base["folder"])) is None and base_model_id("") is None


def test_an_id_missing_from_the_cache_offline_names_it(base, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(base["hub_cache"]))
    with pytest.raises(
        InitFromError, match=r"model hf-pretrain-test/not-cached is not in the Hugging Face cache .* HF_HUB_OFFLINE=1"
    ):
        open_base("hf-pretrain-test/not-cached")
    with pytest.raises(TokenizerError, match="tokenizer hf-pretrain-test/not-cached is not in the Hugging Face cache"):
        load_pretrained_tokenizer("hf-pretrain-test/not-cached")


def test_training_refuses_an_id_missing_from_the_cache_with_exit_78_and_no_traceback(base, tmp_path):
    """The whole entry point, offline, as a scheduler would run it: refused before any work."""
    args = {**SHORT_RUN, **base["overrides"], "init_from": "hf-pretrain-test/not-cached"}
    args |= {"data_dir": base["data"], "output_dir": tmp_path / "run"}
    cmd = [sys.executable, "-m", "hf_pretrain.train", "--recipe", "smoke"]
    for key, value in args.items():
        cmd += [f"--{key}", str(value)]
    env = {**offline_env(), "HF_HUB_CACHE": str(base["hub_cache"])}
    result = run_captured(cmd, OUTSIDE_CHECKOUT, env, timeout=300)  # cold: HF_HUB_CACHE is read at import
    assert result.returncode == EXIT_PREFLIGHT, result.stderr[-3000:]
    assert "init_from model hf-pretrain-test/not-cached is not in the Hugging Face cache" in result.stderr
    assert "HF_HUB_OFFLINE=1 forbids downloading it" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_bf16_base_loads_into_fp32_weights_and_shapes_are_checked(base, tmp_path):
    folder = tmp_path / "bf16"
    shutil.copytree(base["folder"], folder)
    LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).to(torch.bfloat16).save_pretrained(folder)
    recipe = recipe_for(base, init_from=str(folder))
    config = model_config(recipe.model, load_tokenizer(base["data"]))
    assert config.dtype is None and config.use_cache is False
    model = build_model(config)
    load_base_weights(model, open_base(str(folder), weights=True))
    original = LlamaForCausalLM.from_pretrained(base["folder"], dtype=torch.float32)
    weight = "model.layers.2.mlp.down_proj.weight"
    assert model.state_dict()[weight].dtype == torch.float32
    assert torch.equal(model.state_dict()[weight], original.state_dict()[weight].to(torch.bfloat16).float())
    other = make_base(tmp_path / "wider", load_pretrained_tokenizer(base["folder"]), intermediate_size=192)
    with pytest.raises(
        InitFromError, match=r"down_proj.weight is \(64, 192\) in model.safetensors, .* has \(64, 176\)"
    ):
        load_base_weights(build_model(config), open_base(str(other), weights=True))


# ---------------------------------------------------------------------- runs
@pytest.mark.slow
def test_a_run_from_a_hub_id_starts_at_the_base_models_loss_resumes_exactly_and_exports(base, tmp_path):
    """One process, the base through the Hub cache: killed while writing its step-8 checkpoint, resumed
    from step 4 with the base gone from the cache (a resume reads its checkpoint), exported."""
    run_dir = tmp_path / "run"
    cache = tmp_path / "hub"
    shutil.copytree(base["hub_cache"], cache)
    overrides = {**base["overrides"], "init_from": HUB_ID}
    faults = {"HF_HUB_CACHE": str(cache), "HF_PRETRAIN_FAULTS": "kill-during-save:8"}
    killed = launch_training(base["data"], run_dir, check=False, env=faults, **overrides)
    assert f"init_from: {3 + 9 * 3} tensors of {HUB_ID} loaded from {cache}" in killed, killed[-3000:]
    before = train_losses(run_dir)
    assert max(before) == 8, killed[-3000:]
    expected = transformers_first_loss(base)
    assert abs(before[1] - expected) <= FIRST_LOSS_TOLERANCE, (before[1], expected)
    assert before[1] < math.log(BASE_VOCAB) - 0.5  # a trained model's loss (5.7 on this data), not a fresh one's (~6.6)
    shutil.rmtree(cache)  # the base is gone: the resume must not need it
    resumed = launch_training(base["data"], run_dir, env={"HF_HUB_CACHE": str(cache)}, **overrides)
    assert "resumed from" in resumed and "at step 4" in resumed and "tensors of" not in resumed
    assert f"the run goes on from its checkpoint of step 4: {HUB_ID} is not read" in resumed
    losses = train_losses(run_dir)
    assert_resumed_exactly(before, losses, 4, 8)
    first, last = (sum(losses[s] for s in steps) / 4 for steps in (range(1, 5), range(9, 13)))
    assert last < first - 0.05, losses  # it learns from there (5.55 -> 5.42 measured)

    from hf_pretrain.publish import export_command

    out = tmp_path / "exported"
    assert export_command.main(["--checkpoint", str(run_dir), "--out", str(out), "--dtype", "fp32"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert {key: config[key] for key in ("hidden_size", "num_key_value_heads", "tie_word_embeddings")} == {
        "hidden_size": 64,
        "num_key_value_heads": 1,
        "tie_word_embeddings": False,
    }
    assert config["rope_parameters"]["rope_theta"] == 50000.0 and config["vocab_size"] == BASE_VOCAB
    card = ModelCard.load(out / "README.md")
    assert card.data.base_model == HUB_ID
    assert f"continued from [`{HUB_ID}`](https://huggingface.co/{HUB_ID})" in card.text
    assert "of the data mixture below" in card.text
    final_card = ModelCard.load(run_dir / "final" / "README.md")
    assert final_card.data.base_model == HUB_ID
    exported = LlamaForCausalLM.from_pretrained(out)
    ids = load_pretrained_tokenizer(out)("def f(x):", return_tensors="pt").input_ids
    assert exported.generate(ids, max_new_tokens=4, do_sample=False).shape[1] == ids.shape[1] + 4


@pytest.mark.slow
def test_two_processes_start_from_the_base_models_weights(base, tmp_path):
    """DDP over gloo on 2 CPU processes, from a local folder: the same first loss as transformers'."""
    run_dir = tmp_path / "ddp"
    overrides = dict(base["overrides"])
    log = launch_training(base["data"], run_dir, processes=2, stop_at_step=4, **overrides)
    assert "2 process(es) x 1 micro-batches" in log and "init_from: " in log
    losses = train_losses(run_dir)
    assert abs(losses[1] - transformers_first_loss(base, world_size=2)) <= FIRST_LOSS_TOLERANCE
    assert losses[4] < losses[1]
    card_dir = tmp_path / "exported"
    from hf_pretrain.publish import export_command

    assert export_command.main(["--checkpoint", str(run_dir), "--out", str(card_dir)]) == 0
    card = ModelCard.load(card_dir / "README.md")
    assert card.data.base_model is None  # a local folder has no Hub id; the text names it
    assert f"continued from `{base['folder']}`" in card.text


@pytest.mark.slow
def test_fsdp2_on_two_cpu_processes_starts_from_the_base_models_weights(base, tmp_path):
    """Every process copies the weights into its whole model before `prepare` shards it."""
    run_dir = tmp_path / "fsdp"
    log = launch_fsdp(base["data"], run_dir, stop_at_step=4, **base["overrides"])
    assert "init_from: " in log and "2 process(es)" in log
    assert (run_dir / "checkpoints" / "step_00000004" / "pytorch_model_fsdp_0").is_dir()  # sharded
    losses = train_losses(run_dir)
    assert abs(losses[1] - transformers_first_loss(base, world_size=2)) <= FIRST_LOSS_TOLERANCE
    assert losses[4] < losses[1]


@pytest.mark.slow
def test_stop_going_further_eval_and_demo_work_once_the_base_is_gone(base, tmp_path):
    """A wsd run from a copy of the base, stopped at step 4; the copy deleted; `hf-pretrain stop` read on
    resume (read at step 5: a cooldown over steps 6-7, final/ at step 7); then going further to 12 steps
    from its branch point, step 5;
    then eval (bits per byte) and the demo's export of a checkpoint. None of it reads the base again."""
    from hf_pretrain.evaluation import eval_command
    from hf_pretrain.publish.demo import cached_export, model_choices
    from hf_pretrain.publish.export import resolve_checkpoint
    from hf_pretrain.publish.space_template.app import load_model
    from hf_pretrain.run_commands.stop_command import main as stop_main

    copy = tmp_path / "base-copy"
    shutil.copytree(base["folder"], copy)
    run_dir = tmp_path / "run"
    wsd = {"lr_schedule": "wsd", "decay_fraction": 0.25, "eval_interval": 0, "save_interval": 1000}
    overrides = {**base["overrides"], **wsd, "init_from": str(copy), "max_steps": 16}
    first = launch_training(base["data"], run_dir, stop_at_step=4, **overrides)
    assert "tensors of" in first and "stopped at step 4" in first, first[-3000:]
    shutil.rmtree(copy)  # from here on the base model is gone

    assert stop_main([str(run_dir), "--cooldown_steps", "2"]) == 0
    stopped = launch_training(base["data"], run_dir, **overrides)
    assert "resumed from" in stopped and "finished at step 7" in stopped and "tensors of" not in stopped
    assert "stopped early" in (run_dir / "final" / "README.md").read_text()

    further = launch_training(base["data"], run_dir, **{**overrides, "max_steps": 12})
    assert "going further" in further and "step_00000005" in further and "tensors of" not in further
    assert max(train_losses(run_dir)) == 12 and (run_dir / "final_step_00000007" / "model.safetensors").exists()
    card = ModelCard.load(run_dir / "final" / "README.md")
    assert f"continued from `{copy}`" in card.text and card.data.base_model is None  # a local folder: no Hub id

    text = tmp_path / "held_out.txt"
    text.write_text(" ".join(shutil.__doc__.split()) * 3)
    assert eval_command.main(["--model", str(run_dir / "final"), "--tasks", "none", "--text", str(text)]) == 0
    metrics = json.loads((run_dir / "final" / "eval" / "text_metrics.json").read_text())
    assert 0 < metrics["bits_per_byte"] < 8

    choices = model_choices(str(run_dir), tmp_path / "demo_cache", log=lambda _: None)
    assert [c.name for c in choices][-1] == "run/final"
    exported = cached_export(resolve_checkpoint(run_dir / "checkpoints" / "step_00000012"), tmp_path / "demo_cache")
    model, tokenizer = load_model(str(exported))
    ids = tokenizer("def f(x):", return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] == ids.shape[1] + 4


# ---------------------------------------------------------------------- a damaged base folder (issue 29)
def damaged_copy(base: dict, tmp_path: Path, what: str) -> Path:
    folder = tmp_path / f"damaged-{what}"
    shutil.copytree(base["folder"], folder)
    target = folder / ("model.safetensors" if what == "weights" else "config.json")
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])  # a download or a copy cut short
    return folder


@pytest.mark.parametrize("what", ["weights", "config"])
def test_the_doctor_catches_a_cut_weight_file_or_config_naming_it(base, tmp_path, what):
    folder = damaged_copy(base, tmp_path, what)
    (result,) = init_from_row(recipe_for(base, init_from=str(folder)))
    name = "model.safetensors" if what == "weights" else "config.json"
    assert result.status == "fail" and f"{folder / name}" in result.reason, result
    assert "cut short" in result.reason and "again" in result.fix


def test_training_from_a_cut_weight_file_exits_78_naming_it(base, tmp_path):
    folder = damaged_copy(base, tmp_path, "weights")
    args = {**SHORT_RUN, **base["overrides"], "init_from": folder}
    args |= {"data_dir": base["data"], "output_dir": tmp_path / "run"}
    cmd = [sys.executable, "-m", "hf_pretrain.train", "--recipe", "smoke"]
    for key, value in args.items():
        cmd += [f"--{key}", str(value)]
    result = run_captured(cmd, OUTSIDE_CHECKOUT, offline_env(), timeout=300)
    assert result.returncode == EXIT_PREFLIGHT, result.stderr[-3000:]
    assert f"{folder / 'model.safetensors'} is cut short" in result.stderr and "Traceback" not in result.stderr
