"""`prepare` on datatrove against the tokenizer's own batch encoding, on a corpus large enough that
start-up does not count: per-worker CPU rate, scaling with 1 and 2 workers, an estimate for 20B tokens.

    .venv/bin/python benchmarks/bench_prepare.py                        # ~150 MB (~30M tokens) in 4 jsonl files
    .venv/bin/python benchmarks/bench_prepare.py --corpus-mb 40 --workers 1   # a quicker look

The corpus repeats `../shared/data/text/*` (paragraphs joined into documents of ~3,000+ characters)
into `--files` jsonl files (one datatrove task each). A byte-level BPE is fitted on 2,000 of its
documents beforehand (untimed). Then, each in a fresh process:
  (1) bare: `tokenizers`' `encode_batch_fast` over every document on one core (RAYON_NUM_THREADS=1,
      batches of 1,024 documents, texts loaded beforehand): the ceiling of one worker;
  (2) `prepare()` with `--workers N` local workers, for each N (readers, tokenizer step, `.ds` files,
      checksums, meta.json);
  (3) the same `prepare()` on a corpus of 50 documents: its fixed cost (imports, executor, meta.json).
The robust figures are CPU times: the tasks' own (each datatrove task records its CPU seconds in its
counts file) against the bare encoder's, and the whole command's (os.times of the child) less the
fixed cost. Wall times, and the scaling from 1 to 2 workers, hold only on a machine with idle cores:
the load average is printed with them. The ids written are checked against the tokenizer's on a sample
of documents encoded alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import tokenizers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHARED_TEXT = ROOT.parent / "shared" / "data" / "text"
TARGET_TOKENS = 20e9
DOCUMENT_CHARS = 3000  # paragraphs are joined until a document has at least this many characters
FIT_DOCUMENTS = 2000
BARE_BATCH = 1024  # documents per encode_batch_fast call, as the tokenizer step (pipeline.BATCH_DOCUMENTS)
CHECKED_DOCUMENTS = 300  # per file, encoded alone and looked for in what prepare wrote


def write_corpus(folder: Path, texts_dir: Path, megabytes: float, files: int) -> int:
    """The texts of `texts_dir`, cut into documents, repeated into `files` jsonl files of `megabytes` in all."""
    documents = []
    for path in sorted(p for p in texts_dir.iterdir() if p.is_file()):
        current = ""
        for paragraph in re.split(r"\n\s*\n", path.read_text(errors="replace")):
            current = f"{current}\n\n{paragraph}" if current else paragraph
            if len(current) >= DOCUMENT_CHARS:
                documents.append(current)
                current = ""
        if current.strip():
            documents.append(current)
    folder.mkdir(parents=True)
    outs = [(folder / f"part{k}.jsonl").open("w") for k in range(files)]
    written, count = 0, 0
    while written < megabytes * 1e6:
        line = json.dumps({"text": documents[count % len(documents)]}) + "\n"
        outs[count % files].write(line)
        written += len(line)
        count += 1
    for out in outs:
        out.close()
    return count


def child(code: str, env: dict[str, str] | None = None) -> tuple[dict, float, float]:
    """(its JSON answer, CPU seconds, wall seconds) of `code` run in a fresh Python: the CPU time of it and
    of every process it waited for (os.times of the children)."""
    before, start = os.times(), time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
    )
    wall, after = time.perf_counter() - start, os.times()
    if result.returncode:
        raise SystemExit(f"a measured process failed:\n{result.stdout}\n{result.stderr}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return json.loads(result.stdout.strip().splitlines()[-1]), cpu, wall


def fit_tokenizer(corpus: Path, target: Path, vocab_size: int) -> Path:
    code = f"""
import json
from itertools import islice
from pathlib import Path
from hf_pretrain.data.sources import expand_globs, file_documents
from hf_pretrain.data.tokenizer import save_tokenizer, train_tokenizer
texts = islice(file_documents(expand_globs([{str(corpus / "*.jsonl")!r}]), "text"), {FIT_DOCUMENTS})
save_tokenizer(train_tokenizer(texts, {vocab_size}, []), Path({str(target)!r}))
print(json.dumps({{}}))
"""
    child(code)
    return target / "tokenizer"


def bare(tokenizer_dir: Path, corpus: Path) -> tuple[int, int, float, float]:
    """(documents, tokens, CPU seconds, wall seconds) of encode_batch_fast alone on one core."""
    code = f"""
import json, time
from tokenizers import Tokenizer
from hf_pretrain.data.sources import expand_globs, file_documents
texts = [t for t in file_documents(expand_globs([{str(corpus / "*.jsonl")!r}]), "text") if t]
tok = Tokenizer.from_file({str(tokenizer_dir / "tokenizer.json")!r}); tok.encode_special_tokens = True
tokens, cpu, wall = 0, time.process_time(), time.perf_counter()
for i in range(0, len(texts), {BARE_BATCH}):
    tokens += sum(len(e.ids) for e in tok.encode_batch_fast(texts[i:i + {BARE_BATCH}], add_special_tokens=False))
print(json.dumps([len(texts), tokens, time.process_time() - cpu, time.perf_counter() - wall]))
"""
    (documents, tokens, cpu, wall), _, _ = child(code, {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "true"})
    return documents, tokens, cpu, wall


def run_prepare(files: str, data_dir: Path, tokenizer_dir: Path, vocab_size: int, workers: int) -> dict:
    """One `prepare()` in a fresh process: its CPU and wall seconds, the tasks' CPU seconds and counts."""
    code = f"""
import json
from hf_pretrain.config import build_recipe
from hf_pretrain.data.prepare_run import prepare
recipe = build_recipe(
    {{"data": {{"sources": [{{"kind": "files", "paths": [{files!r}]}}]}}}},
    {{"data_dir": {str(data_dir)!r}, "tokenizer": {str(tokenizer_dir)!r}, "vocab_size": {vocab_size},
      "workers": {workers}, "val_every": 20, "seq_len": 128, "global_batch_tokens": 4096, "micro_batch_size": 16}},
)
prepare(recipe, log=lambda _: None)
print(json.dumps({{}}))
"""
    load = os.getloadavg()[0]
    _, cpu, wall = child(code, {"RAYON_NUM_THREADS": "1"})
    counts = [json.loads(p.read_text()) for p in data_dir.glob("logs/*/counts/*.json")]
    return {
        "cpu": cpu,
        "wall": wall,
        "load": (load + os.getloadavg()[0]) / 2,
        "task_cpu": sum(c["cpu_s"] for c in counts),
        "documents": sum(c["documents"] for c in counts),
        "tokens": sum(c["tokens"] for c in counts) - sum(c["documents"] for c in counts),  # EOS left out
    }


def check_ids(data_dir: Path, corpus: Path, tokenizer_dir: Path) -> int:
    """A sample of each file's documents, encoded alone (+ EOS), are documents prepare wrote for that file."""
    from hf_pretrain.data.prepared import read_meta
    from hf_pretrain.data.sources import file_documents

    meta = read_meta(data_dir)
    backend = tokenizers.Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    backend.encode_special_tokens = True
    checked = 0
    for rank, path in enumerate(sorted(corpus.glob("*.jsonl"))):
        written = set()
        for split in ("train", "validation"):
            name = f"sources/{meta['sources'][0]['name']}/{split}/{rank:05d}.ds"
            tokens = np.fromfile(data_dir / name, dtype=meta["dtype"])
            ends = np.fromfile(data_dir / (name + ".index"), dtype="<u8").astype(np.int64)
            written |= {tuple(tokens[s:e].tolist()) for s, e in zip(np.r_[0, ends[:-1]], ends, strict=True)}
        documents = [t for _, t in zip(range(CHECKED_DOCUMENTS), file_documents([path], "text"), strict=False)]
        for text in documents:
            ids = tuple(backend.encode(text, add_special_tokens=False).ids + [meta["eos_id"]])
            assert ids in written, f"{path}: a document's ids differ from the tokenizer's on it alone"
        checked += len(documents)
    return checked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus-mb", type=float, default=150.0, help="size of the generated jsonl corpus")
    parser.add_argument("--files", type=int, default=4, help="jsonl files (datatrove tasks) it is written into")
    parser.add_argument("--texts", type=Path, default=SHARED_TEXT, help="folder of the texts it repeats")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--vocab-size", type=int, default=8192)
    args = parser.parse_args()
    started = datetime.now().astimezone().isoformat(timespec="seconds")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = root / "corpus"
        write_corpus(corpus, args.texts, args.corpus_mb, args.files)
        small = root / "small"
        small.mkdir()
        first = (corpus / "part0.jsonl").open().readlines()[:50]
        (small / "part0.jsonl").write_text("".join(first))
        tokenizer_dir = fit_tokenizer(corpus, root / "fitted", args.vocab_size)
        documents, tokens, bare_cpu, bare_wall = bare(tokenizer_dir, corpus)
        runs = {}
        for workers in args.workers:
            runs[workers] = run_prepare(
                str(corpus / "*.jsonl"), root / f"w{workers}", tokenizer_dir, args.vocab_size, workers
            )
            assert runs[workers]["tokens"] == tokens, f"prepare wrote {runs[workers]['tokens']} tokens, bare {tokens}"
        fixed = run_prepare(str(small / "*.jsonl"), root / "fixed", tokenizer_dir, args.vocab_size, 1)
        checked = check_ids(root / f"w{args.workers[0]}", corpus, tokenizer_dir)
        size = sum(p.stat().st_size for p in corpus.glob("*.jsonl"))

    cores = os.cpu_count() or 1
    print(f"date      {started}; command: python benchmarks/bench_prepare.py {' '.join(sys.argv[1:])}")
    print(
        f"machine   {cores} CPUs ({len(os.sched_getaffinity(0))} usable), {platform.machine()}, {platform.platform()}, "
        f"Python {platform.python_version()}, tokenizers {tokenizers.__version__}"
    )
    print(
        f"corpus    {args.texts}/* repeated: {size / 1e6:,.0f} MB in {args.files} jsonl files (tasks), "
        f"{documents:,} documents, {tokens:,} tokens (vocab {args.vocab_size})"
    )
    print(f"ids       {checked} documents encoded alone (+ EOS) are among those prepare wrote")
    bare_rate = tokens / bare_cpu
    print(
        f"bare      encode_batch_fast, 1 core: {bare_rate:,.0f} tokens per CPU-second ({tokens / bare_wall:,.0f}/s wall)"
    )
    one = runs[min(runs)]
    for workers, run in runs.items():
        task_rate = tokens / run["task_cpu"]
        # with workers, datatrove's pool runs under a forkserver this process never waits for: its CPU
        # time is not in os.times, so the tasks' own counts are the measure
        whole = f"whole command {run['cpu']:,.1f} CPU-s, " if workers == 1 else ""
        print(
            f"prepare   {workers} worker(s): tasks {task_rate:,.0f} tokens per CPU-second = {task_rate / bare_rate:.2f} "
            f"of bare ({run['task_cpu']:,.1f} CPU-s); {whole}{run['wall']:,.1f} s wall, {tokens / run['wall']:,.0f} "
            f"tokens/s wall (load average {run['load']:.1f} on {cores} CPUs)"
        )
    print(
        f"start-up  the fixed cost of a prepare (50 documents): {fixed['cpu']:,.1f} CPU-s = "
        f"{fixed['cpu'] / one['cpu']:.0%} of the {min(runs)}-worker run"
    )
    marginal = tokens / (one["cpu"] - fixed["cpu"])  # per CPU-second of a worker, reading and writing included
    if len(runs) > 1:
        most = max(runs)
        scaling = one["wall"] / runs[most]["wall"]
        busy = max(r["load"] for r in runs.values()) > cores - most
        print(
            f"scaling   {most} workers: {scaling:.2f}x the wall rate of {min(runs)}"
            + (
                f" -- NOT a scaling figure: the load average ({max(r['load'] for r in runs.values()):.1f}) leaves "
                f"fewer than {most} idle cores of {cores}; measure on an idle machine"
                if busy
                else ""
            )
        )
    core_hours = TARGET_TOKENS / marginal / 3600
    print(
        f"estimate  20B tokens at {marginal:,.0f} tokens per CPU-second (the {min(runs)}-worker run less its fixed "
        f"cost): {core_hours:,.1f} core-hours of tokenizing; if workers scale linearly (datatrove tasks share "
        f"nothing but the disk), {core_hours / 16 * 60:,.0f} min on one 16-core machine, "
        f"{core_hours / 512 * 60:,.1f} min of CPU on 8 Slurm nodes x 64 cores, where reading ~{20e9 * size / tokens / 1e9:,.0f} "
        f"GB and writing ~40 GB (uint16) is the likelier limit. An estimate: "
        + ("the scaling above is its only measure" if len(runs) > 1 else "no scaling was measured")
    )


if __name__ == "__main__":
    main()
