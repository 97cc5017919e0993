"""The doctor's row of the resume decision (checkpoints/resume_decision.py): can the run go on under
this recipe, and how; and the row of a stop request waiting for this start (hf_pretrain/run_folder/stop_request.py)."""

from __future__ import annotations

from collections.abc import Callable

from hf_pretrain.checkpoints.manifest import CheckpointError
from hf_pretrain.checkpoints.resume_decision import finished_step
from hf_pretrain.checkpoints.resume_plan import Continuation, ResumeRefused
from hf_pretrain.config import CheckpointConfig, TrainConfig
from hf_pretrain.preflight.result import CheckResult
from hf_pretrain.run_folder.run_dir import RunDir
from hf_pretrain.run_folder.stop_request import at_start, read_stop_request


def check_resume(
    train: TrainConfig, checkpoints: CheckpointConfig, decision: Callable[[], Continuation]
) -> CheckResult:
    """What resuming will do (the plan, checkpoints/resume_plan.py): a fresh start, the same plan, going
    further from the last checkpoint before the decay; or a change that needs an explicit flag, which
    fails here. `decision` is made once per start (training's `setup` loads what it names)."""
    try:
        plan = decision()
    except ResumeRefused as exc:
        return CheckResult("resume", "fail", exc.reason, exc.fix)
    except CheckpointError as exc:
        return CheckResult("resume", "fail", str(exc), "pass --resume auto, none, or a complete checkpoint folder")
    skipped = "".join(f"; skipping {reason}" for reason in plan.skipped)
    if plan.saved is None:
        start = "starts from step 0" + (" (resume none)" if checkpoints.resume == "none" else ": no checkpoint yet")
        return CheckResult("resume", "pass", start + skipped)
    step = plan.saved["step"]
    if (
        RunDir(train.output_dir).final.is_dir()
        and finished_step(checkpoints.resume, train.max_steps, plan.saved) is not None
    ):
        # the same command after the run completed: nothing goes on (the verdict under the table says so)
        return CheckResult("resume", "pass", f"nothing to resume: the run finished at step {step:,}{skipped}")
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


def check_stop_request(output_dir: str, decision: Callable[[], Continuation]) -> list[CheckResult]:
    """A stop request waiting in the run folder, its age and what this start does with it (stop_request.py):
    no row when there is none."""
    request = read_stop_request(output_dir)
    if request is None:
        return []
    try:
        plan = decision()
    except (ResumeRefused, CheckpointError):
        plan = Continuation()
    cooldown = (plan.saved or {}).get("cooldown") if not plan.max_steps_changed else None
    _, line = at_start(request, plan.max_steps_changed, cooldown["end"] if cooldown else None)
    path = RunDir(output_dir).stop_request
    return [CheckResult("stop request", "warn", line, f"delete {path} to take it back")]
