"""The run folder: every file name in it, and the JSON-lines records it keeps.

    runs/NAME/
      resolved_recipe.yaml   the recipe as run (CLI overrides applied)
      metrics.jsonl          one record per log line, evaluation, skipped step or spike
      samples.jsonl          greedy completions of the fixed prompts at every evaluation
      benchmarks.jsonl       lm-eval scores of checkpoints, when asked
      phases.json / .md      cost per loss point of each named phase
      checkpoints/step_N/    resumable training states (training/checkpoint.py)
      final/                 the last checkpoint exported as a Hugging Face model folder

Training writes it; export, the report, the demo and the doctor read it. Nobody spells these
names anywhere else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hf_pretrain.config import Recipe

# final/ is exported in full precision: the disk check and the export must agree on its size.
FINAL_DTYPE = "fp32"


class RunDir:
    """Paths of one run folder: `RunDir("runs/1b").metrics` is `runs/1b/metrics.jsonl`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def resolved_recipe(self) -> Path:
        return self.path / "resolved_recipe.yaml"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def samples(self) -> Path:
        return self.path / "samples.jsonl"

    @property
    def benchmarks(self) -> Path:
        return self.path / "benchmarks.jsonl"

    @property
    def phases_json(self) -> Path:
        return self.path / "phases.json"

    @property
    def phases_md(self) -> Path:
        return self.path / "phases.md"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def final(self) -> Path:
        return self.path / "final"

    def is_run(self) -> bool:
        return self.checkpoints.is_dir() or self.resolved_recipe.is_file()

    def load_recipe(self) -> Recipe | None:
        """The recipe this run was started with, typed; None when the folder has none, or has one this
        version of hf-pretrain no longer reads (a renamed key): the report, the card and the demo then
        do without it rather than fail on an old run."""
        from hf_pretrain.config import RecipeError, load_recipe  # imported late: run_dir stays importable alone

        if not self.resolved_recipe.is_file():
            return None
        try:
            return load_recipe(str(self.resolved_recipe))
        except RecipeError:
            return None


class JsonlWriter:
    """Appends one JSON record per line; only the main process writes."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path = path
        self.enabled = enabled

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_jsonl(path: Path, after_step: int) -> None:
    """Drop records past `after_step`: a resumed run rewrites them, so the file stays one clean curve."""
    records = read_jsonl(path)
    kept = [r for r in records if r.get("step", 0) <= after_step]
    if len(kept) != len(records):
        path.write_text("".join(json.dumps(r) + "\n" for r in kept))
