"""Every throughput the project states for a named GPU is physically possible (issue 26).

A sentence of README.md, docs/*.md or a recipe that gives tokens/s, seconds per step, or the time of
a save interval on an A100, H100, ... implies a rate of tokens per second; at most that GPU's dense
bf16 peak (machine/gpus.yaml) over the model's training FLOPs per token (model.py: 6N plus
attention) can be processed, i.e. 100% MFU. A recipe's sentence is held to its own model; any other
to the smallest of the GPU recipes' models (the most lenient bound). Two sentences broke this before:
the recipes' "~25 minutes of A100 time" per 1,000 steps (87,000 tokens/s, 197% of an A100's peak)
and docs/benchmarks.md's "~2.2 s per 131,072-token step on an A100" (134%).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from hf_pretrain.config import RECIPES_DIR, load_recipe
from hf_pretrain.machine.gpus import find_gpu, gpu_table
from hf_pretrain.model.llama import model_flops_per_token
from tests.helpers import ROOT

# every way the table lets a GPU be named (its names and their match words), the longest first
GPU_NAMES = {name for gpu in gpu_table().values() for name in (gpu.name, *gpu.match)}
GPU = "|".join(r"\b" + re.escape(name) + r"\b" for name in sorted(GPU_NAMES, key=len, reverse=True))
NUMBER = r"(\d[\d,]*(?:\.\d+)?)"
TOKENS_PER_S = re.compile(NUMBER + r"\s*([KM])?\s*(?:tokens|tok)/s")
SECONDS_PER_STEP = re.compile(NUMBER + r"\s*s(?:/step|\s+per\s+(?:[\d,]+-token\s+)?step|\s+on\s+an?\s+(?=" + GPU + "))")
DURATION = re.compile(NUMBER + r"\s*(minutes|hours?)\b")
GPU_NAME = re.compile(GPU)
STEP_TOKENS = re.compile(r"([\d,]+)-token step|(\d+)K tokens")
SCALE = {"": 1, "K": 1e3, "M": 1e6}


@dataclass
class Claim:
    where: str
    sentence: str
    gpu: str
    tokens_per_s: float


def number(text: str) -> float:
    return float(text.replace(",", ""))


def sentences(path: Path) -> list[str]:
    """A recipe's lines; a page's sentences (paragraphs joined, then cut at '. ')."""
    text = path.read_text()
    if path.suffix == ".yaml":
        return text.splitlines()
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    return [s for p in paragraphs for s in re.split(r"(?<=[.;])\s+(?=[A-Z(`~])", p)]


def nearest_gpu(sentence: str, figure: re.Match) -> str | None:
    """The GPU a figure is about: the name nearest to it in the sentence (from its end to a name after
    it, from its start to a name before it)."""
    distances = [
        (m.start() - figure.end() if m.start() >= figure.end() else figure.start() - m.end(), m.group())
        for m in GPU_NAME.finditer(sentence)
    ]
    return min(distances)[1] if distances else None


def claims_in(path: Path, step_tokens: int, recipe_step_tokens: int | None) -> list[Claim]:
    where = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    found = []
    for sentence in sentences(path):
        if not GPU_NAME.search(sentence):
            continue
        for m in TOKENS_PER_S.finditer(sentence):
            if gpu := nearest_gpu(sentence, m):
                found.append(Claim(where, sentence, gpu, number(m.group(1)) * SCALE[m.group(2) or ""]))
        if "step" in sentence:
            tokens = STEP_TOKENS.search(sentence)
            per_step = (
                (number(tokens.group(1)) if tokens.group(1) else number(tokens.group(2)) * 1e3)
                if tokens
                else step_tokens
            )
            for m in SECONDS_PER_STEP.finditer(sentence):
                if gpu := nearest_gpu(sentence, m):
                    found.append(Claim(where, sentence, gpu, per_step / number(m.group(1))))
        interval = re.match(r"\s*save_interval:\s*(\d+)", sentence)
        if interval and recipe_step_tokens:
            for m in DURATION.finditer(sentence):
                seconds = number(m.group(1)) * (60 if m.group(2) == "minutes" else 3600)
                if gpu := nearest_gpu(sentence, m):
                    found.append(Claim(where, sentence, gpu, int(interval.group(1)) * recipe_step_tokens / seconds))
    return found


def gpu_recipes() -> dict[str, object]:
    """The shipped recipes meant for a GPU (their description names one)."""
    recipes = {p.stem: load_recipe(p.stem) for p in RECIPES_DIR.glob("*.yaml")}
    return {name: r for name, r in recipes.items() if GPU_NAME.search(r.description)}


def stated_claims() -> list[tuple[Claim, float]]:
    """Every claim with the FLOPs per token it is held to."""
    recipes = gpu_recipes()
    flops = {name: model_flops_per_token(r.model, r.data)[1] for name, r in recipes.items()}
    lenient = min(flops.values())
    step_tokens = min(r.train.global_batch_tokens for r in recipes.values())
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(RECIPES_DIR.glob("*.yaml"))]:
        recipe = load_recipe(path.stem) if path.suffix == ".yaml" else None
        for claim in claims_in(path, step_tokens, recipe.train.global_batch_tokens if recipe else None):
            out.append((claim, flops.get(path.stem, lenient) if recipe else lenient))
    return out


def test_the_extractor_reads_the_figures_it_must(tmp_path):
    """The test below is not vacuous: it finds the sentences known to state GPU throughputs."""
    found = {(c.where, c.gpu) for c, _ in stated_claims()}
    assert ("recipes/1b.yaml", "A100") in {(w.replace("hf_pretrain/", ""), g) for w, g in found}
    assert any(w == "docs/benchmarks.md" for w, _ in found)
    assert ("docs/multinode.md", "H100") in found and ("docs/multinode.md", "A100") in found
    assert any(w == "docs/gpu.md" and g == "H100" for w, g in found)
    old = tmp_path / "1b.yaml"  # the sentence the recipes had
    old.write_text("  save_interval: 1000           # ~25 minutes of A100 time between checkpoints\n")
    (claim,) = claims_in(old, 131072, 131072)
    assert claim.gpu == "A100" and claim.tokens_per_s == pytest.approx(1000 * 131072 / 1500)


def test_every_throughput_stated_for_a_gpu_is_at_most_its_bf16_peak():
    impossible = []
    for claim, flops_per_token in stated_claims():
        peak = find_gpu(claim.gpu).bf16_flops
        mfu = claim.tokens_per_s * flops_per_token / peak
        if mfu > 1.0:
            impossible.append(
                f"{claim.where}: {claim.tokens_per_s:,.0f} tokens/s on an {claim.gpu} is {mfu:.0%} of its "
                f"bf16 peak: {claim.sentence.strip()[:160]}"
            )
    assert not impossible, "\n".join(impossible)
