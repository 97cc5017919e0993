"""Data pipeline: sources, tokenizer, a token folder per source + meta.json, packed loaders. Tiny and CPU-only."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: no test may reach the Hub

import dataclasses
import json
import pickle
import random
import shutil
import subprocess
import sys
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from hf_pretrain.config import Recipe, SourceConfig, build_recipe
from hf_pretrain.data import sources
from hf_pretrain.data.loader import PackedDataset, StepBatchSampler, validation_batches
from hf_pretrain.data.prepare_run import prepare
from hf_pretrain.data.prepared import DataMismatchError, check_prepared_data, read_meta, shard_paths
from hf_pretrain.data.sources import MixedStream, SourceError, is_validation, iter_source
from hf_pretrain.data.tokenizer import (
    load_pretrained_tokenizer,
    load_tokenizer,
    save_tokenizer,
    split_long_text,
    tokenizer_hash,
    train_tokenizer,
)
from hf_pretrain.data.verify import VERIFIED_FILE, verify_shards
from hf_pretrain.exit_codes import EXIT_CONFIG
from tests.helpers import build_train_loader, build_val_loader, cli, data_of, placed

VOCAB = 320
WORDS = (
    "the of and to in is was for on that with as by at from data model token python loss batch "
    "shard merge learn rate step seed rank epoch"
).split()
# Documents that stress the round trip: unicode, code with tabs, leading spaces, and a document that
# quotes the end-of-text marker (it must stay text, not become a document boundary).
TRICKY = [
    "naïve café — 日本語 🙂 Ünïcödé",
    "def f(x):\n\treturn x  # two spaces\n",
    "   leading spaces",
    "quoting <|endoftext|> inside a document",
    "trailing newline\n\n",
]


# ---------------------------------------------------------------------- fixtures
def _paragraph(rng: random.Random) -> str:
    sentences = [
        " ".join(rng.choices(WORDS, k=rng.randint(4, 12))).capitalize() + "." for _ in range(rng.randint(1, 4))
    ]
    return " ".join(sentences)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A jsonl file and three txt files; returns their folder and the documents of each source."""
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    jsonl_docs = TRICKY + [_paragraph(rng) for _ in range(55)]
    with (root / "a.jsonl").open("w", encoding="utf-8") as f:
        for i, doc in enumerate(jsonl_docs):
            f.write(json.dumps({"id": i, "text": doc}, ensure_ascii=False) + "\n")
    txt_docs = []
    for name in ("b.txt", "c.txt", "d.txt"):
        doc = "\n\n".join(_paragraph(rng) for _ in range(3))
        (root / name).write_text(doc, encoding="utf-8")
        txt_docs.append(doc)
    return {"root": root, "jsonl": jsonl_docs, "txt": txt_docs}


def make_recipe(corpus: dict[str, Any], data_dir: Path, **overrides: Any) -> Recipe:
    raw = {
        "data": {
            "sources": [
                {"kind": "files", "paths": [str(corpus["root"] / "*.jsonl")]},
                {"kind": "files", "paths": [str(corpus["root"] / "*.txt")], "weight": 2.0},
            ]
        }
    }
    settings = {
        "data_dir": str(data_dir),
        "vocab_size": VOCAB,
        "val_every": 5,
        "workers": 1,
        "seq_len": 16,
        "micro_batch_size": 2,
        "global_batch_tokens": 64,
        "num_workers": 0,
        "max_steps": 10,
        "warmup_steps": 1,
        "eval_tokens": 96,
    }
    return build_recipe(raw, {**settings, **overrides})


@pytest.fixture(scope="module")
def prepared(corpus: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    recipe = make_recipe(corpus, tmp_path_factory.mktemp("prepared") / "data")
    prepare(recipe, log=lambda _: None)
    return recipe


def split_tokens(data_dir: Path, split: str) -> np.ndarray:
    meta = read_meta(data_dir)
    paths = shard_paths(data_dir, meta, split)
    return np.concatenate([np.fromfile(p, dtype=meta["dtype"]) for p in paths])


def decode_documents(data_dir: Path, split: str) -> list[str]:
    tokenizer = load_tokenizer(data_dir)
    tokens = split_tokens(data_dir, split)
    assert tokens[-1] == tokenizer.eos_token_id
    ends = np.flatnonzero(tokens == tokenizer.eos_token_id)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [
        tokenizer.decode(tokens[s:e].tolist(), clean_up_tokenization_spaces=False)
        for s, e in zip(starts, ends, strict=True)
    ]


def expected_split(recipe: Recipe, split: str) -> list[str]:
    """Each source in turn, each of its files (a task each) in turn; document i of file k is held out
    when k + i is a multiple of val_every, less one."""
    want_val, out = split == "validation", []
    for source in recipe.data.sources:
        for k, path in enumerate(sources.expand_globs(source.paths)):
            one = dataclasses.replace(source, paths=[str(path)])
            out += [
                t for i, t in enumerate(iter_source(one)) if is_validation(k + i, recipe.data.val_every) == want_val
            ]
    return out


def data_files(data_dir: Path) -> dict[str, bytes]:
    """Every file of a prepared folder, with meta.json's creation time blanked (and without the record
    of when its shards were last verified, which is about the files, not part of them)."""
    files = {
        str(p.relative_to(data_dir)): p.read_bytes()
        for p in sorted(data_dir.rglob("*"))
        if p.is_file() and p.name != VERIFIED_FILE
    }
    meta = json.loads(files["meta.json"])
    meta["created_at"] = None
    files["meta.json"] = json.dumps(meta).encode()
    return files


# ---------------------------------------------------------------------- sources
def test_builtin_corpora_yield_documents() -> None:
    for name in ("python-docs", "python-stdlib"):
        docs = list(iter_source(SourceConfig(kind="builtin", name=name, max_documents=3)))
        assert len(docs) == 3 and all(isinstance(d, str) and d for d in docs)


def test_unknown_builtin_and_missing_glob_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="python-docs, python-stdlib"):
        iter_source(SourceConfig(kind="builtin", name="python-doc"))
    pattern = str(tmp_path / "nothing" / "*.jsonl")
    with pytest.raises(SourceError, match="matches no file") as info:
        iter_source(SourceConfig(kind="files", paths=[pattern]))
    assert pattern in str(info.value)


def test_file_formats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pq.write_table(pa.table({"content": ["one", "", "two"]}), tmp_path / "x.parquet")
    assert list(iter_source(SourceConfig(kind="files", paths=[str(tmp_path / "*.parquet")], column="content"))) == [
        "one",
        "two",
    ]
    with pytest.raises(SourceError, match="columns: content"):
        list(iter_source(SourceConfig(kind="files", paths=[str(tmp_path / "*.parquet")])))
    (tmp_path / "y.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(SourceError, match="keys: body"):
        list(iter_source(SourceConfig(kind="files", paths=[str(tmp_path / "y.jsonl")])))
    # A large .txt file is split into documents on blank lines (CRLF too); a small one is one document.
    (tmp_path / "big.txt").write_bytes("\ufefffirst para\r\nline two\r\n\r\n  \r\nsecond para".encode())
    txt = SourceConfig(kind="files", paths=[str(tmp_path / "big.txt")])
    assert list(iter_source(txt)) == ["first para\nline two\n\n  \nsecond para"]
    monkeypatch.setattr(sources, "TXT_SPLIT_BYTES", 10)
    assert list(iter_source(txt)) == ["first para\nline two", "second para"]
    # A .txt file with end-of-text markers is split on them, whatever its size.
    (tmp_path / "stories.txt").write_text("One story.\n\nStill one.\n<|endoftext|>\nTwo.\n<|endoftext|>\n")
    assert list(iter_source(SourceConfig(kind="files", paths=[str(tmp_path / "stories.txt")]))) == [
        "One story.\n\nStill one.",
        "Two.",
    ]


def test_shared_tinystories_sample_splits_into_stories() -> None:
    path = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "text" / "tinystories_sample.txt"
    if not path.is_file():
        pytest.skip(f"{path} is absent: ../shared is only present in the project's own checkout")
    stories = list(iter_source(SourceConfig(kind="files", paths=[str(path)])))
    # 2316 markers; the sample ends mid-story, after the last one.
    assert len(stories) == 2317 and stories[0].startswith("One day, a little girl named Lily found a needle")
    assert not any("<|endoftext|>" in story for story in stories)


def test_hub_source_names_available_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    rows = [{"blob_id": "abc", "path": "x.py"}]
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: rows)
    with pytest.raises(SourceError, match="available columns: blob_id, path.*blob ids"):
        list(iter_source(SourceConfig(kind="hub", name="some/code-corpus", column="content")))
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: [{"text": "a"}, {"text": "b"}])
    assert list(iter_source(SourceConfig(kind="hub", name="some/text"))) == ["a", "b"]


def test_mixture_is_seeded_weighted_and_drains_every_source() -> None:
    a, b = [f"a{i}" for i in range(300)], [f"b{i}" for i in range(100)]
    first = list(MixedStream([a, b], [0.75, 0.25], seed=1))
    assert first == list(MixedStream([a, b], [0.75, 0.25], seed=1))
    assert first != list(MixedStream([a, b], [0.75, 0.25], seed=2))
    # Every document exactly once, in its source's order, and the weights shape the interleaving
    # (about 50 of the first 200 documents from the 0.25 source; 35..65 is over 2.5 sigma).
    assert sorted(t for _, t in first) == sorted(a + b)
    assert [t for s, t in first if s == 1] == b
    assert 35 <= sum(s == 1 for s, _ in first[:200]) <= 65


# ---------------------------------------------------------------------- tokenizer
def test_tokenizer_training_is_deterministic_and_hash_survives_round_trip(
    corpus: dict[str, Any], tmp_path: Path
) -> None:
    docs = corpus["jsonl"] + corpus["txt"]
    first = train_tokenizer(docs, VOCAB, ["<|user|>", "<|assistant|>"])
    second = train_tokenizer(docs, VOCAB, ["<|user|>", "<|assistant|>"])
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()
    assert len(first) == VOCAB + 2 and first.convert_tokens_to_ids("<|assistant|>") == VOCAB + 1
    save_tokenizer(first, tmp_path)
    reloaded = AutoTokenizer.from_pretrained(str(tmp_path / "tokenizer"))
    assert tokenizer_hash(reloaded) == tokenizer_hash(first) == tokenizer_hash(load_tokenizer(tmp_path))
    assert reloaded.eos_token == reloaded.pad_token == "<|endoftext|>"
    for text in TRICKY:
        assert reloaded(text)["input_ids"] == first(text)["input_ids"]
        assert reloaded.decode(reloaded(text)["input_ids"]) == text


def test_tokenizer_path_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_pretrained_tokenizer(tmp_path / "missing")


# ---------------------------------------------------------------------- prepare
def test_prepare_round_trip_and_meta_counts(prepared: Recipe, corpus: dict[str, Any]) -> None:
    data_dir = Path(prepared.data.data_dir)
    meta = read_meta(data_dir)
    decoded = {split: decode_documents(data_dir, split) for split in ("train", "validation")}
    for split, docs in decoded.items():
        assert docs == expected_split(prepared, split)
        assert meta["splits"][split]["documents"] == len(docs)
    # Independent of the mixture code: every written document comes back exactly once.
    assert sorted(decoded["train"] + decoded["validation"]) == sorted(corpus["jsonl"] + corpus["txt"])
    per_source = [sum(s["splits"][split]["documents"] for split in s["splits"]) for s in meta["sources"]]
    assert per_source == [len(corpus["jsonl"]), len(corpus["txt"])]
    assert sum(s["splits"][x]["tokens"] for s in meta["sources"] for x in s["splits"]) == sum(
        meta["splits"][s]["tokens"] for s in meta["splits"]
    )
    assert [s["config"]["weight"] for s in meta["sources"]] == [1.0, 2.0]  # applied when training, not here
    assert meta["vocab_size"] == VOCAB and meta["dtype"] == "uint16" and meta["eos"] == "appended after every document"
    assert not (data_dir / "prepare_progress.json").exists()


def test_no_token_lost_or_duplicated_across_shards(prepared: Recipe, corpus: dict[str, Any]) -> None:
    data_dir = Path(prepared.data.data_dir)
    meta = read_meta(data_dir)
    assert len(meta["splits"]["train"]["shards"]) == 4  # one file per task: a.jsonl, then b, c, d.txt
    encoder = load_tokenizer(data_dir).backend_tokenizer
    encoder.encode_special_tokens = True  # a quoted <|endoftext|> stays text
    expected = sum(len(encoder.encode(d, add_special_tokens=False).ids) + 1 for d in corpus["jsonl"] + corpus["txt"])
    written = sum(split_tokens(data_dir, s).size for s in ("train", "validation"))
    assert written == expected == sum(meta["splits"][s]["tokens"] for s in meta["splits"])
    for shard in meta["splits"]["train"]["shards"]:  # files end on document boundaries
        assert np.fromfile(data_dir / shard["file"], dtype=meta["dtype"])[-1] == meta["eos_id"]


def test_prepare_is_idempotent_and_refuses_other_settings(prepared: Recipe, corpus: dict[str, Any]) -> None:
    data_dir = Path(prepared.data.data_dir)
    before = data_files(data_dir)
    logs: list[str] = []
    assert prepare(prepared, log=logs.append) == data_dir
    assert any("already prepared" in line for line in logs) and data_files(data_dir) == before
    with pytest.raises(DataMismatchError, match="data_fingerprint"):
        prepare(make_recipe(corpus, data_dir, val_every=7), log=lambda _: None)


def test_token_budget_caps_each_source_at_its_share(corpus: dict[str, Any], tmp_path: Path) -> None:
    recipe = make_recipe(corpus, tmp_path / "data", max_tokens=500)
    prepare(recipe, log=lambda _: None)
    meta = read_meta(tmp_path / "data")
    train = meta["sources"][0]["splits"]["train"]  # weight 1 of 3: a cap of 167 tokens
    longest = max(len(d) for d in corpus["jsonl"])  # bytes bound tokens from above
    assert 167 <= train["tokens"] < 167 + longest + 1
    jsonl_train = [t for i, t in enumerate(corpus["jsonl"]) if not is_validation(i, 5)]
    assert decode_documents(tmp_path / "data", "train")[: train["documents"]] == jsonl_train[: train["documents"]]


# ---------------------------------------------------------------------- checks against the recipe
def test_check_refuses_a_foreign_tokenizer(prepared: Recipe, corpus: dict[str, Any], tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    shutil.copytree(prepared.data.data_dir, data_dir)
    recipe = make_recipe(corpus, data_dir)
    assert check_prepared_data(recipe, data_of(recipe))["tokenizer_hash"] == tokenizer_hash(load_tokenizer(data_dir))
    shutil.rmtree(data_dir / "tokenizer")
    save_tokenizer(train_tokenizer(corpus["txt"], VOCAB, []), data_dir)
    with pytest.raises(DataMismatchError, match=r"tokenizer_hash expected [0-9a-f]{64}, found [0-9a-f]{64}") as info:
        check_prepared_data(recipe, data_of(recipe))
    assert str(data_dir / "meta.json") in str(info.value)


def test_check_refuses_other_vocab_small_splits_and_missing_data(
    prepared: Recipe, corpus: dict[str, Any], tmp_path: Path
) -> None:
    data_dir = Path(prepared.data.data_dir)
    with pytest.raises(DataMismatchError, match=f"vocab_size expected {VOCAB + 64}, found {VOCAB}"):
        check_prepared_data(*placed(make_recipe(corpus, data_dir, vocab_size=VOCAB + 64)))
    with pytest.raises(DataMismatchError, match="splits.train.tokens expected at least 1048577"):
        check_prepared_data(*placed(make_recipe(corpus, data_dir, global_batch_tokens=1 << 20)))
    with pytest.raises(DataMismatchError, match="splits.validation.tokens expected at least 1025"):
        check_prepared_data(
            *placed(make_recipe(corpus, data_dir, seq_len=1024, micro_batch_size=1, global_batch_tokens=1024))
        )
    with pytest.raises(
        DataMismatchError, match=r"not found.*hf-pretrain prepare --recipe smoke .*--data_dir \S*never-prepared"
    ):
        check_prepared_data(*placed(make_recipe(corpus, tmp_path / "never-prepared")))


# ---------------------------------------------------------------------- loaders
def first_batches(loader: torch.utils.data.DataLoader, count: int) -> list[torch.Tensor]:
    it = iter(loader)
    return [next(it) for _ in range(count)]


def test_packed_samples_overlap_by_one_token_and_pickle_cheaply(prepared: Recipe) -> None:
    data_dir = Path(prepared.data.data_dir)
    meta = read_meta(data_dir)
    paths = shard_paths(data_dir, meta, "train")
    dataset = PackedDataset(paths, seq_len=16, dtype=meta["dtype"])
    tokens = split_tokens(data_dir, "train")
    assert len(dataset) == (tokens.size - 1) // 16
    # Rebuilding the stream from the samples crosses every shard boundary.
    stream = torch.cat([dataset[i][:-1] for i in range(len(dataset))] + [dataset[len(dataset) - 1][-1:]])
    assert torch.equal(stream, torch.from_numpy(tokens[: len(dataset) * 16 + 1].astype(np.int64)))
    assert all(dataset[i][-1] == dataset[i + 1][0] for i in range(len(dataset) - 1))
    assert dataset[0].dtype == torch.long and dataset[0].shape == (17,)
    assert len(pickle.dumps(dataset)) < 4096  # mapped after use, yet only paths travel
    preloaded = PackedDataset(paths, seq_len=16, dtype=meta["dtype"], preload=True)
    assert all(torch.equal(preloaded[i], dataset[i]) for i in range(0, len(dataset), 7))


def test_train_loader_is_deterministic_and_resumes_at_a_step(prepared: Recipe, corpus: dict[str, Any]) -> None:
    batches = first_batches(build_train_loader(prepared, 0, 1, grad_accum=2, start_step=0), 12)
    assert all(b.shape == (2, 17) and b.dtype == torch.long for b in batches)
    assert all(
        torch.equal(a, b)
        for a, b in zip(batches, first_batches(build_train_loader(prepared, 0, 1, 2, 0), 12), strict=True)
    )
    resumed = first_batches(build_train_loader(prepared, 0, 1, grad_accum=2, start_step=3), 6)
    assert all(torch.equal(a, b) for a, b in zip(resumed, batches[6:], strict=True))
    other_seed = make_recipe(corpus, Path(prepared.data.data_dir), seed=99)
    assert not torch.equal(first_batches(build_train_loader(other_seed, 0, 1, 2, 0), 1)[0], batches[0])


def test_two_ranks_split_each_step_of_one_rank(prepared: Recipe) -> None:
    steps = 5
    single = first_batches(build_train_loader(prepared, 0, 1, grad_accum=2, start_step=0), 2 * steps)
    rank0 = first_batches(build_train_loader(prepared, 0, 2, grad_accum=1, start_step=0), steps)
    rank1 = first_batches(build_train_loader(prepared, 1, 2, grad_accum=1, start_step=0), steps)
    for step in range(steps):
        assert torch.equal(torch.cat([rank0[step], rank1[step]]), torch.cat(single[2 * step : 2 * step + 2]))
    # Within an epoch no sample is read twice, by either rank.
    samplers = [StepBatchSampler(1000, 4, 3, 2, rank, seed=5) for rank in (0, 1)]
    seen = [[i for batch in islice(s, 30) for i in batch] for s in samplers]
    assert not set(seen[0]) & set(seen[1]) and len(set(seen[0] + seen[1])) == 240


def test_sampler_epochs_are_fresh_permutations() -> None:
    sampler = StepBatchSampler(10, 3, 2, 1, 0, seed=7)
    positions = [i for batch in islice(sampler, 10) for i in batch]  # 30 positions, 3 epochs
    epochs = [positions[0:10], positions[10:20], positions[20:30]]
    assert all(sorted(e) == list(range(10)) for e in epochs) and epochs[0] != epochs[1]
    resumed = StepBatchSampler(10, 3, 2, 1, 0, seed=7, start_step=2)
    assert [i for batch in islice(resumed, 6) for i in batch] == positions[12:30]


def test_train_loader_with_a_worker_matches_in_process(prepared: Recipe, corpus: dict[str, Any]) -> None:
    in_process = first_batches(build_train_loader(prepared, 0, 1, 2, 0), 4)
    with_worker = make_recipe(corpus, Path(prepared.data.data_dir), num_workers=1)
    loader = build_train_loader(with_worker, 0, 1, 2, 0)
    assert loader.num_workers == 1 and loader.persistent_workers
    assert all(torch.equal(a, b) for a, b in zip(in_process, first_batches(loader, 4), strict=True))


def test_val_loader_is_sequential_disjoint_and_even_across_ranks(prepared: Recipe) -> None:
    single = list(build_val_loader(prepared, 0, 1))  # eval_tokens 96 = 6 samples of 16 = 3 batches of 2
    assert len(single) == 3 and all(b.shape == (2, 17) and n == 2 for b, n in single)
    assert torch.equal(single[0][0][0][-1], single[0][0][1][0])  # sequential samples, one shared token
    per_rank = [list(build_val_loader(prepared, rank, 2)) for rank in (0, 1)]
    assert len(per_rank[0]) == len(per_rank[1]) == 2  # the same count on every rank: a filler evens them
    assert torch.equal(per_rank[0][0][0], single[0][0]) and torch.equal(per_rank[1][0][0], single[1][0])
    assert per_rank[1][1][1] == 0  # the filler counts for nothing
    assert validation_batches(7, 2, 2, 1, 100) == [([2, 3], 2), ([6], 1)]  # every sample, the last batch short
    assert validation_batches(3, 8, 4, 0, 100) == [([0, 1, 2], 3)]  # fewer samples than processes
    assert validation_batches(3, 8, 4, 3, 100) == [([0], 0)]
    with pytest.raises(DataMismatchError, match="no complete sample"):
        validation_batches(0, 8, 1, 0, 100)


# ---------------------------------------------------------------------- shard integrity
def _copy_of(prepared: Recipe, tmp_path: Path) -> Recipe:
    data_dir = tmp_path / "copy"
    shutil.copytree(prepared.data.data_dir, data_dir)
    return dataclasses.replace(prepared, data=dataclasses.replace(prepared.data, data_dir=str(data_dir)))


def _flip(path: Path, byte: int, mask: int) -> None:
    data = bytearray(path.read_bytes())
    data[byte] ^= mask
    path.write_bytes(bytes(data))


def test_a_flipped_bit_in_a_shard_is_refused_by_its_checksum(prepared: Recipe, tmp_path: Path) -> None:
    recipe = _copy_of(prepared, tmp_path)
    _flip(next(Path(recipe.data.data_dir).glob("sources/01-*/train/00001.ds")), byte=10, mask=0x01)  # a valid id
    with pytest.raises(DataMismatchError, match=r"train/00001.ds: SHA-256 .* differs .* meta.json"):
        check_prepared_data(recipe, data_of(recipe))


def test_a_token_past_the_vocabulary_is_refused_with_shard_and_offset(prepared: Recipe, tmp_path: Path) -> None:
    recipe = _copy_of(prepared, tmp_path)
    path = next(Path(recipe.data.data_dir).glob("sources/00-*/validation/00000.ds"))
    _flip(path, byte=2 * 7 + 1, mask=0x80)  # high byte of token 7
    with pytest.raises(
        DataMismatchError,
        match=r"validation/00000.ds: token id \d+ at token 7 \(byte offset 14\) is past "
        r"the vocabulary of 320 tokens",
    ):
        check_prepared_data(recipe, data_of(recipe))


def test_a_recorded_verification_is_trusted_until_the_file_changes(prepared: Recipe, tmp_path: Path) -> None:
    recipe = _copy_of(prepared, tmp_path)
    data_dir = Path(recipe.data.data_dir)
    meta = read_meta(data_dir)
    total = sum(p.stat().st_size for p in data_dir.rglob("*.ds"))
    assert verify_shards(data_dir, meta, trust_recorded=False) == {"hashed": total, "trusted": 0}
    assert verify_shards(data_dir, meta) == {"hashed": 0, "trusted": total}  # what training does at every start
    shard = next(data_dir.glob("sources/00-*/train/00000.ds"))
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 1))
    assert verify_shards(data_dir, meta)["hashed"] == shard.stat().st_size


# ---------------------------------------------------------------------- long documents
def test_long_documents_encode_in_pieces_to_the_same_tokens(prepared: Recipe) -> None:
    backend = load_tokenizer(prepared.data.data_dir).backend_tokenizer
    rng = random.Random(1)
    text = "  ".join(_paragraph(rng) for _ in range(4000)) + "\n\tend   of   text"  # single, double, tab spaces
    pieces = split_long_text(text, piece_chars=5000)
    assert len(pieces) > 20 and "".join(pieces) == text and max(map(len, pieces)) <= 5000
    whole = backend.encode(text, add_special_tokens=False).ids
    assert [i for p in pieces for i in backend.encode(p, add_special_tokens=False).ids] == whole


@pytest.mark.slow
def test_one_huge_line_is_prepared_in_bounded_memory(tmp_path: Path) -> None:
    """20 MB on one line: encoded whole, the Rust pre-tokenizer alone would hold about 2.2 GB."""
    rng = random.Random(2)
    words = WORDS + ["café", "東京"]
    (tmp_path / "huge.txt").write_text(" ".join(rng.choices(words, k=3_500_000)), encoding="utf-8")
    (tmp_path / "small.txt").write_text("\n\n".join(_paragraph(rng) for _ in range(200)), encoding="utf-8")
    script = (
        "import resource, sys\n"
        "from hf_pretrain.config import build_recipe\n"
        "from hf_pretrain.data.prepare_run import prepare\n"
        f"raw = {{'data': {{'sources': [{{'kind': 'files', 'paths': [{str(tmp_path / '*.txt')!r}]}}]}}}}\n"
        f"prepare(build_recipe(raw, {{'data_dir': {str(tmp_path / 'data')!r}, 'vocab_size': 300, 'val_every': 2, "
        " 'seq_len': 16, 'micro_batch_size': 2, 'global_batch_tokens': 64}), "
        "log=lambda _: None)\n"
        # This process's own peak (VmHWM: its memory map's high-water mark, new at exec). ru_maxrss is not:
        # Linux carries it over exec from the forking process, here pytest, which earlier tests (a compiled
        # 1b-width model) may have grown past the bound on their own.
        "status = open('/proc/self/status').read() if sys.platform == 'linux' else ''\n"
        "hwm = [line.split()[1] for line in status.splitlines() if line.startswith('VmHWM:')]\n"
        "print(int(hwm[0]) // 1024 if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, OMP_NUM_THREADS="1", RAYON_NUM_THREADS="2"),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    peak_mib = int(result.stdout.split()[-1])
    assert peak_mib < 1600, f"prepare peaked at {peak_mib} MiB"
    assert read_meta(tmp_path / "data")["splits"]["train"]["tokens"] > 3_000_000


# ---------------------------------------------------------------------- bad input to prepare
def _prepare_cli(tmp_path: Path, files: dict[str, bytes], **overrides: Any) -> subprocess.CompletedProcess:
    corpus_dir = tmp_path / "corpus"
    corpus_dir.mkdir()
    for name, data in files.items():
        (corpus_dir / name).write_bytes(data)
    settings = {
        "data_dir": tmp_path / "data",
        "vocab_size": 300,
        "val_every": 2,
        "seq_len": 16,
        "micro_batch_size": 2,
        "global_batch_tokens": 64,
        **overrides,
    }
    args = ["--sources", json.dumps([{"kind": "files", "paths": [str(corpus_dir / "*")]}])]
    for key, value in settings.items():
        args += [f"--{key}", str(value)]
    return cli("prepare", "--recipe", "smoke", *args, cwd=Path.cwd())


def _text(rng: random.Random, paragraphs: int) -> bytes:
    return "\n\n".join(_paragraph(rng) for _ in range(paragraphs)).encode()


def test_a_few_undecodable_bytes_are_replaced_and_named(tmp_path: Path) -> None:
    rng = random.Random(3)
    good = _text(rng, 300)
    result = _prepare_cli(tmp_path, {"a.txt": good[:5000] + b"\xff\xfe" + good[5000:], "b.txt": _text(rng, 300)})
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("a.txt: 2 undecodable bytes replaced by U+FFFD") == 1


def test_a_file_that_is_not_utf8_is_refused_without_a_traceback(tmp_path: Path) -> None:
    rng = random.Random(4)
    latin1 = "\n\n".join(_paragraph(rng) + " café déjà vu à la carte" for _ in range(300)).encode("latin-1")
    result = _prepare_cli(tmp_path, {"a.txt": latin1})
    assert result.returncode == EXIT_CONFIG and "Traceback" not in result.stderr
    assert "a.txt" in result.stderr and "are not valid UTF-8" in result.stderr and "iconv" in result.stderr


def test_an_empty_corpus_is_named_as_such(tmp_path: Path) -> None:
    result = _prepare_cli(tmp_path, {"empty.txt": b"", "blank.jsonl": b""})
    assert result.returncode == EXIT_CONFIG and "Traceback" not in result.stderr
    assert "holds no text: every document in it is empty" in result.stderr and "vocab_size" not in result.stderr


def test_no_validation_tokens_is_refused_naming_val_every(tmp_path: Path) -> None:
    rng = random.Random(5)
    result = _prepare_cli(
        tmp_path,
        {"a.jsonl": "".join(json.dumps({"text": _paragraph(rng) * 20}) + "\n" for _ in range(30)).encode()},
        val_every=1000,
    )
    assert result.returncode == EXIT_CONFIG and "Traceback" not in result.stderr
    assert "no validation tokens" in result.stderr and "lower val_every" in result.stderr
    assert not (tmp_path / "data" / "meta.json").exists()


def test_a_files_source_is_named_by_its_name_else_by_its_files():
    """Issue 38: a files source's `name` was silently ignored; it names its folder and its share's lines."""
    from hf_pretrain.config import SourceConfig
    from hf_pretrain.data.prepared import source_folder_name

    assert source_folder_name(0, SourceConfig(kind="files", name="notes", paths=["/x/a.txt"])) == "00-notes"
    assert source_folder_name(1, SourceConfig(kind="files", paths=["/x/a.txt"])) == "01-a"
    assert source_folder_name(2, SourceConfig(kind="files", paths=["/x/corpus/*.txt"])) == "02-corpus"
