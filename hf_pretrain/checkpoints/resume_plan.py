"""How a run goes on from a checkpoint: the plan (`Continuation`) the resume decision makes
(checkpoints/resume_decision.py) under the recipe-change policy (checkpoints/resume_rules.py), and
`ResumeRefused`, the reason it cannot without a flag, with the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_pretrain.checkpoints.layout import SUPERSEDED_SUFFIX
from hf_pretrain.checkpoints.store import list_checkpoints, set_aside
from hf_pretrain.run_folder.run_dir import RunDir

# How a finished run goes further: what `stop`, a training started again, the doctor and `status` say
GO_FURTHER = (
    "To go further, rerun its training command with a larger --max_steps (a wsd run goes on from its "
    "checkpoint before the decay; docs/stopping.md)"
)


class ResumeRefused(RuntimeError):
    """The checkpoint cannot go on under this recipe without an explicit flag; `fix` says which."""

    def __init__(self, reason: str, fix: str):
        super().__init__(f"{reason}; {fix}")
        self.reason, self.fix = reason, fix


@dataclass
class Continuation:
    """How the run goes on: from `folder` (a verified checkpoint), or from step 0 when it is None."""

    folder: Path | None = None  # the checkpoint to load: the newest good one, or the branch point
    saved: dict[str, Any] | None = None  # the train state the plan was made from (the newest checkpoint)
    branch: dict[str, Any] | None = None  # the lineage entry when going further from a branch point
    data_change: dict[str, Any] | None = None  # where the data changed (allow_data_change), for the record
    max_steps_changed: bool = False
    batch_changed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # newer checkpoints passed over: "step_N: reason"
    # those of them that failed their verification (not a milestone without its training state): set aside
    broken: list[tuple[Path, str]] = field(default_factory=list)

    def set_aside(self, run: RunDir) -> list[str]:
        """Going further: keep the old ending out of the new run's way without destroying it (main
        process only). Its final/ becomes final_step_N/; its checkpoints past the branch point become
        step_N.superseded/, which resume and pruning ignore. Checkpoints that failed their verification
        (`broken`) become step_N.corrupt/ (store.set_aside): kept as evidence, never counted as kept."""
        notes = []
        for folder, reason in self.broken:
            if folder.is_dir():
                moved = set_aside(folder, reason)
                notes.append(f"{folder.name} failed its verification and is set aside as {moved} (kept, never resumed)")
        if self.branch is None:
            return notes
        if run.final.is_dir():
            run.final.rename(run.final_before_branch(self.branch["from_step"]))
            notes.append(
                f"the model of the run as it ended at step {self.branch['from_step']:,} stays in "
                f"{run.final_before_branch(self.branch['from_step'])}"
            )
        later = [c for c in list_checkpoints(run.path) if c.step > self.branch["branch_step"]]
        for candidate in later:
            candidate.path.rename(candidate.path.with_name(candidate.path.name + SUPERSEDED_SUFFIX))
        if later:
            notes.append(
                f"{len(later)} checkpoint(s) of its decay, after step {self.branch['branch_step']:,}, are set "
                f"aside as step_N{SUPERSEDED_SUFFIX}/ in {run.checkpoints}: delete them to free the space"
            )
        return notes
