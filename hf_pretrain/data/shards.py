"""`prepare`: tokenize the mixture into flat token shards plus meta.json, resumably; and the
checks that tie prepared data to a recipe.

Layout of data_dir:
    tokenizer/              save_pretrained of the tokenizer
    train_00000.bin ...     raw token ids (uint16 or uint32, no header), EOS after every document
    val_00000.bin ...
    prepare_progress.json   only while preparing: the finished shards, so a rerun continues
    train_00004.bin.pending only while preparing: a split's documents queued for its next shard
    meta.json               written last; its presence means "complete"

A shard closes at the first document boundary at or after `shard_tokens` tokens. At each shard
write the progress file records the shards, each split's saved queue, and a position of the mixture
at most one batch before the first document not yet stored (`MixturePosition`: the draws' random
state, each source's count, a streamed Hub source's own `state_dict()`). A rerun reads on from
there, not from the first document, skips what is already written, and resuming is exact.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from importlib import metadata
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from hf_pretrain.config import Recipe
from hf_pretrain.data.sources import MixturePosition, is_validation, mixture, normalised_weights
from hf_pretrain.data.tokenizer import (
    TOKENIZER_DIR,
    TokenizerUnreadable,
    load_pretrained_tokenizer,
    load_tokenizer,
    save_tokenizer,
    tokenizer_hash,
    train_tokenizer,
)
from hf_pretrain.data.verify import ShardCorruptError, verify_shards

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
# The Rust pre-tokenizer holds about 110 bytes per character of the text it encodes at once, so a
# 50 MB one-line document would need gigabytes; longer documents are encoded in pieces this long.
PIECE_CHARS = 100_000


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
        "tokenizer": d.tokenizer,
        "vocab_size": d.vocab_size,
        "special_tokens": d.special_tokens,
        "tokenizer_train_documents": d.tokenizer_train_documents,
        "max_tokens": d.max_tokens,
        "val_every": d.val_every,
        "shard_tokens": d.shard_tokens,
        "seed": recipe.train.seed,
    }
    return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]


def _prepare_hint(recipe_name: str | None) -> str:
    return f"run `hf-pretrain prepare --recipe {recipe_name or 'NAME'}`"


# ---------------------------------------------------------------------- one split's shards
def shard_name(prefix: str, index: int) -> str:
    """`train_00003.bin`; its queue, while it is being filled, is `train_00003.bin.pending`."""
    return f"{prefix}_{index:05d}.bin"


class SplitWriter:
    """Collects one split's documents and writes them as shards ending on document boundaries.

    `checkpoint()` also saves the documents queued for the next shard beside it
    (`val_00003.bin.pending`), so a rerun goes on from the latest shard of either split: validation
    fills a shard far more slowly than train (with val_every 1000, maybe never before the end), and
    its queue would otherwise have to be read again from the start of the mixture.
    """

    def __init__(
        self,
        data_dir: Path,
        prefix: str,
        dtype: np.dtype,
        shard_tokens: int,
        num_sources: int,
        saved: dict[str, Any] | None,
    ) -> None:
        self.data_dir, self.prefix, self.dtype, self.shard_tokens = data_dir, prefix, dtype, shard_tokens
        saved = saved or {
            "shards": [],
            "next_document": 0,
            "source_documents": [0] * num_sources,
            "source_tokens": [0] * num_sources,
        }
        # Finished shards, and the first document of the mixture this split has not yet received.
        self.shards: list[dict[str, Any]] = saved["shards"]
        self.next_document: int = saved["next_document"]
        self.source_documents: list[int] = saved["source_documents"]
        self.source_tokens: list[int] = saved["source_tokens"]
        # The queue for the next shard; the first `_saved_tokens` of it are in its pending file.
        queue = saved.get("pending") or {
            "tokens": 0,
            "documents": 0,
            "source_documents": [0] * num_sources,
            "source_tokens": [0] * num_sources,
        }
        self._pending_tokens, self._pending_documents = queue["tokens"], queue["documents"]
        self._pending_source_documents, self._pending_source_tokens = queue["source_documents"], queue["source_tokens"]
        self._pending: list[np.ndarray] = (
            [np.fromfile(self.pending_path(), dtype=dtype, count=queue["tokens"])] if queue["tokens"] else []
        )
        self._saved_tokens, self._saved_arrays = queue["tokens"], len(self._pending)
        self._written_pending: Path | None = None  # the pending file of the shard just written

    @property
    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards) + self._pending_tokens

    @property
    def documents(self) -> int:
        return sum(self.source_documents) + self._pending_documents

    def pending_path(self) -> Path:
        return self.data_dir / (shard_name(self.prefix, len(self.shards)) + ".pending")

    def add(self, document_index: int, source: int, ids: np.ndarray) -> bool:
        """Queue one document (EOS included); True when this closed and wrote a shard."""
        self._pending.append(ids)
        self._pending_tokens += len(ids)
        self._pending_documents += 1
        self._pending_source_documents[source] += 1
        self._pending_source_tokens[source] += len(ids)
        self.next_document = document_index + 1
        return self._pending_tokens >= self.shard_tokens and self.flush()

    def flush(self) -> bool:
        """Write the queued documents as the next shard; False when there was nothing to write."""
        if not self._pending:
            return False
        tokens = np.concatenate(self._pending)
        name = shard_name(self.prefix, len(self.shards))
        # Written under a temporary name and renamed, so a shard file that exists is complete.
        tmp = self.data_dir / (name + ".tmp")
        with tmp.open("wb") as f:
            tokens.tofile(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.data_dir / name)
        for source, count in enumerate(self._pending_source_documents):
            self.source_documents[source] += count
            self.source_tokens[source] += self._pending_source_tokens[source]
        self.shards.append(
            {
                "file": name,
                "tokens": int(tokens.size),
                "documents": self._pending_documents,
                "sha256": hashlib.sha256(tokens.data).hexdigest(),
            }
        )
        # Kept until the progress file records this shard: until then, a rerun still reads it.
        self._written_pending = self.data_dir / (name + ".pending") if self._saved_tokens else None
        n = len(self.source_documents)
        self._pending, self._pending_tokens, self._pending_documents = [], 0, 0
        self._pending_source_documents, self._pending_source_tokens = [0] * n, [0] * n
        self._saved_tokens, self._saved_arrays = 0, 0
        return True

    def checkpoint(self) -> dict[str, Any]:
        """Save the queued tokens not yet in the pending file (appended, then synced to disk) and
        return this split's state for the progress file."""
        if self._saved_arrays < len(self._pending):
            path = self.pending_path()
            with path.open("r+b" if path.exists() else "wb") as f:
                f.truncate(self._saved_tokens * self.dtype.itemsize)  # past it: a run that died before recording
                f.seek(0, os.SEEK_END)
                np.concatenate(self._pending[self._saved_arrays :]).tofile(f)
                f.flush()
                os.fsync(f.fileno())
            self._saved_tokens, self._saved_arrays = self._pending_tokens, len(self._pending)
        return {
            "shards": self.shards,
            "next_document": self.next_document,
            "source_documents": self.source_documents,
            "source_tokens": self.source_tokens,
            "pending": {
                "tokens": self._pending_tokens,
                "documents": self._pending_documents,
                "source_documents": self._pending_source_documents,
                "source_tokens": self._pending_source_tokens,
            },
        }

    def drop_written_pending(self) -> None:
        """Delete the pending file of a shard the progress file now records."""
        if self._written_pending is not None:
            self._written_pending.unlink(missing_ok=True)
            self._written_pending = None

    def summary(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "documents": self.documents, "shards": self.shards}


# ---------------------------------------------------------------------- the tokenizing pass
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


def _document_encoder(tokenizer: PreTrainedTokenizerFast) -> Tokenizer:
    """A copy of the backend that reads special-token strings inside documents as plain text,
    so a document quoting `<|endoftext|>` cannot forge a document boundary."""
    encoder = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    encoder.encode_special_tokens = True
    return encoder


class _Document(NamedTuple):
    index: int  # position in the mixed stream
    source: int
    split: str
    text: str


class ShardPass:
    """One pass over the mixture: tokenize in batches, route documents to their split, stop at
    the token budget, and record progress after every shard."""

    def __init__(
        self,
        recipe: Recipe,
        tokenizer: PreTrainedTokenizerFast,
        data_dir: Path,
        progress: dict[str, Any],
        log: Callable[[str], None],
    ) -> None:
        self.recipe, self.data_dir, self.progress, self.log = recipe, data_dir, progress, log
        self.encoder = _document_encoder(tokenizer)
        self.encode = getattr(self.encoder, "encode_batch_fast", self.encoder.encode_batch)
        self.dtype = token_dtype(len(tokenizer))
        self.eos_id = tokenizer.eos_token_id
        n = len(recipe.data.sources)
        self.writers = {
            split: SplitWriter(data_dir, prefix, self.dtype, recipe.data.shard_tokens, n, progress[split])
            for split, prefix in SPLIT_PREFIX.items()
        }
        self.budget = recipe.data.max_tokens
        train = self.writers["train"]
        # Index of the first document past the budget, once known; a rerun after the budget's last
        # train shard still has to finish the validation documents before it.
        self.stop_at: int | None = train.next_document if self.budget and train.tokens >= self.budget else None
        saved_position = progress.get("mixture")
        self.start = MixturePosition.from_json(saved_position) if saved_position else None
        # Where the mixture was at the start of each batch still being read, encoded or stored (the
        # pass reads ahead of what it writes). A shard write records the last one at or before the
        # first document not yet stored; a rerun from there skips the few documents already written.
        # (Once per batch, not per document: a position costs ~20 us, as much as reading a document.)
        self.positions: deque[MixturePosition] = deque()
        self.next_to_store = self.start.next_document if self.start else 0  # first document not yet stored
        self.started = time.perf_counter()
        self.new_tokens = 0
        if progress["train"] is not None or progress["validation"] is not None:
            self._say_where_it_resumes()

    def _say_where_it_resumes(self) -> None:
        if self.start is None:
            self.log(
                "no saved position in the mixture (progress written by an older hf-pretrain): reading the "
                "mixture again from its first document"
            )
            return
        self.log(f"the mixture goes on from document {self.start.next_document:,}")
        for i, (source, position) in enumerate(zip(self.recipe.data.sources, self.start.sources, strict=True)):
            if source.kind == "hub" and position["stream"] is None and position["documents"] and i in self.start.live:
                self.log(
                    f"hub dataset `{source.name}` has no saved stream position: its first "
                    f"{position['documents']:,} documents are read again"
                )

    def run(self) -> dict[str, SplitWriter]:
        # The Rust tokenizer encodes one batch (without the GIL) while this thread reads the next
        # documents and stores the previous batch's tokens, so the Python side hides behind it.
        with ThreadPoolExecutor(max_workers=1) as encoder_thread:
            previous: tuple[list[_Document], Future[list[list[int]]]] | None = None
            for batch in self._batches():
                encodings = encoder_thread.submit(self._encode_documents, [d.text for d in batch])
                if previous is not None:
                    self._store(*previous)
                previous = batch, encodings
            if previous is not None:
                self._store(*previous)
        for split, writer in self.writers.items():
            if writer.flush():
                self._shard_written(split)
        return self.writers

    def _batches(self) -> Iterator[list[_Document]]:
        """The mixture's documents still to write, in batches of about BATCH_DOCUMENTS or BATCH_CHARS."""
        batch: list[_Document] = []
        chars = 0
        val_every = self.recipe.data.val_every
        stream = mixture(self.recipe, self.start)
        self.positions.append(stream.position())
        for index, (source, text) in enumerate(stream, start=stream.next_document):
            if self.stop_at is not None and index >= self.stop_at:
                break
            split = "validation" if is_validation(index, val_every) else "train"
            if index < self.writers[split].next_document:
                continue  # already written (or queued and saved) by an earlier, interrupted run
            batch.append(_Document(index, source, split, text))
            chars += len(text)
            if len(batch) >= BATCH_DOCUMENTS or chars >= BATCH_CHARS:
                yield batch
                batch, chars = [], 0
                self.positions.append(stream.position())
        if batch:
            yield batch

    def _encode_documents(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, long ones encoded piece by piece so memory stays bounded."""
        pieces, owners = [], []
        for owner, text in enumerate(texts):
            for piece in split_long_text(text) if len(text) > PIECE_CHARS else [text]:
                pieces.append(piece)
                owners.append(owner)
        ids: list[list[int]] = [[] for _ in texts]
        start = 0
        while start < len(pieces):  # at most BATCH_CHARS per call into Rust, however the text was cut
            end, chars = start + 1, len(pieces[start])
            while end < len(pieces) and chars + len(pieces[end]) <= BATCH_CHARS:
                chars += len(pieces[end])
                end += 1
            for owner, encoding in zip(
                owners[start:end], self.encode(pieces[start:end], add_special_tokens=False), strict=True
            ):
                ids[owner].extend(encoding.ids)
            start = end
        return ids

    def _store(self, batch: list[_Document], encodings: Future[list[list[int]]]) -> None:
        """Queue each document's tokens plus EOS in its split, up to the token budget."""
        for document, token_ids in zip(batch, encodings.result(), strict=True):
            if self.stop_at is not None and document.index >= self.stop_at:
                return
            ids = np.empty(len(token_ids) + 1, dtype=self.dtype)
            ids[:-1] = token_ids
            ids[-1] = self.eos_id
            self.new_tokens += ids.size
            self.next_to_store = document.index + 1
            while len(self.positions) > 1 and self.positions[1].next_document <= self.next_to_store:
                self.positions.popleft()
            writer = self.writers[document.split]
            if writer.add(document.index, document.source, ids):
                self._shard_written(document.split)
            if document.split == "train" and self.budget and writer.tokens >= self.budget:
                self.stop_at = document.index + 1

    def _shard_written(self, split: str) -> None:
        """Record the shard, the other split's queue and a position of the mixture at or before the
        first document not yet stored: every document before that one is in a shard or a saved queue."""
        for name, writer in self.writers.items():
            self.progress[name] = writer.checkpoint()
        self.progress["mixture"] = self.positions[0].to_json() if self.positions else None
        _write_json_atomically(self.data_dir / PROGRESS_FILE, self.progress)
        for writer in self.writers.values():
            writer.drop_written_pending()
        shard = self.writers[split].shards[-1]  # its own figures; the totals, of both splits, come after
        self.log(
            f"{split} shard {len(self.writers[split].shards) - 1} written ({shard['documents']:,} docs, "
            f"{shard['tokens']:,} tokens); corpus so far: {self.status()}"
        )

    def status(self) -> str:
        docs = sum(w.documents for w in self.writers.values())
        tokens = sum(w.tokens for w in self.writers.values())
        rate = self.new_tokens / max(time.perf_counter() - self.started, 1e-9)
        return f"{docs:,} docs, {tokens:,} tokens, {rate:,.0f} tokens/s"


# ---------------------------------------------------------------------- prepare
def prepare(recipe: Recipe, log: Callable[[str], None] = print) -> Path:
    """Tokenizer, token shards and meta.json in `recipe.data.data_dir`; returns that folder.

    A finished folder for the same data settings is left alone; an interrupted one is continued
    from its last finished shard, with the same bytes as an uninterrupted run.
    """
    data_dir = Path(recipe.data.data_dir)
    fingerprint = data_fingerprint(recipe)
    if (data_dir / META_FILE).is_file():
        _require_same_data_settings(data_dir, fingerprint)
        (data_dir / PROGRESS_FILE).unlink(missing_ok=True)  # left by a prepare that died just after meta.json
        log(f"{data_dir} is already prepared (delete it to prepare again)")
        return data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    tokenizer, progress = _tokenizer_and_progress(recipe, data_dir, fingerprint, log)
    shard_pass = ShardPass(recipe, tokenizer, data_dir, progress, log)
    writers = shard_pass.run()
    if writers["validation"].tokens == 0:
        raise DataMismatchError(
            f"{data_dir}: no validation tokens: every val_every={recipe.data.val_every}th document is held out and "
            f"the {writers['train'].documents:,} documents read"
            + (f" (max_tokens={recipe.data.max_tokens:,} stopped the reading)" if recipe.data.max_tokens else "")
            + " include none; lower val_every"
            + (" or raise max_tokens" if recipe.data.max_tokens else "")
        )
    for leftover in data_dir.glob("*.bin.pending"):  # queues of a run that died between shard and record
        leftover.unlink()
    # meta.json last: its presence is what marks the folder complete.
    _write_json_atomically(data_dir / META_FILE, _meta(recipe, tokenizer, progress, writers))
    (data_dir / PROGRESS_FILE).unlink(missing_ok=True)
    log(f"prepared {data_dir}: {shard_pass.status()}")
    try:
        check_prepared_data(recipe)
    except DataMismatchError as exc:
        # The data is still valid; the recipe's batch shape is what does not fit. Training says so again.
        log(f"warning: {exc}")
    return data_dir


def _require_same_data_settings(data_dir: Path, fingerprint: str) -> None:
    found = read_meta(data_dir).get("data_fingerprint")
    if found != fingerprint:
        raise DataMismatchError(
            f"{data_dir / META_FILE}: data_fingerprint expected {fingerprint} (this recipe's data settings), "
            f"found {found}: the folder holds data prepared with other settings; delete it or set data_dir "
            f"to a new folder"
        )


def _tokenizer_and_progress(
    recipe: Recipe, data_dir: Path, fingerprint: str, log: Callable[[str], None]
) -> tuple[PreTrainedTokenizerFast, dict[str, Any]]:
    """The tokenizer and shard progress of an interrupted run with the same settings, or fresh ones."""
    resumed = _resumable_run(data_dir, fingerprint)
    if resumed is not None:
        tokenizer, progress = resumed
        done = {split: len((progress[split] or {}).get("shards", [])) for split in SPLIT_PREFIX}
        log(f"resuming {data_dir}: {done['train']} train and {done['validation']} validation shards already written")
        return tokenizer, progress
    _remove_partial_output(data_dir)
    tokenizer = _fresh_tokenizer(recipe, data_dir, log)
    progress = {
        "data_fingerprint": fingerprint,
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "train": None,
        "validation": None,
    }
    _write_json_atomically(data_dir / PROGRESS_FILE, progress)
    return tokenizer, progress


def _resumable_run(data_dir: Path, fingerprint: str) -> tuple[PreTrainedTokenizerFast, dict[str, Any]] | None:
    path = data_dir / PROGRESS_FILE
    if not path.is_file():
        return None
    progress = json.loads(path.read_text())
    if progress.get("data_fingerprint") != fingerprint:
        return None
    try:
        tokenizer = load_tokenizer(data_dir)
    except (OSError, ValueError):
        return None
    if tokenizer_hash(tokenizer) != progress.get("tokenizer_hash"):
        return None
    itemsize = token_dtype(len(tokenizer)).itemsize
    for split, prefix in SPLIT_PREFIX.items():
        state = progress[split] or {}
        queued = (state.get("pending") or {}).get("tokens", 0)
        pending = data_dir / (shard_name(prefix, len(state.get("shards", []))) + ".pending")
        if queued and (not pending.is_file() or pending.stat().st_size < queued * itemsize):
            return None  # the saved queue is gone: start over rather than lose its documents
    return tokenizer, progress


def _remove_partial_output(data_dir: Path) -> None:
    """Delete what an interrupted run with other settings left; only files `prepare` itself names."""
    names = [f"{p}_*.bin*" for p in SPLIT_PREFIX.values()] + [f"{n}*" for n in (META_FILE, PROGRESS_FILE)]
    for pattern in names:
        for path in data_dir.glob(pattern):
            path.unlink()
    shutil.rmtree(data_dir / TOKENIZER_DIR, ignore_errors=True)


def _fresh_tokenizer(recipe: Recipe, data_dir: Path, log: Callable[[str], None]) -> PreTrainedTokenizerFast:
    d = recipe.data
    if d.tokenizer == "train":
        limit = d.tokenizer_train_documents
        log(f"training a {d.vocab_size}-token byte-level BPE on {limit or 'all'} documents of the mixture")
        texts: Iterable[str] = (text for _, text in mixture(recipe))
        if limit:
            texts = islice(texts, limit)
        # long documents in pieces here too: fitting pre-tokenizes them just like encoding does
        pieces = (piece for text in texts for piece in (split_long_text(text) if len(text) > PIECE_CHARS else [text]))
        tokenizer = train_tokenizer(pieces, d.vocab_size, d.special_tokens)
    else:
        log(f"using the tokenizer at {d.tokenizer}")
        tokenizer = load_pretrained_tokenizer(d.tokenizer)
    save_tokenizer(tokenizer, data_dir)
    # From here on, use exactly what every later reader of data_dir will load.
    tokenizer = load_tokenizer(data_dir)
    expected = d.vocab_size + len(d.special_tokens)
    if len(tokenizer) != expected:
        fix = (
            "the corpus is too small to learn that many tokens: lower vocab_size or add documents"
            if d.tokenizer == "train"
            else f"set vocab_size to {len(tokenizer) - len(d.special_tokens)}"
        )
        raise DataMismatchError(
            f"vocab_size: the recipe expects {expected} tokens (vocab_size {d.vocab_size} + "
            f"{len(d.special_tokens)} special tokens), found {len(tokenizer)} in {data_dir / TOKENIZER_DIR}; {fix}"
        )
    return tokenizer


def _meta(
    recipe: Recipe, tokenizer: PreTrainedTokenizerFast, progress: dict[str, Any], writers: dict[str, SplitWriter]
) -> dict[str, Any]:
    d = recipe.data
    sources = []
    for i, (source, weight) in enumerate(zip(d.sources, normalised_weights(d.sources), strict=True)):
        sources.append(
            {
                **dataclasses.asdict(source),
                "weight": weight,
                "documents": sum(w.source_documents[i] for w in writers.values()),
                "tokens": sum(w.source_tokens[i] for w in writers.values()),
            }
        )
    return {
        "format_version": FORMAT_VERSION,
        "created_by": f"hf-pretrain {_package_version()}",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "data_fingerprint": progress["data_fingerprint"],
        "tokenizer_hash": progress["tokenizer_hash"],
        "vocab_size": len(tokenizer),
        "dtype": token_dtype(len(tokenizer)).name,
        "eos_id": tokenizer.eos_token_id,
        "eos": EOS_POLICY,
        "seed": recipe.train.seed,
        "val_every": d.val_every,
        "max_tokens": d.max_tokens,
        "shard_tokens": d.shard_tokens,
        "splits": {split: writer.summary() for split, writer in writers.items()},
        "sources": sources,
    }


# ---------------------------------------------------------------------- reading and checking
def read_meta(data_dir: str | Path, recipe_name: str | None = None) -> dict[str, Any]:
    path = Path(data_dir) / META_FILE
    if not path.is_file():
        raise DataMismatchError(
            f"{path} not found: the data is not prepared (or preparing did not finish); {_prepare_hint(recipe_name)}"
        )
    return json.loads(path.read_text())


def data_identity(data_dir: str | Path) -> dict[str, Any] | None:
    """What a checkpoint records of the data it trained on, to know it again: the tokenizer's hash, the
    vocabulary size, and a hash of the training shards' own SHA-256s (the tokens themselves, whatever
    settings made them). None when the folder is not prepared (the preflight says so)."""
    try:
        meta = read_meta(data_dir)
        shards = "".join(shard["sha256"] for shard in meta["splits"]["train"]["shards"])
        return {
            "data_dir": str(data_dir),
            "tokenizer_hash": meta["tokenizer_hash"],
            "vocab_size": meta["vocab_size"],
            "train_tokens_sha256": hashlib.sha256(shards.encode()).hexdigest(),
        }
    except (DataMismatchError, OSError, ValueError, KeyError, TypeError):
        return None


def shard_paths(data_dir: str | Path, meta: dict[str, Any], split: str) -> list[Path]:
    """The split's shard files, each checked to hold exactly the tokens meta.json lists."""
    itemsize = np.dtype(meta["dtype"]).itemsize
    paths = []
    for shard in meta["splits"][split]["shards"]:
        path = Path(data_dir) / shard["file"]
        size = path.stat().st_size if path.is_file() else None
        if size != shard["tokens"] * itemsize:
            raise DataMismatchError(
                f"{path}: size expected {shard['tokens'] * itemsize} bytes "
                f"({shard['tokens']} {meta['dtype']} tokens per {META_FILE}), found {size}"
            )
        paths.append(path)
    return paths


def check_prepared_data(recipe: Recipe, verify: str = "recorded", progress: bool = False) -> dict[str, Any]:
    """meta.json of the recipe's data_dir, after checking it fits the recipe and the saved tokenizer.

    `verify` checks the shards' bytes (SHA-256, token ids below the vocabulary): `recorded` trusts
    a verification recorded beside the data that still matches the files, `full` hashes every
    shard again, `none` only checks sizes.
    """
    data_dir = Path(recipe.data.data_dir)
    meta_file = data_dir / META_FILE
    meta = read_meta(data_dir, recipe.name)
    hint = _prepare_hint(recipe.name)

    def mismatch(field: str, expected: Any, found: Any, why: str) -> DataMismatchError:
        return DataMismatchError(f"{meta_file}: {field} expected {expected}, found {found} ({why}); {hint}")

    if meta.get("format_version") != FORMAT_VERSION:
        raise mismatch(
            "format_version", FORMAT_VERSION, meta.get("format_version"), "written by another version of hf-pretrain"
        )
    try:
        tokenizer = load_tokenizer(data_dir)
    except FileNotFoundError as exc:
        raise DataMismatchError(f"{exc}; {hint}") from exc
    except TokenizerUnreadable as exc:  # its message names the file and the fix
        raise DataMismatchError(str(exc)) from exc
    saved_hash = tokenizer_hash(tokenizer)
    if saved_hash != meta.get("tokenizer_hash"):
        raise mismatch(
            "tokenizer_hash",
            saved_hash,
            meta.get("tokenizer_hash"),
            f"expected is the hash of the tokenizer in {data_dir / TOKENIZER_DIR}; the shards were "
            f"tokenized with another one",
        )
    expected_vocab = recipe.data.vocab_size + len(recipe.data.special_tokens)
    if meta.get("vocab_size") != expected_vocab:
        raise mismatch(
            "vocab_size",
            expected_vocab,
            meta.get("vocab_size"),
            f"the recipe's vocab_size {recipe.data.vocab_size} + {len(recipe.data.special_tokens)} special tokens",
        )
    if meta.get("dtype") != token_dtype(expected_vocab).name:
        raise mismatch("dtype", token_dtype(expected_vocab).name, meta.get("dtype"), "token ids must fit the dtype")
    train_needed = recipe.train.global_batch_tokens + 1
    if meta["splits"]["train"]["tokens"] < train_needed:
        raise mismatch(
            "splits.train.tokens",
            f"at least {train_needed}",
            meta["splits"]["train"]["tokens"],
            "one global batch of global_batch_tokens plus the shifted target; add documents, raise "
            "max_tokens or lower global_batch_tokens",
        )
    val_needed = recipe.data.seq_len + 1
    if meta["splits"]["validation"]["tokens"] < val_needed:
        raise mismatch(
            "splits.validation.tokens",
            f"at least {val_needed}",
            meta["splits"]["validation"]["tokens"],
            "one sample of seq_len + 1 tokens; lower val_every or add documents",
        )
    for split in SPLIT_PREFIX:
        shard_paths(data_dir, meta, split)
    if verify != "none":
        try:
            verify_shards(data_dir, meta, trust_recorded=verify == "recorded", progress=progress)
        except ShardCorruptError as exc:
            raise DataMismatchError(str(exc)) from None
    return meta
