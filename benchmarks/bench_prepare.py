"""`prepare` on datatrove against the tokenizer's own batch encoding, per worker and with 2 workers.

    .venv/bin/python benchmarks/bench_prepare.py                        # the built-in corpus, in 4 jsonl files
    .venv/bin/python benchmarks/bench_prepare.py --files '../shared/data/text/*.txt' --workers 1 2 4

Measures, on the same documents and the same tokenizer (fitted beforehand, untimed):
  (1) `tokenizers`' `encode_batch_fast` over all documents on one core (RAYON_NUM_THREADS=1), the
      ceiling of one worker;
  (2) `prepare()` with `--workers N` local datatrove workers (one task per file; the whole command:
      readers, tokenizer step, `.ds` files, checksums, meta.json), for each N;
and checks that the ids written are those of the tokenizer run on each document alone (+ EOS).
Each figure is the best of `--repeat` runs. From them, an estimate of the hours 20B tokens take on
a 16-core machine and on 8 Slurm nodes of 64 cores (per-worker rate x cores x the measured scaling).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["RAYON_NUM_THREADS"] = "1"  # one core per worker: the per-worker figure is per core

import numpy as np  # noqa: E402
import tokenizers  # noqa: E402

from hf_pretrain.config import (
    SourceConfig,  # noqa: E402
    build_recipe,  # noqa: E402
)
from hf_pretrain.data import load_tokenizer, prepare, read_meta  # noqa: E402
from hf_pretrain.data.sources import expand_globs, file_documents, iter_source  # noqa: E402

TARGET_TOKENS = 20e9


def write_builtin_corpus(folder: Path, files: int) -> list[str]:
    """The built-in corpus (python-docs + python-stdlib) dealt round-robin into `files` jsonl files."""
    texts = [t for name in ("python-docs", "python-stdlib") for t in iter_source(SourceConfig("builtin", name))]
    folder.mkdir(parents=True)
    for k in range(files):
        with (folder / f"part{k}.jsonl").open("w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts[k::files])
    return [str(folder / "*.jsonl")]


def recipe_for(files: list[str], data_dir: Path, tokenizer: str, vocab_size: int, workers: int):
    return build_recipe(
        {"data": {"sources": [{"kind": "files", "paths": files}]}},
        {"data_dir": str(data_dir), "tokenizer": tokenizer, "vocab_size": vocab_size, "workers": workers},
    )


def bare_one_core(tokenizer_file: Path, files: list[str], repeat: int) -> tuple[float, int]:
    """(tokens/s, tokens) of encode_batch_fast on one core, in a fresh process (Rayon reads its
    thread count once)."""
    code = f"""
import json, time
from tokenizers import Tokenizer
from hf_pretrain.data.sources import expand_globs, file_documents
texts = [t for t in file_documents(expand_globs({files!r}), "text") if t]
tok = Tokenizer.from_file({str(tokenizer_file)!r}); tok.encode_special_tokens = True
best = float("inf")
for _ in range({repeat}):
    start = time.perf_counter(); out = tok.encode_batch_fast(texts, add_special_tokens=False)
    best = min(best, time.perf_counter() - start)
print(json.dumps([sum(len(e.ids) for e in out), best]))
"""
    env = dict(os.environ, RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="true")
    tokens, seconds = json.loads(
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    )
    return tokens / seconds, tokens


def check_ids(data_dir: Path, files: list[str]) -> int:
    """Every document's ids in the `.ds` files equal the tokenizer's on that document alone, + EOS."""
    meta = read_meta(data_dir)
    backend = load_tokenizer(data_dir).backend_tokenizer
    backend.encode_special_tokens = True
    eos = meta["eos_id"]
    written: dict[str, list[int]] = {}
    for split in ("train", "validation"):
        for entry in meta["sources"][0]["splits"][split]["files"]:
            tokens = np.fromfile(data_dir / entry["file"], dtype=meta["dtype"])
            ends = np.fromfile(data_dir / (entry["file"] + ".index"), dtype="<u8").astype(np.int64)
            starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
            written.setdefault(Path(entry["file"]).name, []).extend(
                tokens[s:e].tolist() for s, e in zip(starts, ends, strict=True)
            )
    checked = 0
    for rank, path in enumerate(expand_globs(files)):
        documents = [t for t in file_documents([path], "text") if t]
        expected = {tuple(backend.encode(t, add_special_tokens=False).ids + [eos]) for t in documents}
        got = {tuple(ids) for ids in written[f"{rank:05d}.ds"]}
        assert got == expected, f"{path}: the ids written differ from the tokenizer's on each document alone"
        checked += len(documents)
    return checked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", nargs="*", default=[], help="globs of .txt/.jsonl/.parquet files (one task each)")
    parser.add_argument("--split-into", type=int, default=4, help="files the built-in corpus is dealt into")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = args.files or write_builtin_corpus(root / "corpus", args.split_into)
        # Fitted once (untimed); every timed prepare loads this tokenizer by path.
        prepare(recipe_for(files, root / "fitted", "train", args.vocab_size, 1), log=lambda _: None)
        tokenizer_dir = root / "fitted" / "tokenizer"
        bare, tokens = bare_one_core(tokenizer_dir / "tokenizer.json", files, args.repeat)
        rates, run = {}, 0
        for workers in args.workers:
            best = float("inf")
            for _ in range(args.repeat):
                run += 1
                recipe = recipe_for(files, root / f"run{run}", str(tokenizer_dir), args.vocab_size, workers)
                start = time.perf_counter()
                prepare(recipe, log=lambda _: None)
                best = min(best, time.perf_counter() - start)
            meta = read_meta(root / f"run{run}")
            written = sum(s["tokens"] - s["documents"] for s in meta["splits"].values())
            assert written == tokens, f"prepare wrote {written} document tokens, the bare tokenizer {tokens}"
            rates[workers] = tokens / best
        checked = check_ids(root / f"run{run}", files)
        tasks = len(expand_globs(files))

    print(f"date      {datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(
        f"hardware  {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), {platform.machine()}, "
        f"{platform.platform()}, Python {platform.python_version()}, tokenizers {tokenizers.__version__}"
    )
    corpus = ", ".join(args.files) if args.files else f"builtin python-docs + python-stdlib in {tasks} jsonl files"
    print(f"corpus    {corpus}: {tasks} tasks, {tokens:,} tokens (vocab {args.vocab_size}); best of {args.repeat}")
    print(f"ids       {checked:,} documents: the ids written equal the tokenizer's on each document alone")
    print(f"bare encode_batch_fast, 1 core   {bare:>12,.0f} tokens/s")
    for workers, rate in rates.items():
        print(
            f"prepare, {workers} worker(s)           {rate:>12,.0f} tokens/s  "
            f"({rate / workers / bare:.2f} of the bare rate per worker)"
        )
    per_worker = rates[min(rates)] / min(rates)
    scaling = rates[max(rates)] / (per_worker * max(rates)) if len(rates) > 1 else 1.0
    for name, cores in (("one 16-core machine", 16), ("8 Slurm nodes x 64 cores", 512)):
        hours = TARGET_TOKENS / (per_worker * cores * scaling) / 3600
        print(f"estimate  20B tokens on {name}: {hours:,.1f} h (per-worker rate x {cores} x scaling {scaling:.2f})")


if __name__ == "__main__":
    main()
