"""Starting from a published model (`init_from`): where its files are, its config.json held to the
recipe's model keys, its tokenizer held to the prepared data, and its weights copied into the model.

A local folder is read where it is and never reaches the network; a Hub id goes through
huggingface_hub and its cache (hub_cache.py): the doctor's check fetches config.json and the
tokenizer, the run the weights.

Who loads what when there are several processes: each one builds the whole model on the CPU before
`accelerator.prepare`, as a run from scratch does, and copies the weights into it tensor by tensor
from the memory-mapped files (`load_base_weights`): no second copy of the model is ever made, and the
page cache holds one copy of the files for all the processes of a machine. `prepare` then shards the
model (FSDP: each GPU receives only its shard) or keeps it whole (DDP). A 1.1B base costs each
process its fp32 model in host memory (4.4 GB), exactly what a run from scratch costs.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import LlamaConfig, PreTrainedTokenizerFast

from hf_pretrain.config import DataConfig, ModelConfig
from hf_pretrain.config.model_section import padded_vocab_size
from hf_pretrain.data.tokenizer import (
    TokenizerError,
    load_pretrained_tokenizer,
    load_tokenizer,
    save_tokenizer,
    tokenizer_hash,
)
from hf_pretrain.hub_cache import TOKENIZER_FILES, HubFilesError, hub_id_of_folder, hub_snapshot, is_hub_id
from hf_pretrain.model.llama import llama_config

CONFIG_FILE = "config.json"
# The weights, in the order they are looked for: safetensors (whole or sharded), then PyTorch pickles.
WEIGHT_FILES = [
    ("model.safetensors.index.json", "model.safetensors"),
    ("pytorch_model.bin.index.json", "pytorch_model.bin"),
]
SAFETENSORS_PATTERNS = ["*.safetensors", "model.safetensors.index.json", "generation_config.json"]
BIN_PATTERNS = ["pytorch_model*.bin", "pytorch_model.bin.index.json", "generation_config.json"]
# The recipe's model keys that config.json also holds, checked one against the other.
CHECKED_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "rope_theta",
    "rms_norm_eps",
    "tie_word_embeddings",
)
VOCAB_MULTIPLES = (1, 8, 16, 32, 64, 128, 256)


class InitFromError(ValueError):
    """A base model that cannot be started from: `reason` says what was found, `fix` what to do."""

    def __init__(self, reason: str, fix: str):
        super().__init__(f"{reason}; {fix}")
        self.reason, self.fix = reason, fix


@dataclass(frozen=True)
class BaseModel:
    """The model `init_from` names: as given, the local folder its files are in, and its config."""

    name: str
    folder: Path
    config: LlamaConfig


def base_model_id(init_from: str) -> str | None:
    """The Hub id of the model `init_from` names, for the card's `base_model`: itself when it is a Hub id,
    the cached repository of a huggingface_hub snapshot folder, None for another local folder."""
    if not init_from:
        return None
    local = Path(init_from).expanduser()
    if local.is_dir():
        return hub_id_of_folder(local.resolve())
    return init_from if is_hub_id(init_from) else None


def open_base(init_from: str, weights: bool = False) -> BaseModel:
    """The base model's folder (with its weights too when `weights`, downloaded for a Hub id) and its
    config, which must be a LlamaForCausalLM's. Raises `InitFromError`."""
    local = Path(init_from).expanduser()
    if local.is_dir():
        folder = local
    elif is_hub_id(init_from):
        folder = _hub_folder(init_from, weights)
    else:
        raise InitFromError(
            f"init_from={init_from}: no such folder, and not a Hub id (`org/name`)",
            "name a local model folder or a Hub model id",
        )
    config_file = folder / CONFIG_FILE
    if not config_file.is_file():
        raise InitFromError(
            f"init_from={init_from}: {folder} has no {CONFIG_FILE}, so it is not a Hugging Face model folder",
            "name an `hf-pretrain export` or another LlamaForCausalLM folder",
        )
    try:
        raw = json.loads(config_file.read_text())
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
    except (ValueError, OSError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InitFromError(
            f"init_from={init_from}: {config_file} cannot be read as JSON ({exc}): the file is cut short or damaged",
            "download or export the model again",
        ) from None
    kind, architectures = raw.get("model_type"), raw.get("architectures") or []
    if kind != "llama" or (architectures and "LlamaForCausalLM" not in architectures):
        raise InitFromError(
            f"init_from={init_from} is a `{kind}` model ({', '.join(architectures) or 'no architectures listed'}), "
            f"not a LlamaForCausalLM",
            "hf-pretrain builds and trains Llama models only: name a Llama-family base model",
        )
    return BaseModel(init_from, folder, LlamaConfig.from_pretrained(folder))


def _hub_folder(repo_id: str, weights: bool) -> Path:
    try:
        folder = hub_snapshot(repo_id, TOKENIZER_FILES + (SAFETENSORS_PATTERNS if weights else []), "init_from model")
        if weights and not any(folder.glob("*.safetensors")):  # an older repository: PyTorch pickles only
            folder = hub_snapshot(repo_id, BIN_PATTERNS, "init_from model")
    except HubFilesError as exc:
        raise InitFromError(exc.reason, exc.fix) from None
    return folder


def model_config(m: ModelConfig, tokenizer: PreTrainedTokenizerFast, checkpoint: Path | None = None) -> LlamaConfig:
    """The config of the model to train: the model section's Llama; with init_from, the base model's own
    config.json (the preflight check has held it to the recipe's model keys; what the recipe cannot say,
    such as a RoPE scaling, comes from it too), or, for a run that goes on from `checkpoint`, the copy
    of it the checkpoint holds: a resumed run never reads the base model again."""
    if not m.init_from:
        return llama_config(m, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    if checkpoint is not None:
        return LlamaConfig.from_pretrained(checkpoint)
    config = open_base(m.init_from).config
    config.use_cache = False  # as llama_config: training never reads the KV cache
    config.dtype = None  # as llama_config: fp32 master weights whatever the base was saved in; export picks
    return config


def init_weights(model: torch.nn.Module, init_from: str, log: Callable[[str], None] = print) -> None:
    """With `init_from` (the model section's), the base model's weights into the freshly built `model`;
    nothing without it. Only for a run that starts: a resumed one loads its checkpoint instead."""
    if not init_from:
        return
    # every process fetches and reads: huggingface_hub's file locks let one download, the others wait
    base = open_base(init_from, weights=True)
    copied = load_base_weights(model, base)
    log(f"init_from: {copied} tensors of {base.name} loaded from {base.folder}")


def weight_files(base: BaseModel) -> list[Path]:
    """The base's weight files: one, or the shards its index names."""
    for index_name, single in WEIGHT_FILES:
        index = base.folder / index_name
        if index.is_file():
            files = [base.folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
            missing = [f.name for f in files if not f.is_file()]
            if missing:
                raise InitFromError(
                    f"init_from={base.name}: {index_name} names {', '.join(missing[:3])}, missing from {base.folder}",
                    "download the model again",
                )
            for file in files:
                check_weight_file(base.name, file)
            return files
        if (base.folder / single).is_file():
            check_weight_file(base.name, base.folder / single)
            return [base.folder / single]
    raise InitFromError(
        f"init_from={base.name}: no weights in {base.folder} (model.safetensors, safetensors shards with their "
        f"index, or pytorch_model.bin)",
        "name a folder that holds the model's weights",
    )


def check_weight_file(name: str, file: Path) -> None:
    """Raise `InitFromError` naming `file` when a safetensors file is cut short or damaged: its header
    (8 bytes of length, then JSON) must read, and the file must hold every byte its tensors' data
    offsets reach. Reads the header only: cheap for any size. PyTorch pickles are read as they load."""
    if file.suffix != ".safetensors":
        return
    fix = "download or export the model again (the file is cut short or damaged)"
    size = file.stat().st_size
    try:
        with file.open("rb") as f:
            length = int.from_bytes(f.read(8), "little") if size >= 8 else -1
            if not 0 < length <= size - 8:
                raise ValueError(f"its header claims {length:,} bytes, the file has {size:,}")
            header = json.loads(f.read(length))
        ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise InitFromError(f"init_from={name}: {file} is not a readable safetensors file ({exc})", fix) from None
    needed = 8 + length + max(ends, default=0)
    if size < needed:
        raise InitFromError(
            f"init_from={name}: {file} is cut short: {size:,} bytes, its tensors reach byte {needed:,}", fix
        )


def _tensors(file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """A weight file's tensors one at a time, read from the memory-mapped file as they are asked for."""
    if file.suffix == ".safetensors":
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
    else:
        yield from torch.load(file, map_location="cpu", weights_only=True, mmap=True).items()


def load_base_weights(model: torch.nn.Module, base: BaseModel) -> int:
    """Copy the base's weights into `model` (whole, before `prepare`), each checked by name and shape,
    cast to the model's dtype; every weight of the model must be found. Returns the tensors copied."""
    own = model.state_dict()
    copied: set[str] = set()
    unexpected: list[str] = []
    for file in weight_files(base):
        for name, tensor in _tensors(file):
            target = own.get(name)
            if target is None:
                if not name.endswith("rotary_emb.inv_freq"):  # older saves kept RoPE's buffer; it is recomputed
                    unexpected.append(name)
                continue
            if tensor.shape != target.shape:
                raise InitFromError(
                    f"init_from={base.name}: {name} is {tuple(tensor.shape)} in {file.name}, the model built from "
                    f"its config.json has {tuple(target.shape)}",
                    "the folder's weights and config.json disagree: download or export it again",
                )
            with torch.no_grad():
                target.copy_(tensor)
            copied.add(name)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()  # the embedding, under another name
    missing = [name for name in own if name not in copied and name not in tied]
    if missing or unexpected:
        raise InitFromError(
            f"init_from={base.name}: the weights in {base.folder} do not match its config.json "
            f"(missing {missing[:5]}, unexpected {unexpected[:5]})",
            "name a LlamaForCausalLM folder whose weights and config.json belong together",
        )
    return len(copied)


# ---------------------------------------------------------------------- held to the recipe and the data
def recipe_differences(config: LlamaConfig, m: ModelConfig, d: DataConfig) -> dict[str, tuple[Any, Any]]:
    """{recipe key: (the recipe's value, the base's value)} for each model key where they differ.

    Embedding rows are the data section's `vocab_size` plus `special_tokens` rounded up to the model
    section's `vocab_multiple`; a difference there is named as `vocab_multiple` when another multiple
    gives the base's rows."""
    base = {key: getattr(config, key, None) for key in CHECKED_KEYS}
    base["rope_theta"] = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", base["rope_theta"])
    out = {key: (getattr(m, key), base[key]) for key in CHECKED_KEYS if getattr(m, key) != base[key]}
    size = d.vocab_size + len(d.special_tokens)
    if padded_vocab_size(size, m.vocab_multiple) != config.vocab_size:
        multiple = next((k for k in VOCAB_MULTIPLES if padded_vocab_size(size, k) == config.vocab_size), None)
        if multiple is not None:
            out["vocab_multiple"] = (m.vocab_multiple, multiple)
        else:
            out["vocab_size"] = (size, config.vocab_size)
    return out


def beyond_the_recipe(config: LlamaConfig) -> list[str]:
    """What the base's config.json sets that the recipe's keys cannot say (and a run from scratch
    never has): it is kept, as the model trains from config.json."""
    notes = []
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        notes.append(f"RoPE scaling {rope['rope_type']}")
    head_dim = getattr(config, "head_dim", None)
    if head_dim and head_dim != config.hidden_size // config.num_attention_heads:
        notes.append(f"head_dim {head_dim}")
    for flag in ("attention_bias", "mlp_bias"):
        if getattr(config, flag, False):
            notes.append(flag)
    if config.hidden_act != "silu":
        notes.append(f"hidden_act {config.hidden_act}")
    return notes


def tokenizer_as_prepared(base: BaseModel) -> PreTrainedTokenizerFast:
    """The base's tokenizer as `prepare` stores it in a data folder (saved, then loaded again), so that
    its hash compares with a data folder's whatever a save and a load change in its files."""
    try:
        tokenizer = load_pretrained_tokenizer(base.folder)
    except (TokenizerError, OSError) as exc:
        raise InitFromError(
            f"init_from={base.name}: no usable tokenizer in {base.folder} ({exc})",
            "name a model folder that holds its tokenizer (tokenizer.json and tokenizer_config.json)",
        ) from None
    with tempfile.TemporaryDirectory() as scratch:
        save_tokenizer(tokenizer, Path(scratch))
        return load_tokenizer(scratch)


def data_tokenizer_differs(base: BaseModel, data_dir: str | Path) -> tuple[str, str] | None:
    """(the data's tokenizer hash, the base's) when `data_dir` was tokenized with another tokenizer than
    the base model's; None when they are the same. The data folder must hold a tokenizer."""
    data_hash = tokenizer_hash(load_tokenizer(data_dir))
    base_hash = tokenizer_hash(tokenizer_as_prepared(base))
    return None if data_hash == base_hash else (data_hash, base_hash)
