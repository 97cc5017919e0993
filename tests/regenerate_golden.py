"""Re-record tests/assets/golden_smoke_losses.json after a deliberate change to the math.

    python -m tests.regenerate_golden
"""

from __future__ import annotations

import json
import platform
import tempfile
from pathlib import Path

import torch

from hf_pretrain.config import load_recipe
from hf_pretrain.data import prepare
from hf_pretrain.run_dir import read_jsonl
from tests.helpers import SHORT_RUN, launch_training

GOLDEN = Path(__file__).parent / "assets" / "golden_smoke_losses.json"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir, run_dir = Path(tmp) / "data", Path(tmp) / "run"
        prepare(load_recipe("smoke", {"data_dir": str(data_dir)}), log=lambda _: None)
        launch_training(data_dir, run_dir)
        losses = [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    GOLDEN.write_text(json.dumps({
        "recipe": "smoke", "overrides": SHORT_RUN, "python": platform.python_version(),
        "torch": torch.__version__.split("+")[0], "losses": losses,
    }, indent=1) + "\n")
    print(f"wrote {GOLDEN}: {losses}")


if __name__ == "__main__":
    main()
