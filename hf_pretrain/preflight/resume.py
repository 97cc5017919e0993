"""The run folder's checkpoints against the recipe: can the run go on under it, and how."""

from __future__ import annotations

from hf_pretrain.config import Recipe
from hf_pretrain.preflight.result import CheckResult
from hf_pretrain.training.checkpoint import CheckpointError
from hf_pretrain.training.resume import ResumeRefused, plan_resume


def check_resume(recipe: Recipe) -> CheckResult:
    """What resuming will do (training/resume.py): a fresh start, the same plan, going further from the
    last checkpoint before the decay; or a change that needs an explicit flag, which fails here."""
    try:
        plan = plan_resume(recipe)
    except ResumeRefused as exc:
        return CheckResult("resume", "fail", exc.reason, exc.fix)
    except CheckpointError as exc:
        return CheckResult("resume", "fail", str(exc), "pass --resume auto, none, or a complete checkpoint folder")
    if plan.saved is None:
        start = "starts from step 0" + (" (resume none)" if plan.resume == "none" else ": no checkpoint yet")
        return CheckResult("resume", "pass", start)
    step = plan.saved["step"]
    reason = f"goes on from step {step:,}" if plan.branch is None else f"goes on from {plan.resume}"
    if plan.notes:
        reason += ": " + "; ".join(plan.notes)
    warned = any(note.startswith("warning") for note in plan.notes)
    return CheckResult(
        "resume",
        "warn" if warned else "pass",
        reason,
        "start a new output_dir (or --resume none) for a run of its own" if warned else "",
    )
