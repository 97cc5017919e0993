"""The resume decision of a start: from which checkpoint the run goes on, every file checked against its
manifest (a live line while it lasts), and how (checkpoints/resume_rules.py). Made once per start:
the preflight table shows it and `setup` loads the checkpoint it names (checkpoints/load.py).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from hf_pretrain.checkpoints.layout import checkpoint_path
from hf_pretrain.checkpoints.load import START_OVER, shape_mismatch
from hf_pretrain.checkpoints.manifest import CheckpointError, verify_showing
from hf_pretrain.checkpoints.progress import Activity, Say
from hf_pretrain.checkpoints.resume_plan import Continuation, ResumeRefused
from hf_pretrain.checkpoints.resume_rules import plan_continuation
from hf_pretrain.checkpoints.store import is_weights_only, list_checkpoints, newest_good_checkpoint
from hf_pretrain.config import CheckpointConfig, ModelConfig, Recipe, TrainConfig
from hf_pretrain.config.model_section import padded_vocab_size
from hf_pretrain.run_folder.run_dir import RunDir

# How to go on when every checkpoint of the folder failed its verification: no recipe can read them.
DAMAGED_START_OVER = (
    "their files are damaged (no recipe can read them): start a new run in a new folder "
    "(--resume none --output_dir NEW), or copy an intact checkpoint back in and run again; this folder is left as it is"
)


def refuse_another_shape(folder: Path, model: ModelConfig, data: dict[str, Any] | None) -> None:
    """Raise `ResumeRefused` when the checkpoint's model (its config.json) has another shape than the
    model section's (its vocabulary from the prepared data's), naming the keys: its weights could not be loaded."""
    wanted = asdict(model)
    if data is not None:
        wanted["vocab_size"] = padded_vocab_size(data["vocab_size"], model.vocab_multiple)
    mismatch = shape_mismatch(folder, wanted)
    if mismatch:
        raise ResumeRefused(mismatch, START_OVER)


def resumable(folder: Path, _train_state: dict[str, Any] | None = None) -> None:
    """Raise `CheckpointError` for a complete checkpoint a resume cannot load."""
    if is_weights_only(folder):
        raise CheckpointError(
            f"{folder} is a milestone that kept its weights only: export, eval and the demo read it, a "
            f"resume cannot (milestone_full_state keeps whole milestones)"
        )


def finished_at(train: TrainConfig, checkpoints: CheckpointConfig) -> int | None:
    """The step at which the run in `train`'s output_dir finished, when this start would train nothing
    (the same command run again after it completed): --resume auto, final/ written (here, or whole in the
    store of a working copy: `RunDir.has_final`), and its newest checkpoint at the end of its schedule under
    the same max_steps. None for anything else, going further (another max_steps) included. Reads the
    newest checkpoint's train state, no checksums."""
    if not RunDir(train.output_dir).has_final():
        return None
    newest = newest_good_checkpoint(train.output_dir, checksums=False, log=lambda _: None)
    return finished_step(checkpoints.resume, train.max_steps, newest.train_state if newest is not None else {})


def finished_step(resume: str, max_steps: int, saved: dict[str, Any]) -> int | None:
    """The step of `saved` (the newest checkpoint's train state of a run with final/ written) when it
    is the end of its schedule under the recipe's `max_steps`, with `resume` auto; else None."""
    end, step = saved.get("end", saved.get("max_steps")), saved.get("step")
    if resume != "auto" or saved.get("max_steps") != max_steps:
        return None
    return None if end is None or step is None or step < end else int(step)


def decide_resume(
    recipe: Recipe, data: dict[str, Any] | None, say: Say = None, activity: Activity = None
) -> Continuation:
    """From which checkpoint `recipe`'s run goes on, and how: the one decision of a start, every file
    checked against its manifest. `none` -> a fresh start (refused on top of a run); a folder -> that
    checkpoint, which must be good; `auto` -> the newest good one, newer broken ones skipped with the
    reason (those that failed their verification listed in `broken`, for the session to set aside), or
    the last one before the decay when a wsd run goes further. `say` and `activity` show
    a verification that lasts. `data`: the prepared data's identity (`data.data_identity`), handed in
    by the caller so that the checkpoint wing reads no data folder. Raises `ResumeRefused` or
    `CheckpointError`."""
    t = recipe.train
    if recipe.checkpoints.resume == "none":
        existing = list_checkpoints(t.output_dir)
        if existing:  # starting over there would truncate its records and prune its checkpoints
            raise ResumeRefused(
                f"{t.output_dir} already holds a run (checkpoints up to step {existing[0].step:,}); "
                f"--resume none would start another one on top of it",
                "choose a new --output_dir to start over, or --resume auto to go on with this run",
            )
        return Continuation()
    if recipe.checkpoints.resume != "auto":
        folder = Path(recipe.checkpoints.resume)
        if not folder.is_dir():
            raise CheckpointError(f"--resume {recipe.checkpoints.resume}: no such checkpoint folder")
        saved = verify_showing(folder, say=say, activity=activity)
        resumable(folder, saved)
        refuse_another_shape(folder, recipe.model, data)
        return plan_continuation(saved, recipe, folder, named=True, data=data)
    skipped: list[str] = []
    broken: list[tuple[Path, str]] = []
    found = newest_good_checkpoint(
        t.output_dir, log=skipped.append, usable=resumable, say=say, activity=activity, broken=broken
    )
    if found is None and list_checkpoints(t.output_dir):
        # damaged files are not another recipe's: going back to one cannot help
        all_damaged = len(broken) == len(list_checkpoints(t.output_dir))
        raise ResumeRefused(
            f"none of the checkpoints in {t.output_dir} can be resumed from: " + "; ".join(skipped),
            DAMAGED_START_OVER if all_damaged else START_OVER,
        )
    if found is None:
        return Continuation()
    refuse_another_shape(found.path, recipe.model, data)
    plan = plan_continuation(found.train_state, recipe, found.path, data=data)
    plan.skipped, plan.broken = skipped, broken
    if plan.branch is not None:
        branch = checkpoint_path(t.output_dir, plan.branch["branch_step"])
        try:
            resumable(branch, verify_showing(branch, say=say, activity=activity))
        except CheckpointError as exc:
            raise ResumeRefused(
                f"going further needs the checkpoint of step {plan.branch['branch_step']:,}, the last "
                f"before the decay, and it cannot be used: {exc}",
                "pass --resume with another checkpoint folder to go on from it",
            ) from exc
        plan.folder = branch
    return plan
