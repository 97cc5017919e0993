"""The recipe's `data:` section: the corpora of the mixture, the tokenizer, how `prepare` runs and how the
loader reads (`hf_pretrain/data/` owns it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .keys import key

# `name`'s default: the builtin corpus a bare `kind: builtin` reads. A files source whose name is this has
# none of its own (it is named after its files), so a recipe written before files took a name reads the same.
DEFAULT_SOURCE_NAME = "python-docs"


@dataclass
class SourceConfig:
    """One corpus in the data mixture."""

    kind: Literal["builtin", "hub", "files"] = key(
        "builtin", "`builtin` (text every Python install has), `hub` (a Hub dataset) or `files` (local files)"
    )
    name: str = key(
        DEFAULT_SOURCE_NAME,
        "builtin: `python-docs` or `python-stdlib`; hub: the dataset id, e.g. HuggingFaceFW/fineweb-edu; files: "
        "the source's name in the data folder (`sources/NN-name`) and in training's lines (unset: its first "
        "file's name, or its folder's for a glob)",
    )
    config: str | None = key(None, "Hub dataset configuration (subset), if it has several")
    split: str = key("train", "Hub split to read")
    column: str = key("text", "column that holds the document text")
    paths: list[str] = key(
        factory=list,
        help="local files (globs): .jsonl or .parquet (a document per row, from `column`) or text (.txt, .md, "
        "...; .gz too). A text file is one document, except a .txt that holds <|endoftext|> (split there) or, "
        "without it, is over 1 MB (a book, a dump: split at each blank line)",
    )
    weight: float = key(
        1.0,
        "relative share of this source in the training batches (normalised over all sources; no re-prepare); "
        "0 with a decay_weight: a decay-only source, drawn from the decay on",
        ge=0,
    )
    decay_weight: float | None = key(
        None,
        "its share from the first step of a wsd decay or a cooldown on (annealing on the best data); null = `weight`",
        gt=0,
    )
    tasks: int = key(
        0, "`prepare` tasks for this source (0 = one per file; 1 for a builtin or a Hub dataset)", math=False, ge=0
    )
    streaming: bool = key(True, "stream a Hub dataset instead of downloading it whole")
    max_documents: int = key(0, "stop reading this source after this many documents (0 = all)", ge=0)


@dataclass
class DataConfig:
    """Corpus, tokenizer and packed-sequence loading."""

    sources: list[SourceConfig] = key(
        factory=lambda: [SourceConfig()], help="the corpora of the mixture, a YAML/JSON list of mappings"
    )
    data_dir: str = key(
        "data/smoke",
        "folder for the tokenizer, token shards and meta.json written by `hf-pretrain prepare`",
        math=False,
    )
    tokenizer: str = key(
        "train",
        "`train` fits a byte-level BPE on the corpus; otherwise a saved tokenizer, used as it is: a local "
        "folder (a model folder too), a tokenizer.json, or a Hub id (through huggingface_hub's cache)",
    )
    vocab_size: int = key(
        4096,
        "vocabulary of the trained BPE (base tokens, merges and the end-of-text token); with a saved "
        "tokenizer, its size (without special_tokens)",
        ge=257,
    )
    special_tokens: list[str] = key(
        factory=list, help="extra special tokens added on top of vocab_size (e.g. chat markers)"
    )
    language: list[str] = key(
        factory=lambda: ["en"],
        math=False,
        help="ISO 639-1 codes of the corpus's languages, for the model card's `language`",
    )
    tokenizer_train_documents: int = key(0, "documents used to fit the tokenizer (0 = all)", ge=0)
    max_tokens: int = key(0, "stop preparing after this many training tokens (0 = the whole corpus)", ge=0)
    val_every: int = key(50, "every val_every-th document goes to the validation split", ge=2)
    executor: Literal["local", "slurm", "ray"] = key(
        "local", "where `prepare` runs datatrove: `local` (this machine), `slurm` (a job array) or `ray`", math=False
    )
    workers: int = key(0, "`prepare` tasks run at once (0 = every core here; slurm: no limit)", math=False, ge=0)
    slurm_partition: str = key("", "slurm: the partition the array job runs in", math=False)
    slurm_time: str = key("12:00:00", "slurm: time limit of each task", math=False)
    slurm_cpus_per_task: int = key(1, "slurm: cores per task (each task tokenizes on one)", math=False, ge=1)
    ray_address: str = key("auto", "ray: the address of an existing cluster", math=False)
    seq_len: int = key(128, "training context length; the loader packs seq_len + 1 tokens per sample", ge=1)
    num_workers: int = key(
        1, "DataLoader worker processes (>0 keeps data loading off the training thread)", math=False, ge=0
    )
    preload: bool = key(False, "copy shards into RAM instead of memory-mapping them", math=False)
    # data_dir as an object-store URL (store/data/data_cache.py): the local cache of its blocks
    data_cache_gb: float = key(
        20.0,
        "with data_dir an object-store URL: GB of data blocks this machine keeps per training process (fetched "
        "ahead of use, the ones not needed soon evicted when full)",
        math=False,
        gt=0,
    )
