"""The run folder's checkpoints against the recipe: can the run go on under it, and how."""

from __future__ import annotations

from collections.abc import Callable

from hf_pretrain.checkpoints.continuation import Continuation, ResumeRefused
from hf_pretrain.checkpoints.manifest import CheckpointError
from hf_pretrain.config import Recipe
from hf_pretrain.preflight.result import CheckResult


def check_resume(recipe: Recipe, decision: Callable[[], Continuation]) -> CheckResult:
    """What resuming will do (checkpoints/continuation.py): a fresh start, the same plan, going further from the
    last checkpoint before the decay; or a change that needs an explicit flag, which fails here.
    `decision` is made once per start (training's `setup` loads what it names)."""
    try:
        plan = decision()
    except ResumeRefused as exc:
        return CheckResult("resume", "fail", exc.reason, exc.fix)
    except CheckpointError as exc:
        return CheckResult("resume", "fail", str(exc), "pass --resume auto, none, or a complete checkpoint folder")
    skipped = "".join(f"; skipped {reason}" for reason in plan.skipped)
    if plan.saved is None:
        start = "starts from step 0" + (" (resume none)" if recipe.train.resume == "none" else ": no checkpoint yet")
        return CheckResult("resume", "pass", start + skipped)
    step = plan.saved["step"]
    reason = f"goes on from step {step:,}" if plan.branch is None else f"goes on from {plan.folder}"
    if plan.notes:
        reason += ": " + "; ".join(plan.notes)
    warned = any(note.startswith("warning") for note in plan.notes)
    return CheckResult(
        "resume",
        "warn" if warned else "pass",
        reason + skipped,
        "start a new output_dir (or --resume none) for a run of its own" if warned else "",
    )
