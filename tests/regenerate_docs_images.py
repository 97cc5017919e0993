"""The pictures of the documentation, drawn from a real run's records.

    python -m tests.regenerate_docs_images              # redraw docs/images/*.png from tests/assets/smoke_run/
    python -m tests.regenerate_docs_images runs/smoke   # first copy a new run's records into tests/assets/smoke_run/

The front page and docs/costs.md show what `hf-pretrain report` draws for a real `make smoke` run: loss
against dollars with its phases shaded, and what each phase paid for a unit of loss, with the phase table
beside them. The run's records (metrics.jsonl, resolved_recipe.yaml, phases.json: 30 KB) are kept in
tests/assets/smoke_run/ so that tests/test_docs.py can draw the pictures again and check that the committed
ones are what the product draws today. The smoke recipe is free (it runs on your CPU), so the pictures
price it at PRICE_PER_HOUR, said as such wherever they are shown: at $1 an hour, dollars read as hours.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from hf_pretrain.economics.cost import markdown_table
from hf_pretrain.run_commands.report import load_run, plot_cost_per_loss_point, plot_run_loss

ROOT = Path(__file__).resolve().parents[1]
RUN_RECORDS = Path(__file__).parent / "assets" / "smoke_run"
IMAGES = ROOT / "docs" / "images"
RECORD_FILES = ("metrics.jsonl", "resolved_recipe.yaml", "phases.json")
PRICE_PER_HOUR = 1.0  # illustrative: the smoke recipe's own price is 0
PICTURES = ("smoke_loss_vs_dollars.png", "smoke_cost_per_loss_point.png")


def draw(records: Path, into: Path) -> str:
    """The pictures of `records` (a run folder) into `into`; returns the phase table they go with."""
    run = load_run(records, PRICE_PER_HOUR)
    into.mkdir(parents=True, exist_ok=True)
    plot_run_loss(run, into / PICTURES[0], "dollars")
    plot_cost_per_loss_point(run, into / PICTURES[1])
    return markdown_table(run.phases)


def copy_records(run_dir: Path) -> None:
    RUN_RECORDS.mkdir(parents=True, exist_ok=True)
    for name in RECORD_FILES:
        shutil.copy2(run_dir / name, RUN_RECORDS / name)


def main(argv: list[str]) -> int:
    if argv:
        copy_records(Path(argv[0]))
    table = draw(RUN_RECORDS, IMAGES)
    print(f"redrawn: {', '.join(str(IMAGES / p) for p in PICTURES)}\nthe phase table they go with:\n\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
