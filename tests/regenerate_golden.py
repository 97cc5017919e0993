"""The golden-loss run, and re-recording it after a deliberate change to the math.

    python -m tests.regenerate_golden            # re-record tests/assets/golden_smoke_losses.json
    python -m tests.regenerate_golden --corpus   # also rewrite tests/assets/golden_corpus.jsonl first

The golden run is the `smoke` model with the short schedule (tests.helpers.SHORT_RUN), trained on
tests/assets/golden_corpus.jsonl instead of the built-in corpus: the standard library's docs and
sources differ between Python versions, this file does not, so the curve can be compared anywhere.
The corpus is generated here from a seeded `random.Random` (Mersenne Twister, the same stream on
every platform) and shipped, so the test never depends on regenerating it.
"""

from __future__ import annotations

import hashlib
import json
import platform
import random
import sys
import tempfile
from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
GOLDEN = ASSETS / "golden_smoke_losses.json"
CORPUS = ASSETS / "golden_corpus.jsonl"

# ---------------------------------------------------------------------- the corpus
# Four kinds of small documents with structure a tiny model starts to pick up within 12 steps
# (templated sentences, arithmetic, code, a glossary of made-up words). The made-up words and the
# three-digit numbers give the byte-level BPE enough distinct strings to learn all 4096 tokens of
# the smoke recipe's vocabulary from 170 KB of text.
_NAMES = [
    "Ada",
    "Bram",
    "Cleo",
    "Dov",
    "Esme",
    "Finn",
    "Gus",
    "Hana",
    "Ivo",
    "Juno",
    "Kai",
    "Lena",
    "Milo",
    "Nia",
    "Otto",
    "Pia",
]
_THINGS = ["apple", "stone", "shell", "coin", "lamp", "book", "kite", "cup", "key", "seed", "map", "bell"]
_COLOURS = ["red", "blue", "green", "white", "black", "golden", "grey", "yellow"]
_PLACES = ["garden", "harbour", "market", "library", "forest", "kitchen", "station", "tower"]
_VERBS = ["found", "lost", "carried", "painted", "sold", "hid", "counted", "cleaned"]
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def _story(rng: random.Random) -> str:
    giver, taker = rng.sample(_NAMES, 2)
    lines = []
    for _ in range(rng.randint(4, 9)):
        n = rng.randint(2, 9)
        who, thing = rng.choice(_NAMES), rng.choice(_THINGS)
        lines.append(f"{who} {rng.choice(_VERBS)} {n} {rng.choice(_COLOURS)} {thing}s in the {rng.choice(_PLACES)}.")
    lines.append(f"Then {giver} gave {taker} the last {rng.choice(_THINGS)}.")
    return " ".join(lines)


def _arithmetic(rng: random.Random) -> str:
    rows = []
    for _ in range(rng.randint(6, 14)):
        a, b = rng.randint(0, 999), rng.randint(0, 99)
        op = rng.choice("+-*")
        value = a + b if op == "+" else a - b if op == "-" else a * b
        rows.append(f"{a} {op} {b} = {value}")
    return "\n".join(rows)


def _code(rng: random.Random) -> str:
    name, k, op = rng.choice(_THINGS), rng.randint(1, 9), rng.choice(["+", "-", "*"])
    return "\n".join(
        [
            f"def scale_{name}(x):",
            f"    return x {op} {k}",
            "",
            "",
            f"def count_{name}s(items):",
            "    total = 0",
            "    for item in items:",
            f'        if item == "{name}":',
            "            total += 1",
            "    return total",
            "",
        ]
    )


def _glossary(rng: random.Random, words: list[str]) -> str:
    return " ".join(
        f"In the old tongue, {rng.choice(words)} means a {rng.choice(_COLOURS)} {rng.choice(_THINGS)} "
        f"from the {rng.choice(_PLACES)}."
        for _ in range(rng.randint(5, 10))
    )


def corpus_documents(seed: int = 0, documents: int = 600) -> list[str]:
    rng = random.Random(seed)
    words = sorted({"".join(rng.choices(_SYLLABLES, k=rng.randint(2, 4))) for _ in range(1500)})
    kinds = [_story, _arithmetic, _code, lambda r: _glossary(r, words)]
    return [rng.choice(kinds)(rng) for _ in range(documents)]


def write_corpus(path: Path = CORPUS) -> None:
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in corpus_documents()), encoding="utf-8")


# ---------------------------------------------------------------------- the run
def golden_overrides(data_dir: Path) -> dict:
    """Recipe overrides for `prepare` and training beyond SHORT_RUN: the shipped corpus as the only source."""
    return {"data_dir": str(data_dir), "sources": json.dumps([{"kind": "files", "paths": [str(CORPUS)]}])}


def prepare_golden_data(data_dir: Path) -> None:
    from hf_pretrain.config import load_recipe
    from hf_pretrain.data.prepare_run import prepare

    overrides = golden_overrides(data_dir)
    prepare(load_recipe("smoke", {**overrides, "sources": json.loads(overrides["sources"])}), log=lambda _: None)


def train_losses(run_dir: Path) -> list[float]:
    from hf_pretrain.run_folder.run_dir import read_jsonl

    return [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def golden_losses(workdir: Path) -> list[float]:
    """Prepare the corpus into `workdir`, train the short smoke schedule on it, return the train losses."""
    from tests.helpers import launch_training

    data_dir, run_dir = workdir / "data", workdir / "run"
    if not (data_dir / "meta.json").exists():
        prepare_golden_data(data_dir)
    overrides = golden_overrides(data_dir)
    launch_training(data_dir, run_dir, sources=overrides["sources"])
    return train_losses(run_dir)


def main() -> None:
    import torch

    from tests.helpers import SHORT_RUN

    if "--corpus" in sys.argv[1:]:
        write_corpus()
    with tempfile.TemporaryDirectory() as tmp:
        losses = golden_losses(Path(tmp))
    GOLDEN.write_text(
        json.dumps(
            {
                "recipe": "smoke",
                "overrides": SHORT_RUN,
                "corpus": CORPUS.name,
                "corpus_sha256": hashlib.sha256(CORPUS.read_bytes()).hexdigest(),
                "recorded_with": {
                    "python": platform.python_version(),
                    "torch": torch.__version__,
                    "machine": platform.machine(),
                },
                "losses": losses,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {GOLDEN}: {losses}")


if __name__ == "__main__":
    main()
