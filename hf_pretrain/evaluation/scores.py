"""lm-eval results as scores: acc and acc_norm with their stderr, set beside reference models
(eval/reference_scores.yaml) metric for metric, and turned into model-index entries for the card."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import EvalResult

EVAL_DIR = Path(__file__).resolve().parent / "assets"  # the top-level eval/ folder links here
REFERENCE_SCORES = EVAL_DIR / "reference_scores.yaml"
# The metrics the suite compares; everything else lm-eval reports stays in results.json.
METRICS = ("acc", "acc_norm")
LM_EVAL_URL = "https://github.com/EleutherAI/lm-evaluation-harness"
_METRIC_NAMES = {"acc": "accuracy", "acc_norm": "length-normalised accuracy"}


@dataclass(frozen=True)
class Score:
    task: str  # the task as run, e.g. arc_easy_local
    compares_to: str  # the lm-eval task whose published scores apply, e.g. arc_easy
    metric: str  # acc or acc_norm
    value: float  # percent
    stderr: float | None
    num_fewshot: int
    samples: int | None  # documents scored (fewer than the split with --limit)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def scores_from_results(results: dict[str, Any]) -> list[Score]:
    """acc and acc_norm of every task in `lm_eval.simple_evaluate`'s results, in percent."""
    scores = []
    for task, metrics in results["results"].items():
        metadata = results.get("configs", {}).get(task, {}).get("metadata") or {}
        for metric in METRICS:
            value = _number(metrics.get(f"{metric},none"))
            if value is None:
                continue
            stderr = _number(metrics.get(f"{metric}_stderr,none"))
            scores.append(
                Score(
                    task,
                    metadata.get("same_as", task),
                    metric,
                    100 * value,
                    None if stderr is None else 100 * stderr,
                    int(results.get("n-shot", {}).get(task, 0)),
                    results.get("n-samples", {}).get(task, {}).get("effective"),
                )
            )
    return scores


def load_references(path: Path = REFERENCE_SCORES) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


# What guessing scores on the multiple-choice tasks (one over the number of choices; ARC has four for
# nearly every question), by the lm-eval task a score compares to. Tasks not listed have no chance level.
CHANCE = {
    **dict.fromkeys(("arc_easy", "arc_challenge", "hellaswag", "openbookqa"), 0.25),
    **dict.fromkeys(("piqa", "winogrande", "boolq"), 0.5),
}
CHANCE_NOTE = (
    "(chance): within two binomial standard deviations of guessing (25% with four choices, 50% with two) "
    "for the number of documents scored: no sign that the model beats a guess, whatever stands beside it."
)


def within_chance(score: Score) -> bool:
    """Whether `score` is within 2 sigma of guessing, sigma = sqrt(p (1 - p) / n) over its n documents
    (accuracy of n independent guesses at p is binomial)."""
    p = CHANCE.get(score.compares_to)
    if p is None or not score.samples:
        return False
    return abs(score.value / 100 - p) <= 2 * math.sqrt(p * (1 - p) / score.samples)


def _format(value: float | None, stderr: float | None = None) -> str:
    if value is None:
        return "—"
    return f"{value:.2f} ± {stderr:.2f}" if stderr is not None else f"{value:.2f}"


def comparison_table(scores: list[Score], references: dict[str, Any], limit: int | float | None = None) -> str:
    """Markdown: one row per task and metric, this model beside each reference's number for that very
    task and metric (a blank where a reference has none, never a number of another metric)."""
    shots = {s.num_fewshot for s in scores}
    # References are for one protocol (zero-shot); beside a few-shot run they would mislead.
    models = references["models"] if shots <= {references.get("num_fewshot", 0)} else []
    lines = [
        "| task | metric | this model | " + " | ".join(m["name"] for m in models) + " |",
        "|---|---|---|" + "---|" * len(models),
    ]
    for s in scores:
        refs = [_format((m["scores"].get(s.compares_to) or {}).get(s.metric)) for m in models]
        mine = _format(s.value, s.stderr) + (" (chance)" if within_chance(s) else "")
        lines.append(f"| {s.task} | {s.metric} | {mine} | " + " | ".join(refs) + " |")
    notes = [
        "",
        f"Percent, {', '.join(sorted(f'{k}-shot' for k in shots))}; this model's numbers carry their "
        f"standard error. acc_norm normalises each answer's log-likelihood by its length.",
    ]
    if any(within_chance(s) for s in scores):
        notes.append(CHANCE_NOTE)
    if limit:
        notes.append(
            f"This model was scored on the first {limit} documents of each task (`--limit`), the "
            f"references on the whole split."
        )
    if not models and scores:
        notes.append(
            f"Reference numbers are {references.get('num_fewshot', 0)}-shot, so they are not shown "
            f"beside a run with another number of shots."
        )
    notes += [f"- {m['name']}: {m['source']}" for m in models]
    return "\n".join(lines + notes) + "\n"


def eval_results(scores: list[Score], results: dict[str, Any], limit: int | float | None = None) -> list[EvalResult]:
    """model-index entries for the card, one per task and metric."""
    entries = []
    for s in scores:
        config = results.get("configs", {}).get(s.task, {})
        metadata = config.get("metadata") or {}
        args: dict[str, Any] = {"num_few_shot": s.num_fewshot}
        if limit:
            args["limit"] = limit
        entries.append(
            EvalResult(
                task_type="text-generation",
                task_name="Text Generation",
                dataset_type=metadata.get("hub_dataset") or config.get("dataset_path") or s.compares_to,
                dataset_name=f"{s.compares_to} ({s.num_fewshot}-shot)",
                dataset_config=metadata.get("hub_config") or config.get("dataset_name"),
                dataset_split=config.get("test_split") or config.get("validation_split"),
                dataset_args=args,
                metric_type=s.metric,
                metric_value=round(s.value, 2),
                metric_name=_METRIC_NAMES[s.metric] + (f" (first {limit} examples)" if limit else ""),
                source_name="lm-evaluation-harness (hf-pretrain eval)",
                source_url=LM_EVAL_URL,
            )
        )
    return entries


# A path of this machine inside a longer text: a `/` that starts neither a word's part (`and/or`, `1/2`)
# nor a URL's (`https://`), then folders, then the name kept.
_EMBEDDED_PATH = re.compile(r"(?<![\w:/.])(?:/[\w.+@~-]+)+/([\w.+@~-]+)")


def without_local_paths(value: Any) -> Any:
    """`value` (lm-eval's results, JSON-like) with every absolute path of this machine replaced by its
    file name: results.json sits in the folder a user pushes, which may hold no local path (the ARC
    files under --data_dir, the temporary task files, the model folder)."""
    if isinstance(value, dict):
        return {key: without_local_paths(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [without_local_paths(item) for item in value]
    if isinstance(value, str):
        return _EMBEDDED_PATH.sub(r"\1", value)
    return value
