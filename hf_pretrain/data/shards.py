"""`prepare`: tokenize the mixture into flat token shards plus meta.json, resumably; and the
checks that tie prepared data to a recipe.

Layout of data_dir:
    tokenizer/              save_pretrained of the tokenizer
    train_00000.bin ...     raw token ids (uint16 or uint32, no header), EOS after every document
    val_00000.bin ...
    prepare_progress.json   only while preparing: the finished shards, so a rerun continues
    meta.json               written last; its presence means "complete"

A shard closes at the first document boundary at or after `shard_tokens` tokens, so the state
between shards is just "the first document not yet written" per split, and resuming is exact.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from hf_pretrain.config import Recipe
from hf_pretrain.data.sources import is_validation, mixture, normalised_weights
from hf_pretrain.data.tokenizer import (
    TOKENIZER_DIR,
    load_pretrained_tokenizer,
    load_tokenizer,
    save_tokenizer,
    tokenizer_hash,
    train_tokenizer,
)

FORMAT_VERSION = 1
META_FILE = "meta.json"
PROGRESS_FILE = "prepare_progress.json"
EOS_POLICY = "appended after every document"
# Split name in meta.json -> shard file prefix.
SPLIT_PREFIX = {"train": "train", "validation": "val"}
# Documents are tokenized in batches this big: large enough for the Rust side to use every
# core, small enough that the text of one batch stays a few MB.
BATCH_DOCUMENTS = 1024
BATCH_CHARS = 8_000_000


class DataMismatchError(RuntimeError):
    """Prepared data that is missing, incomplete, or does not belong to the recipe at hand."""


# ---------------------------------------------------------------------- small helpers
def token_dtype(vocab_len: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_len <= np.iinfo(np.uint16).max else np.uint32)


def _package_version() -> str:
    try:
        return metadata.version("hf-pretrain")
    except metadata.PackageNotFoundError:
        return "0.1.0"


def _write_json_atomically(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


def data_fingerprint(recipe: Recipe) -> str:
    """Hash of every setting that changes the bytes `prepare` writes (not where they go)."""
    d = recipe.data
    shaping = {
        "sources": [dataclasses.asdict(s) for s in d.sources],
        "tokenizer": d.tokenizer, "vocab_size": d.vocab_size, "special_tokens": d.special_tokens,
        "tokenizer_train_documents": d.tokenizer_train_documents, "max_tokens": d.max_tokens,
        "val_every": d.val_every, "shard_tokens": d.shard_tokens, "seed": recipe.train.seed,
    }
    return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]


def _prepare_hint(recipe_name: str | None) -> str:
    return f"run `hf-pretrain prepare --recipe {recipe_name or 'NAME'}`"


# ---------------------------------------------------------------------- one split's shards
class SplitWriter:
    """Collects one split's documents and writes them as shards ending on document boundaries."""

    def __init__(self, data_dir: Path, prefix: str, dtype: np.dtype, shard_tokens: int,
                 num_sources: int, saved: dict[str, Any] | None) -> None:
        self.data_dir, self.prefix, self.dtype, self.shard_tokens = data_dir, prefix, dtype, shard_tokens
        saved = saved or {"shards": [], "next_document": 0,
                          "source_documents": [0] * num_sources, "source_tokens": [0] * num_sources}
        # Everything below is persisted: it describes finished shards only.
        self.shards: list[dict[str, Any]] = saved["shards"]
        self.next_document: int = saved["next_document"]
        self.source_documents: list[int] = saved["source_documents"]
        self.source_tokens: list[int] = saved["source_tokens"]
        self._pending: list[np.ndarray] = []
        self._pending_sources: list[int] = []
        self._pending_tokens = 0
        self._last_document = -1

    @property
    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards) + self._pending_tokens

    @property
    def documents(self) -> int:
        return sum(self.source_documents) + len(self._pending)

    def add(self, document_index: int, source: int, ids: np.ndarray) -> bool:
        """Queue one document (EOS included); True when this closed and wrote a shard."""
        self._pending.append(ids)
        self._pending_sources.append(source)
        self._pending_tokens += len(ids)
        self._last_document = document_index
        return self._pending_tokens >= self.shard_tokens and self.flush()

    def flush(self) -> bool:
        """Write the queued documents as the next shard; False when there was nothing to write."""
        if not self._pending:
            return False
        tokens = np.concatenate(self._pending)
        name = f"{self.prefix}_{len(self.shards):05d}.bin"
        # Written under a temporary name and renamed, so a shard file that exists is complete.
        tmp = self.data_dir / (name + ".tmp")
        with tmp.open("wb") as f:
            tokens.tofile(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.data_dir / name)
        for source, ids in zip(self._pending_sources, self._pending):
            self.source_documents[source] += 1
            self.source_tokens[source] += len(ids)
        self.shards.append({"file": name, "tokens": int(tokens.size), "documents": len(self._pending),
                            "sha256": hashlib.sha256(tokens.data).hexdigest()})
        self.next_document = self._last_document + 1
        self._pending, self._pending_sources, self._pending_tokens = [], [], 0
        return True

    def state(self) -> dict[str, Any]:
        return {"shards": self.shards, "next_document": self.next_document,
                "source_documents": self.source_documents, "source_tokens": self.source_tokens}

    def summary(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "documents": self.documents, "shards": self.shards}


# ---------------------------------------------------------------------- the tokenizing pass
def _document_encoder(tokenizer: PreTrainedTokenizerFast) -> Tokenizer:
    """A copy of the backend that reads special-token strings inside documents as plain text,
    so a document quoting `<|endoftext|>` cannot forge a document boundary."""
    encoder = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    encoder.encode_special_tokens = True
    return encoder


class ShardPass:
    """One pass over the mixture: tokenize in batches, route documents to their split, stop at
    the token budget, and record progress after every shard."""

    def __init__(self, recipe: Recipe, tokenizer: PreTrainedTokenizerFast, data_dir: Path,
                 progress: dict[str, Any], log: Callable[[str], None]) -> None:
        self.recipe, self.data_dir, self.progress, self.log = recipe, data_dir, progress, log
        self.encoder = _document_encoder(tokenizer)
        self.encode = getattr(self.encoder, "encode_batch_fast", self.encoder.encode_batch)
        self.dtype = token_dtype(len(tokenizer))
        self.eos_id = tokenizer.eos_token_id
        n = len(recipe.data.sources)
        self.writers = {split: SplitWriter(data_dir, prefix, self.dtype, recipe.data.shard_tokens, n, progress[split])
                        for split, prefix in SPLIT_PREFIX.items()}
        self.budget = recipe.data.max_tokens
        train = self.writers["train"]
        # Index of the first document past the budget, once known; a rerun after the budget's last
        # train shard still has to finish the validation documents before it.
        self.stop_at: int | None = train.next_document if self.budget and train.tokens >= self.budget else None
        self.started = time.perf_counter()
        self.new_tokens = 0

    def run(self) -> dict[str, SplitWriter]:
        batch: list[tuple[int, int, str]] = []
        chars = 0
        val_every = self.recipe.data.val_every
        for index, (source, text) in enumerate(mixture(self.recipe)):
            if self.stop_at is not None and index >= self.stop_at:
                break
            split = "validation" if is_validation(index, val_every) else "train"
            if index < self.writers[split].next_document:
                continue  # already in a finished shard of an earlier, interrupted run
            batch.append((index, source, text))
            chars += len(text)
            if len(batch) >= BATCH_DOCUMENTS or chars >= BATCH_CHARS:
                self._write_batch(batch)
                batch, chars = [], 0
        self._write_batch(batch)
        for split, writer in self.writers.items():
            if writer.flush():
                self._shard_written(split)
        return self.writers

    def _write_batch(self, batch: list[tuple[int, int, str]]) -> None:
        if not batch:
            return
        encodings = self.encode([text for _, _, text in batch], add_special_tokens=False)
        val_every = self.recipe.data.val_every
        for (index, source, _), encoding in zip(batch, encodings):
            if self.stop_at is not None and index >= self.stop_at:
                return
            token_ids = encoding.ids
            ids = np.empty(len(token_ids) + 1, dtype=self.dtype)
            ids[:-1] = token_ids
            ids[-1] = self.eos_id
            self.new_tokens += ids.size
            split = "validation" if is_validation(index, val_every) else "train"
            writer = self.writers[split]
            if writer.add(index, source, ids):
                self._shard_written(split)
            if split == "train" and self.budget and writer.tokens >= self.budget:
                self.stop_at = index + 1

    def _shard_written(self, split: str) -> None:
        self.progress[split] = self.writers[split].state()
        _write_json_atomically(self.data_dir / PROGRESS_FILE, self.progress)
        self.log(f"{split} shard {len(self.writers[split].shards) - 1} written; {self.status()}")

    def status(self) -> str:
        docs = sum(w.documents for w in self.writers.values())
        tokens = sum(w.tokens for w in self.writers.values())
        rate = self.new_tokens / max(time.perf_counter() - self.started, 1e-9)
        return f"{docs:,} docs, {tokens:,} tokens, {rate:,.0f} tokens/s"
