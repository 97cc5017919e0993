"""`make smoke`'s last step: the smoke recipe's claim, that its training loss falls by more than a third, checked
on the run `make smoke` has just trained, with its final model there. One line either way; exit 1 if it did not
learn.

It was a test of the suite that trained the same recipe a second time through the same launcher (6 of the suite's
minutes on CI's two cores, one test in seven of its end-to-end time); CI runs `make smoke` before `make test`,
so the claim is still held on every change (docs/testing.md).

    python -m tests.smoke_learned runs/smoke
"""

from __future__ import annotations

import sys
from pathlib import Path

from hf_pretrain.run_folder.run_dir import read_jsonl  # the standard library only: the base install has it

SHARE_LEFT = 2 / 3  # the last logged loss below two thirds of the first


def verdict(run_dir: Path) -> tuple[bool, str]:
    """(learned, the line that says so) for the run in `run_dir`."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return False, f"{run_dir}: no metrics.jsonl; `make smoke` trains it"
    losses = [(r["step"], r["loss"]) for r in read_jsonl(metrics) if r.get("kind") == "train"]
    if len(losses) < 2:
        return False, f"{run_dir}: fewer than two training losses logged in {metrics}"
    (first_step, first), (last_step, last) = min(losses), max(losses)
    said = f"loss {first:.3f} at step {first_step} -> {last:.3f} at step {last_step} ({last / first:.0%} of it)"
    if not (run_dir / "final" / "model.safetensors").is_file():
        return False, f"{run_dir}: no final/model.safetensors; the run did not finish ({said})"
    if not last < first * SHARE_LEFT:  # a NaN did not learn either
        return False, f"{run_dir}: the smoke recipe did not learn: {said}, not below {SHARE_LEFT:.0%}"
    return True, f"{run_dir}: the smoke recipe learns: {said}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.smoke_learned RUN_DIR  (e.g. runs/smoke)", file=sys.stderr)
        return 2
    learned, line = verdict(Path(argv[0]))
    print(line, file=sys.stdout if learned else sys.stderr)
    return 0 if learned else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
