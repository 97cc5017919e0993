"""The tokenizer: fit a byte-level BPE on the corpus or load a saved one (a folder, a tokenizer.json or a
Hub id), store it, identify it by hash."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from hf_pretrain.hub_cache import TOKENIZER_FILES, HubFilesError, hub_snapshot, is_hub_id

if TYPE_CHECKING:  # transformers' tokenizers import torch: seconds that `prepare --help` must not wait
    from transformers import PreTrainedTokenizerFast

    from hf_pretrain.store.location import Location

# GPT-2's document separator; it doubles as bos/unk/pad so the model needs no other special ids.
EOS_TOKEN = "<|endoftext|>"
# Folder inside data_dir; `AutoTokenizer.from_pretrained(data_dir / TOKENIZER_DIR)` loads it.
TOKENIZER_DIR = "tokenizer"
# What the model's forward takes. Saved in tokenizer_config.json: without it transformers 4.x also
# returns `token_type_ids`, and `model.generate(**tokenizer(prompt, return_tensors="pt"))` fails.
MODEL_INPUT_NAMES = ["input_ids", "attention_mask"]
# Documents handed to the BPE trainer per call into Rust (one call per document is much slower).
_TRAIN_BATCH = 1000
# The Rust pre-tokenizer holds about 110 bytes per character of the text it encodes at once, so a
# 50 MB one-line document would need gigabytes; longer documents are fitted and encoded in pieces.
PIECE_CHARS = 100_000


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded, said in a line that names it and the fix."""


def _batches(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(texts)
    while batch := list(islice(it, size)):
        yield batch


def _wrap(backend: Tokenizer) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        model_input_names=MODEL_INPUT_NAMES,
    )


def train_tokenizer(texts: Iterable[str], vocab_size: int, special_tokens: list[str]) -> PreTrainedTokenizerFast:
    """Byte-level BPE with `vocab_size` entries (256 bytes, merges, EOS) plus `special_tokens` on top.

    Byte level means every string encodes without an unknown token and decodes back exactly.
    """
    backend = Tokenizer(models.BPE())
    # No prefix space: code and text are encoded as written, so decode(encode(x)) == x.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_batches(texts, _TRAIN_BATCH), trainer=trainer)
    # Added after training so they never take part in merges and land at ids >= vocab_size.
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens])
    return _wrap(backend)


def load_pretrained_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """A saved tokenizer: a folder written by `save_pretrained` (a model folder too), a bare
    tokenizer.json, or a Hub id (its tokenizer files through huggingface_hub's cache, hub_cache.py)."""
    name, path = str(path), Path(path)
    if not path.exists() and is_hub_id(name):
        try:
            path = hub_snapshot(name, TOKENIZER_FILES, what="tokenizer")
        except HubFilesError as exc:
            raise TokenizerError(f"no local folder `{name}`, so it was read as a Hub id: {exc}") from None
    if path.is_file() and path.suffix == ".json":
        backend = Tokenizer.from_file(str(path))
        if backend.token_to_id(EOS_TOKEN) is None:
            raise TokenizerError(
                f"{path} has no `{EOS_TOKEN}` token to separate documents; pass the folder saved with "
                f"save_pretrained, whose tokenizer_config.json names the eos_token"
            )
        return _wrap(backend)
    if not path.is_dir():
        raise TokenizerError(
            f"tokenizer `{path}` does not exist; data.tokenizer must be `train`, a Hub id or a local "
            f"tokenizer folder or tokenizer.json"
        )
    # local_files_only: a local folder must never turn into a Hub download.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if not getattr(tokenizer, "is_fast", False):
        raise TokenizerError(
            f"tokenizer in {path} is not a fast (Rust `tokenizers`) tokenizer; save it with a tokenizer.json"
        )
    if tokenizer.eos_token_id is None:
        raise TokenizerError(f"tokenizer in {path} has no eos_token; documents need one to be separated")
    tokenizer.model_input_names = MODEL_INPUT_NAMES
    tokenizer.init_kwargs["model_input_names"] = MODEL_INPUT_NAMES  # what save_pretrained writes: checkpoints too
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, data_dir: Path) -> Path:
    target = Path(data_dir) / TOKENIZER_DIR
    tokenizer.save_pretrained(str(target))
    return target


class TokenizerUnreadable(ValueError):
    """A data folder's saved tokenizer file that is not whole (truncated, damaged): the message names it."""


def local_data_folder(data: Location) -> Path:
    """The data folder `data` (the door's) on this machine: the folder itself, or for a URL its local copy,
    synced from the store once per process (store/data/data_cache.py)."""
    if not data.in_store:
        return data.folder
    from hf_pretrain.store.data.data_cache import synced_copy

    return synced_copy(data.given)


def load_data_tokenizer(data: Location) -> PreTrainedTokenizerFast:
    """The tokenizer that `prepare` saved with the data at `data` (a URL: in its synced local copy)."""
    return load_tokenizer(local_data_folder(data))


def load_tokenizer(data_dir: str | Path) -> PreTrainedTokenizerFast:
    """The tokenizer that `prepare` saved in the local folder `data_dir`; `TokenizerUnreadable` names a file
    cut short."""
    folder = Path(data_dir) / TOKENIZER_DIR
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer in {folder}; run `hf-pretrain prepare` for this recipe first")
    for name in ("tokenizer.json", "tokenizer_config.json"):  # read whole first: a parser's error names no file
        path = folder / name
        try:
            json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, ValueError) as exc:
            raise TokenizerUnreadable(
                f"{path} cannot be read ({exc}): the file is truncated or damaged; restore it from a copy, "
                f"or delete {data_dir} and prepare it again"
            ) from None
    return load_pretrained_tokenizer(folder)


def tokenizer_hash(tokenizer: PreTrainedTokenizerFast) -> str:
    """sha256 of the backend tokenizer's JSON with sorted keys: equal for equal tokenizers,
    whatever the key order of the file they were loaded from."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    canonical = json.dumps(spec, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def split_long_text(text: str, piece_chars: int = PIECE_CHARS) -> list[str]:
    """`text` in pieces of at most about `piece_chars`, cut before a single space between two
    non-space characters where there is one: GPT-2's pre-tokenizer starts a new word there, so the
    pieces encode to exactly the tokens of the whole (merges never cross a word)."""
    pieces, start = [], 0
    while len(text) - start > piece_chars:
        end = start + piece_chars
        cut = text.rfind(" ", start + piece_chars // 2, end)
        while cut > start and (text[cut - 1].isspace() or cut + 1 >= len(text) or text[cut + 1].isspace()):
            cut = text.rfind(" ", start + piece_chars // 2, cut)
        cut = cut if cut > start else end  # no word boundary at all: cut anywhere (tokens may differ there)
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces
