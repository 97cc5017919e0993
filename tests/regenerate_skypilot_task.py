"""Write the shipped SkyPilot task's offers again from the catalog snapshot in ../shared (after a change to the
performance model, the GPU table, the spot terms or the snapshot): `.venv/bin/python -m tests.regenerate_skypilot_task`.
tests/test_skypilot_plan.py holds the shipped file equal to what this writes."""

from __future__ import annotations

from hf_pretrain.engines.skypilot_task import SHIPPED_TASK
from tests.skypilot_plan import SNAPSHOT, shipped_task_from_snapshot

if __name__ == "__main__":
    SHIPPED_TASK.write_text(shipped_task_from_snapshot())
    print(f"wrote {SHIPPED_TASK} from {SNAPSHOT}")
