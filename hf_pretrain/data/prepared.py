"""A prepared data folder: its layout, its meta.json, and the checks that tie it to a recipe.

Layout of data_dir (format 2):
    tokenizer/                          save_pretrained of the tokenizer
    sources/<name>/train/00000.ds ...   datatrove token files: raw ids (uint16 or uint32, no header), EOS
    sources/<name>/train/00000.ds.index   after every document; .ds.index: the document ends (uint64)
    sources/<name>/validation/...       the source's held-out documents, the same way
    sources/<name>/source.json          the source's files, sizes, checksums and tokenizer hash
    logs/<name>/                        datatrove's record of the finished tasks (a rerun skips them)
    meta.json                           written last; its presence means "complete"
    prepare_progress.json               while preparing: the settings, and which of these paths `prepare`
                                        created (the only ones it may ever remove); gone once meta.json is
    prepare.lock                        held (flock) by the `prepare` writing into the folder; names it
    prepare.workers.lock                held (shared flock) by each of its local workers while it lives
    verified.json                       the shards' last verification (verify.py)

Each source keeps its own folder, so the mixture is drawn when training (mixing.py) and a new one
needs no re-tokenization. Format 1 (flat `train_00000.bin` shards of one mixed stream) is refused
with the command that prepares the data again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from hf_pretrain.config import DEFAULT_SOURCE_NAME, DataConfig, Recipe, SourceConfig
from hf_pretrain.config.recipe_command import recipe_command
from hf_pretrain.data.sources import source_tasks
from hf_pretrain.data.tokenizer import TOKENIZER_DIR, TokenizerUnreadable, load_tokenizer, tokenizer_hash
from hf_pretrain.data.verify import ShardCorruptError, verify_shards
from hf_pretrain.store.location import Location

FORMAT_VERSION = 2
META_FILE = "meta.json"
SOURCE_FILE = "source.json"
SOURCES_DIR = "sources"
LOGS_DIR = "logs"
EOS_POLICY = "appended after every document"
SPLITS = ("train", "validation")


class DataMismatchError(RuntimeError):
    """Prepared data that is missing, incomplete, or does not belong to the recipe at hand. `fix`, where
    the message ends with one (`; FIX`): the `prepare` that mends it, which the doctor's row shows apart."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(f"{message}; {fix}" if fix else message)
        self.fix = fix


def token_dtype(vocab_len: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_len <= np.iinfo(np.uint16).max + 1 else np.uint32)


def source_folder_name(index: int, source: SourceConfig) -> str:
    """`00-python-docs`, `01-fineweb-edu`, `02-corpus`: the order in the recipe and a readable name (a
    files source: its `name` when it has one, else its first path's file name, or its folder's where that
    is a glob)."""
    name = source.name
    if source.kind == "files" and name == DEFAULT_SOURCE_NAME:
        first = Path(source.paths[0]) if source.paths else Path("files")
        first = first.with_suffix("") if first.suffix in (".gz", ".zst") else first  # a.jsonl.gz: `a`
        name = first.stem if not set("*?[") & set(first.stem) else first.parent.name
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name.split("/")[-1]).strip("-").lower() or "source"
    return f"{index:02d}-{slug}"


def data_settings(d: DataConfig, seed: int) -> dict[str, Any]:
    """Every setting that changes the bytes `prepare` writes (not where, not how it is run, not the
    mixture's weights: those are applied when training): the data section's, and the train section's
    `seed` (it draws the tokenizer's sample)."""
    unshaping = {"weight", "decay_weight"}
    return {
        "format_version": FORMAT_VERSION,
        "sources": [
            {k: v for k, v in dataclasses.asdict(s).items() if k not in unshaping} | {"tasks": tasks}
            for s, tasks in zip(d.sources, source_task_counts(d.sources), strict=True)
        ],
        "tokenizer": d.tokenizer,
        "vocab_size": d.vocab_size,
        "special_tokens": d.special_tokens,
        "tokenizer_train_documents": d.tokenizer_train_documents,
        "max_tokens": d.max_tokens,
        "val_every": d.val_every,
        "seed": seed,
    }


# The keys `prepare` reads: those of `data_settings`, where it writes, how it runs, and init_from (refused
# with a fitted tokenizer). A `prepare` command printed as a fix sets each of them that the run changed.
PREPARE_KEYS = (
    *("sources", "tokenizer", "vocab_size", "special_tokens", "tokenizer_train_documents", "max_tokens"),
    *("val_every", "seed", "data_dir", "init_from", "executor", "workers", "slurm_partition", "slurm_time"),
    *("slurm_cpus_per_task", "ray_address"),
)


def data_fingerprint(d: DataConfig, seed: int) -> str:
    """Hash of `data_settings`: meta.json records it, and a folder made with other settings is refused."""
    return hashlib.sha256(json.dumps(data_settings(d, seed), sort_keys=True).encode()).hexdigest()[:16]


def source_task_counts(sources: list[SourceConfig]) -> list[int]:
    return [source_tasks(s) for s in sources]


# The fix of a message about data no recipe is known for (a folder named alone).
PREPARE_ANY = "run `hf-pretrain prepare --recipe NAME`"


def prepare_hint(recipe: Recipe | None) -> str:
    """The `prepare` that makes the data `recipe` needs, with every data setting its command line changed."""
    if recipe is None:
        return PREPARE_ANY
    return f"run `{recipe_command(recipe, 'prepare', PREPARE_KEYS)}`"


def new_folder_next_to(data_dir: Path) -> Path:
    """A folder beside `data_dir` that does not exist yet (`data-prepared`, `data-prepared-2` ...)."""
    base = Path(data_dir).resolve()
    candidate, n = base.with_name(f"{base.name}-prepared"), 2
    while candidate.exists():
        candidate, n = base.with_name(f"{base.name}-prepared-{n}"), n + 1
    return candidate


def reprepare_hint(recipe: Recipe, data: Location, then: str = "this command") -> str:
    """For a folder that holds other data than `recipe` needs: a `prepare` into a new folder (a prepare into
    this one would find it prepared), and the flag that points the run (`then`: the command given it) at it.
    `data`: where the data lives (the door's)."""
    url = data.given.rstrip("/")
    new = f"{url}-prepared" if data.in_store else new_folder_next_to(Path(url))  # a store's prefix: any new one
    moved = dataclasses.replace(recipe, data=dataclasses.replace(recipe.data, data_dir=str(new)))
    command = recipe_command(moved, "prepare", PREPARE_KEYS)
    return f"prepare into a new folder, `{command}`, and give {then} `--data_dir {new}`"


# ---------------------------------------------------------------------- reading
def data_folder(data: Location | str | Path, *, fix: str = PREPARE_ANY) -> Path:
    """The local folder holding the data's meta.json and tokenizer. `data`: the door's `Location` (a local
    folder, or a store URL whose local copy, in the cache folder the door named, is synced from the store
    once per process: store/data/data_cache.py), or a local folder. `fix`: the `prepare` a missing one names."""
    if not isinstance(data, Location) or not data.in_store:
        return Path(str(data))
    from hf_pretrain.store.data.data_cache import NotPrepared, synced_copy

    try:
        return synced_copy(data.given, data.cache)
    except NotPrepared as exc:
        raise DataMismatchError(str(exc), fix) from None


def read_meta(data: Location | str | Path, *, fix: str = PREPARE_ANY) -> dict[str, Any]:
    """meta.json of `data` (see `data_folder`); a missing one names `fix`, the `prepare` that makes it."""
    path = data_folder(data, fix=fix) / META_FILE
    if not path.is_file():
        raise DataMismatchError(f"{path} not found: the data is not prepared (or preparing did not finish)", fix)
    return json.loads(path.read_text())


def data_identity(data_dir: Location | str | Path) -> dict[str, Any] | None:
    """What a checkpoint records of the data it trained on, to know it again: the tokenizer's hash, the
    vocabulary size, and a hash of the training files' own SHA-256s, every source's (the tokens
    themselves, whatever settings made them). None when the folder is not prepared (the preflight says so)."""
    try:
        meta = read_meta(data_dir)
        files = "".join(entry["sha256"] for source in meta["sources"] for entry in source["splits"]["train"]["files"])
        return {
            "data_dir": str(data_dir),
            "tokenizer_hash": meta["tokenizer_hash"],
            "vocab_size": meta["vocab_size"],
            "train_tokens_sha256": hashlib.sha256(files.encode()).hexdigest(),
        }
    except (DataMismatchError, OSError, ValueError, KeyError, TypeError):
        return None


def check_index(path: Path, tokens: int) -> None:
    """A token file agrees with its `.ds.index`: the last document ends where the file ends (8 bytes read).
    Two runs writing one folder, or a copy cut short, leave them disagreeing: the documents' bounds lie."""
    index = path.with_name(path.name + ".index")
    size = index.stat().st_size if index.is_file() else 0
    last = 0 if size == 0 else None  # an empty file: no documents (and maybe no index written)
    if size and size % 8 == 0:
        with index.open("rb") as f:
            f.seek(size - 8)
            last = int(np.frombuffer(f.read(8), dtype="<u8")[0])
    if last != tokens:
        found = "missing" if not index.is_file() else f"its last document ending at token {last}"
        raise DataMismatchError(
            f"{index}: {found}, but {path.name} holds {tokens:,} tokens: the token file and its index come from "
            f"different runs (two prepares into one folder?) or one was cut short; prepare the data again into a "
            f"new data_dir"
        )


def source_paths(data_dir: str | Path, meta: dict[str, Any], split: str) -> list[list[Path]]:
    """Per source, its token files of `split`, each checked to hold exactly the tokens meta.json lists."""
    itemsize = np.dtype(meta["dtype"]).itemsize
    out = []
    for source in meta["sources"]:
        paths = []
        for entry in source["splits"][split]["files"]:
            path = Path(data_dir) / entry["file"]
            size = path.stat().st_size if path.is_file() else None
            if size != entry["tokens"] * itemsize:
                raise DataMismatchError(
                    f"{path}: size expected {entry['tokens'] * itemsize} bytes "
                    f"({entry['tokens']} {meta['dtype']} tokens per {META_FILE}), found {size}"
                )
            check_index(path, entry["tokens"])
            paths.append(path)
        out.append(paths)
    return out


def shard_paths(data_dir: str | Path, meta: dict[str, Any], split: str) -> list[Path]:
    """Every token file of `split`, the sources one after the other (validation reads them so)."""
    return [path for paths in source_paths(data_dir, meta, split) for path in paths]


# ---------------------------------------------------------------------- checking
def check_prepared_data(
    recipe: Recipe, data: Location, verify: str = "recorded", progress: bool = False
) -> dict[str, Any]:
    """meta.json of the recipe's data (at `data`, the door's location of it), after checking it fits the
    recipe and the saved tokenizer.

    `verify` checks the token files' bytes (SHA-256, token ids below the vocabulary): `recorded`
    trusts a verification recorded beside the data that still matches the files, `full` hashes
    every file again, `none` only checks sizes.
    """
    prepare, reprepare = prepare_hint(recipe), reprepare_hint(recipe, data)  # the fixes, written once
    data_dir = data_folder(data, fix=prepare)
    meta_file = data_dir / META_FILE
    meta = read_meta(data_dir, fix=prepare)
    if meta.get("format_version") != FORMAT_VERSION:
        raise DataMismatchError(
            f"{meta_file}: format_version expected {FORMAT_VERSION}, found {meta.get('format_version')} (written by "
            f"another version of hf-pretrain: format 1 is one mixed stream of flat shards, format 2 a datatrove "
            f"folder per source, mixed when training); delete {data_dir} and {prepare}"
        )
    saved_hash = _check_tokenizer(data_dir, meta, fix=reprepare)
    _check_sizes(recipe.data, data_dir, meta, global_batch_tokens=recipe.train.global_batch_tokens, fix=reprepare)
    _check_sources(recipe.data, data_dir, meta, saved_hash, fix=reprepare)
    if data.in_store:  # the shards stay in the store: each block is checked as it is fetched
        _check_complete_in_store(data, data_dir, prepare=prepare, reprepare=reprepare)
        return meta
    for split in SPLITS:
        source_paths(data_dir, meta, split)
    if verify != "none":
        try:
            verify_shards(data_dir, meta, trust_recorded=verify == "recorded", progress=progress)
        except ShardCorruptError as exc:
            raise DataMismatchError(str(exc)) from None
    return meta


def _check_complete_in_store(data: Location, copy: Path, *, prepare: str, reprepare: str) -> None:
    """Every shard and sidecar the data's blocks.json lists is in the store at its size (one listing;
    `copy`: the synced local copy holding blocks.json). A shard deleted there, or a sync cut short, passed
    the preflight and stopped training at the first step that read it."""
    from hf_pretrain.store.data.data_blocks import BLOCKS_FILE
    from hf_pretrain.store.data.data_upload import in_words, store_lacks
    from hf_pretrain.store.urls import filesystem

    store = data.url
    lacking = store_lacks(store, filesystem(store), json.loads((copy / BLOCKS_FILE).read_text()))
    if lacking:
        raise DataMismatchError(
            f"{data} lacks {in_words(lacking)} (a sync cut short, or deleted there): training would stop at the "
            f"first step that reads it",
            f"{prepare} on the machine that prepared the data: it uploads what the store lacks; elsewhere, {reprepare}",
        )


def _mismatch(data_dir: Path, field: str, expected: Any, found: Any, why: str, *, fix: str) -> DataMismatchError:
    """meta.json's `field` is not what this recipe or this folder needs: what, why, and `fix`, a prepare
    (`reprepare_hint`) that fixes it."""
    return DataMismatchError(f"{data_dir / META_FILE}: {field} expected {expected}, found {found} ({why})", fix)


def _check_tokenizer(data_dir: Path, meta: dict[str, Any], *, fix: str) -> str:
    """The folder's tokenizer is the one meta.json records (size and hash); returns its hash."""
    try:
        tokenizer = load_tokenizer(data_dir)
    except FileNotFoundError as exc:
        raise DataMismatchError(str(exc), fix) from exc
    except TokenizerUnreadable as exc:  # its message names the file and the fix
        raise DataMismatchError(str(exc)) from exc
    saved_hash = tokenizer_hash(tokenizer)
    if len(tokenizer) != meta.get("vocab_size"):
        raise _mismatch(
            data_dir,
            "vocab_size",
            len(tokenizer),
            meta.get("vocab_size"),
            f"the size of the tokenizer in {data_dir / TOKENIZER_DIR}",
            fix=fix,
        )
    if saved_hash != meta.get("tokenizer_hash"):
        raise _mismatch(
            data_dir,
            "tokenizer_hash",
            saved_hash,
            meta.get("tokenizer_hash"),
            f"expected is the hash of the tokenizer in {data_dir / TOKENIZER_DIR}; the token files were "
            f"made with another one",
            fix=fix,
        )
    return saved_hash


def _check_sizes(data: DataConfig, data_dir: Path, meta: dict[str, Any], *, global_batch_tokens: int, fix: str) -> None:
    """The recipe's vocabulary and its token dtype, and enough tokens for one global batch and one
    validation sample."""
    expected_vocab = data.vocab_size + len(data.special_tokens)
    if meta.get("vocab_size") != expected_vocab:
        raise _mismatch(
            data_dir,
            "vocab_size",
            expected_vocab,
            meta.get("vocab_size"),
            f"the recipe's vocab_size {data.vocab_size} + {len(data.special_tokens)} special tokens",
            fix=fix,
        )
    if meta.get("dtype") != token_dtype(expected_vocab).name:
        dtype = token_dtype(expected_vocab).name
        raise _mismatch(data_dir, "dtype", dtype, meta.get("dtype"), "token ids must fit the dtype", fix=fix)
    train_needed = global_batch_tokens + 1
    if meta["splits"]["train"]["tokens"] < train_needed:
        raise _mismatch(
            data_dir,
            "splits.train.tokens",
            f"at least {train_needed}",
            meta["splits"]["train"]["tokens"],
            "one global batch of global_batch_tokens plus the shifted target; add documents, raise "
            "max_tokens or lower global_batch_tokens",
            fix=fix,
        )
    val_needed = data.seq_len + 1
    if meta["splits"]["validation"]["tokens"] < val_needed:
        raise _mismatch(
            data_dir,
            "splits.validation.tokens",
            f"at least {val_needed}",
            meta["splits"]["validation"]["tokens"],
            "one sample of seq_len + 1 tokens; lower val_every or add documents",
            fix=fix,
        )


def _check_sources(data: DataConfig, data_dir: Path, meta: dict[str, Any], saved_hash: str, *, fix: str) -> None:
    """The recipe's sources are the prepared ones, in order; each folder was made with this tokenizer,
    and holds at least one training sample (the mixture draws from every source)."""
    prepared = [s["name"] for s in meta["sources"]]
    wanted = [source_folder_name(i, s) for i, s in enumerate(data.sources)]
    if prepared != wanted:
        raise DataMismatchError(
            f"{data_dir / META_FILE}: sources expected {wanted} (the recipe's), found {prepared}", fix
        )
    for source in meta["sources"]:
        folder = data_dir / source["folder"]
        record = folder / SOURCE_FILE
        found = json.loads(record.read_text()).get("tokenizer_hash") if record.is_file() else None
        if found != saved_hash:
            raise DataMismatchError(
                f"{folder}: tokenized with another tokenizer (hash {str(found)[:12]}..., the data's tokenizer is "
                f"{saved_hash[:12]}...): its token ids mean other strings; {fix} (or put back the folder that "
                f"belongs to {data_dir / TOKENIZER_DIR})"
            )
        if source["splits"]["train"]["tokens"] < data.seq_len + 1:
            raise DataMismatchError(
                f"{folder}: {source['splits']['train']['tokens']:,} training tokens, fewer than one sample of "
                f"seq_len + 1 = {data.seq_len + 1}: the mixture cannot draw from it; add documents or "
                f"leave the source out"
            )
