"""An export as the clients people load it with see it: transformers 5.x and 4.x, GGUF readers, llama.cpp.

The model is 1b-shaped in what matters to a client (RoPE theta 500000, grouped-query attention, a
vocabulary padded to a multiple of 64, tied embeddings, ChatML markers) and tiny in size. It goes
through the real `hf-pretrain export` path from a checkpoint folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_pretrain.checkpoints.manifest import write_manifest
from hf_pretrain.checkpoints.store import resolve_checkpoint
from hf_pretrain.config import ModelConfig
from hf_pretrain.data.tokenizer import train_tokenizer
from hf_pretrain.model.llama import build_model, llama_config
from hf_pretrain.publish import export, export_command

gguf = pytest.importorskip("gguf", reason="the `gguf` package (extra `gguf`) is not installed")
from hf_pretrain.publish.gguf import GGUF_TYPES, GGUFError, check_gpt2_pre_tokenizer, write_gguf  # noqa: E402

HARD_STRINGS = [
    "The capital of France is",
    "emoji 🙂🚀👩‍👩‍👧 and CJK 東京都の天気は晴れ",
    "tabs\tand\nnewlines\r\n  and   runs of spaces",
    "control \x00\x07\x1b\x7f characters",
    "<|im_start|>user\nhi<|im_end|>",
    "café naïve Ελληνικά русский عربى",
    "def f(x):\n    return x ** 2  # comment",
]
PROMPT = "The quick brown fox"
# How far each GGUF type may move the logits of this tiny model (measured: f32 0, f16 3e-4, bf16 2e-3, q8_0 8e-3)
LOGIT_TOLERANCE = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.5e-2, "q8_0": 5e-2}


def corpus() -> list[str]:
    words = "the quick brown fox jumps over lazy dogs while café 東京 🙂 code def return print x y".split()
    return [" ".join(words[(i * 7 + j) % len(words)] for j in range(30)) + f"\n\t{i} {i * i}" for i in range(400)]


@pytest.fixture(scope="module")
def one_b_shaped_export(tmp_path_factory) -> Path:
    """A checkpoint folder of a tiny 1b-shaped model, exported with `hf-pretrain export` (fp32)."""
    root = tmp_path_factory.mktemp("clients")
    tokenizer = train_tokenizer(corpus(), 500, ["<|im_start|>", "<|im_end|>"])
    shape = ModelConfig(
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        rope_theta=500000.0,
        vocab_multiple=64,
    )
    config = llama_config(shape, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = build_model(config)
    checkpoint = root / "checkpoints" / "step_00000001"
    checkpoint.mkdir(parents=True)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied: saved once
    save_file(state, checkpoint / "model.safetensors")
    config.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    (checkpoint / "train_state.json").write_text(json.dumps({"step": 1, "tokens_seen": 1024}))
    write_manifest(checkpoint)
    out = root / "export"
    assert export_command.main(["--checkpoint", str(checkpoint), "--out", str(out), "--dtype", "fp32"]) == 0
    return out


def hf_logits_and_greedy(folder: Path) -> tuple[torch.Tensor, list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    inputs = tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits
        greedy = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    return logits, greedy[0].tolist()


# ------------------------------------------------------------------------------ transformers 5.x
def test_the_export_carries_what_older_clients_read(one_b_shaped_export):
    config = json.loads((one_b_shaped_export / "config.json").read_text())
    assert config["rope_theta"] == 500000.0  # transformers 4.x reads only this
    assert config["rope_parameters"]["rope_theta"] == 500000.0  # 5.x reads this
    tokenizer_config = json.loads((one_b_shaped_export / "tokenizer_config.json").read_text())
    assert tokenizer_config["model_input_names"] == ["input_ids", "attention_mask"]
    tokenizer = AutoTokenizer.from_pretrained(one_b_shaped_export)
    assert set(tokenizer(PROMPT)) == {"input_ids", "attention_mask"}  # no token_type_ids for generate(**)


# ------------------------------------------------------------------------------ GGUF
@pytest.mark.parametrize("gguf_type", GGUF_TYPES)
def test_transformers_loads_the_gguf_with_equal_logits_and_tokens(one_b_shaped_export, gguf_type, tmp_path):
    path = write_gguf(one_b_shaped_export, tmp_path / f"model-{gguf_type}.gguf", gguf_type)
    hf_tokenizer = AutoTokenizer.from_pretrained(one_b_shaped_export)
    gguf_tokenizer = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in HARD_STRINGS:
        assert gguf_tokenizer(text).input_ids == hf_tokenizer(text).input_ids, text
        assert gguf_tokenizer.decode(hf_tokenizer(text).input_ids) == text
    model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    assert model.config.rope_parameters["rope_theta"] == 500000.0
    reference, _ = hf_logits_and_greedy(one_b_shaped_export)
    inputs = hf_tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        difference = (model(**inputs).logits - reference).abs().max().item()
    assert difference <= LOGIT_TOLERANCE[gguf_type], (gguf_type, difference)


def test_gguf_metadata_as_the_reference_reader_lists_it(one_b_shaped_export, tmp_path):
    path = write_gguf(one_b_shaped_export, tmp_path / "model.gguf", "f16")
    reader = gguf.GGUFReader(path)
    fields = {
        name: field.contents()
        for name, field in reader.fields.items()
        if not name.startswith("tokenizer.ggml.")
        or name in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.eos_token_id")
    }
    assert fields["general.architecture"] == "llama"
    assert fields["llama.context_length"] == 2048 and fields["llama.block_count"] == 2
    assert fields["llama.attention.head_count"] == 8 and fields["llama.attention.head_count_kv"] == 2
    assert fields["llama.rope.freq_base"] == 500000.0 and fields["llama.rope.dimension_count"] == 8
    assert fields["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "gpt-2"
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == fields["llama.vocab_size"] == 512  # 502 tokens padded to a multiple of 64
    assert tokens[fields["tokenizer.ggml.eos_token_id"]] == "<|endoftext|>"
    names = {t.name for t in reader.tensors}
    assert "output.weight" not in names and "token_embd.weight" in names  # tied: one matrix


def test_a_tokenizer_that_is_not_gpt2s_is_refused_by_name(one_b_shaped_export, tmp_path):
    spec = json.loads((one_b_shaped_export / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    with pytest.raises(GGUFError, match="pre-tokenizer is .*Metaspace.*gpt-2"):
        check_gpt2_pre_tokenizer(spec)


def test_the_gguf_command_writes_beside_the_folder(one_b_shaped_export):
    from hf_pretrain.cli import main as cli

    assert cli(["gguf", str(one_b_shaped_export), "--gguf_type", "q8_0"]) == 0
    written = one_b_shaped_export / "export-q8_0.gguf"
    assert written.is_file() and not list(one_b_shaped_export.glob("*.tmp"))
    written.unlink()


def test_llama_cpp_greedy_tokens_equal_transformers(one_b_shaped_export, tmp_path):
    llama_cpp = pytest.importorskip(
        "llama_cpp",
        reason="llama-cpp-python is not installed (it builds llama.cpp "
        "from source); `pip install llama-cpp-python` to run this",
    )
    path = write_gguf(one_b_shaped_export, tmp_path / "model.gguf", "f32")
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, verbose=False, logits_all=False)
    tokenizer = AutoTokenizer.from_pretrained(one_b_shaped_export)
    prompt_ids = tokenizer(PROMPT).input_ids
    assert llm.tokenize(PROMPT.encode(), add_bos=False, special=True) == prompt_ids
    out = llm.create_completion(PROMPT, max_tokens=12, temperature=0.0, top_k=1)
    _, greedy = hf_logits_and_greedy(one_b_shaped_export)
    assert tokenizer(PROMPT + out["choices"][0]["text"]).input_ids[: len(greedy)] == greedy[: len(prompt_ids) + 12]


# ------------------------------------------------------------------------------ transformers 4.x
TRANSFORMERS_4 = ["transformers==4.57.6", "huggingface-hub>=0.34,<1.0", "tokenizers>=0.22,<=0.23.0"]


def transformers4_python() -> Path:
    """A venv with transformers 4.57 that borrows torch and the rest from this one (cached)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hf-pretrain-tests" / "transformers-4.57.6"
    python = cache / "bin" / "python"
    if not (cache / ".ready").is_file():
        subprocess.run([sys.executable, "-m", "venv", str(cache)], check=True)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # this venv's own packages come first; what it lacks (torch, numpy, safetensors...) comes from ours: written
    # each time, as the cache outlives the checkout (and the venv) that made it
    Path(site, "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    if not (cache / ".ready").is_file():
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                *TRANSFORMERS_4,
            ],
            check=True,
        )
        (cache / ".ready").write_text("ok\n")
    return python


LOAD_WITH_4X = """
import json, sys, torch, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, prompt = sys.argv[1], sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
inputs = tokenizer(prompt, return_tensors="pt")
with torch.no_grad():
    logits = model(**inputs).logits
    greedy = model.generate(**inputs, max_new_tokens=12, do_sample=False)
print(json.dumps({"version": transformers.__version__, "rope_theta": model.config.rope_theta,
                  "inputs": sorted(inputs), "logits": logits[0].tolist(), "greedy": greedy[0].tolist()}))
"""


@pytest.mark.slow
def test_transformers_4_gives_the_same_logits_and_greedy_tokens(one_b_shaped_export):
    python = transformers4_python()
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH="")
    result = subprocess.run(
        [str(python), "-c", LOAD_WITH_4X, str(one_b_shaped_export), PROMPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    old = json.loads(result.stdout.strip().splitlines()[-1])
    assert old["version"].startswith("4.57")
    assert old["rope_theta"] == 500000.0
    assert old["inputs"] == ["attention_mask", "input_ids"]
    logits, greedy = hf_logits_and_greedy(one_b_shaped_export)
    assert torch.allclose(torch.tensor(old["logits"]), logits[0], atol=1e-4)
    assert old["greedy"] == greedy


# ------------------------------------------------------------------------------ the Hub page
@pytest.mark.slow
def test_the_card_says_language_base_model_and_where_to_load_from(reference_run, tmp_path):
    from huggingface_hub import ModelCard

    run_dir, _ = reference_run
    local = tmp_path / "exports" / "tiny"
    assert (
        export_command.main(["--checkpoint", str(run_dir), "--out", str(local), "--gguf", "--gguf_type", "q8_0"]) == 0
    )
    card = ModelCard.load(local / "README.md")
    assert card.data.language == ["en"]
    # a local export loads by its folder's name, never this machine's path (issue 45), and not as `tiny` the repo
    assert 'model="./tiny"' in card.text and str(local.parent) not in card.text
    assert "This is a base model" in card.text and "no chat template" in card.text
    assert (local / "tiny-q8_0.gguf").is_file()
    assert "chat_template" not in json.loads((local / "tokenizer_config.json").read_text())
    for checkpoint in (run_dir / "checkpoints").glob("step_*"):  # their tokenizers too, for 4.x readers
        names = json.loads((checkpoint / "tokenizer_config.json").read_text())["model_input_names"]
        assert names == ["input_ids", "attention_mask"]

    checkpoint = resolve_checkpoint(run_dir)
    hub_bound = export.export_checkpoint(
        checkpoint, tmp_path / "hub", card=export.CardOptions("me/tiny", repo_id="me/tiny")
    )
    assert 'model="me/tiny"' in ModelCard.load(hub_bound / "README.md").text
