"""How close `prepare` comes to the bare tokenizer's speed on the same documents.

    .venv/bin/python benchmarks/bench_prepare.py                                   # python-docs + python-stdlib
    .venv/bin/python benchmarks/bench_prepare.py --files '../shared/data/text/*.txt'

Measures (1) the bare `encode_batch` rate over all documents in one call and (2) the whole
`prepare()` (read sources, mix, tokenize, write shards and meta.json) into a temporary folder,
with a tokenizer trained beforehand so that training is not timed. Both rates count document
tokens only (not the EOS separators). Each figure is the best of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import tokenizers  # noqa: E402

from hf_pretrain.config import Recipe, build_recipe  # noqa: E402
from hf_pretrain.data import load_tokenizer, prepare, read_meta  # noqa: E402
from hf_pretrain.data.sources import mixture  # noqa: E402


def bench_recipe(files: list[str], data_dir: Path, tokenizer: str, vocab_size: int) -> Recipe:
    if files:
        sources: list[dict[str, Any]] = [{"kind": "files", "paths": files}]
    else:
        sources = [{"kind": "builtin", "name": "python-docs"}, {"kind": "builtin", "name": "python-stdlib"}]
    return build_recipe(
        {"data": {"sources": sources}}, {"data_dir": str(data_dir), "tokenizer": tokenizer, "vocab_size": vocab_size}
    )


def best_seconds(run: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--files", nargs="*", default=[], help="globs of .txt/.jsonl/.parquet files (default: built-in corpus)"
    )
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # Train once (untimed); every timed prepare then loads this tokenizer by path.
        prepare(bench_recipe(args.files, root / "trained", "train", args.vocab_size), log=lambda _: None)
        tokenizer_dir = root / "trained" / "tokenizer"
        recipe = bench_recipe(args.files, root / "run", str(tokenizer_dir), args.vocab_size)
        texts = [text for _, text in mixture(recipe)]
        backend = load_tokenizer(root / "trained").backend_tokenizer
        tokens = sum(len(e.ids) for e in backend.encode_batch(texts, add_special_tokens=False))

        bare = {}
        for name in ("encode_batch", "encode_batch_fast"):
            if hasattr(backend, name):
                encode = getattr(backend, name)
                bare[name] = best_seconds(lambda: encode(texts, add_special_tokens=False), args.repeat)  # noqa: B023

        runs = iter(range(args.repeat))

        def prepare_fresh() -> None:
            prepare(
                bench_recipe(args.files, root / f"run{next(runs)}", str(tokenizer_dir), args.vocab_size),
                log=lambda _: None,
            )

        prepared = best_seconds(prepare_fresh, args.repeat)
        meta = read_meta(root / "run0")
        written = sum(s["tokens"] - s["documents"] for s in meta["splits"].values())
        assert written == tokens, f"prepare wrote {written} document tokens, the bare tokenizer {tokens}"

    corpus = ", ".join(args.files) if args.files else "builtin python-docs + python-stdlib"
    print(f"date      {datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(
        f"hardware  {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), {platform.machine()}, "
        f"{platform.platform()}, Python {platform.python_version()}, tokenizers {tokenizers.__version__}"
    )
    print(
        f"corpus    {corpus}: {len(texts):,} documents, {sum(map(len, texts)):,} characters, {tokens:,} tokens "
        f"(vocab {args.vocab_size}); best of {args.repeat}"
    )
    for name, seconds in bare.items():
        print(f"bare {name:<18} {tokens / seconds:>14,.0f} tokens/s")
    print(f"prepare()               {tokens / prepared:>14,.0f} tokens/s")
    for name, seconds in bare.items():
        print(f"ratio prepare / {name:<18} {seconds / prepared:.2f}")


if __name__ == "__main__":
    main()
