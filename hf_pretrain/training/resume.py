"""Going on with a run under this session's recipe: from which checkpoint, and what changes on the way.

A run goes on from its newest good checkpoint, and the recipe may have changed since it was saved:
- the same `max_steps`: the same plan; a cooldown under way (`hf-pretrain stop`) goes on too;
- a wsd run going further (another `max_steps`) after its decay began: it goes on from the last
  checkpoint before the decay (kept for this, never pruned), holds the peak to the new plan's decay
  and decays to the new end, as a run planned that way from the start would have. The train state
  records the branch (`lineage`, which the model card shows); the old ending's final/ is kept as
  final_step_N/;
- a cosine run under another `max_steps`: every later step's rate changes (at the end of the
  cosine, it jumps back up). Refused, with the numbers, unless `allow_schedule_change`;
- another `global_batch_tokens` or `seq_len`: refused by name unless `allow_recipe_change`, which
  restarts the data stream at the tokens read so far.
Any other math key that changed is named in a warning. Nothing here loads weights: the preflight
check (preflight/resume.py) runs it before a model is built, and `setup` again to know what to load.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hf_pretrain.config import Recipe, TrainConfig, math_keys
from hf_pretrain.model import shape_differences
from hf_pretrain.optim import Schedule
from hf_pretrain.run_dir import RunDir
from hf_pretrain.training.checkpoint import (
    START_OVER,
    CheckpointError,
    checkpoint_path,
    list_checkpoints,
    newest_good_checkpoint,
    shape_mismatch,
    verify_checkpoint,
)
from hf_pretrain.training.state import TrainState

# keys whose change moves the data position: the stream is counted in samples of seq_len per step
BATCH_KEYS = ("train.global_batch_tokens", "data.seq_len")
SUPERSEDED_SUFFIX = ".superseded"  # checkpoints of an ending a run went further from


class ResumeRefused(RuntimeError):
    """The checkpoint cannot go on under this recipe without an explicit flag; `fix` says which."""

    def __init__(self, reason: str, fix: str):
        super().__init__(f"{reason}; {fix}")
        self.reason, self.fix = reason, fix


@dataclass
class Continuation:
    """How the run goes on: `resume` is what `resume_training_state` loads (`auto`, `none`, a folder)."""

    resume: str
    saved: dict[str, Any] | None = None  # the train state the plan was made from (the newest checkpoint)
    branch: dict[str, Any] | None = None  # the lineage entry when going further from a branch point
    folder: Path | None = None  # the checkpoint it goes on from (None: a fresh start)
    max_steps_changed: bool = False
    batch_changed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def apply(self, state: TrainState, loaded: dict[str, Any]) -> list[str]:
        """Adjust `state`, just loaded from `loaded`, to the new plan; returns what to say about it."""
        if self.max_steps_changed:
            state.cooldown = None  # the new max_steps is a new plan: any stop request belonged to the old one
        if self.branch is not None:
            state.lineage.append(self.branch)
        if self.batch_changed:
            old_seq_len = (loaded.get("math_keys") or {}).get("data", {}).get("seq_len", state.samples_per_step)
            tokens_read = loaded.get("data_position", state.step) * old_seq_len
            new_seq_len = state.math_keys["data"]["seq_len"]
            state.data_origin = (state.step, math.ceil(tokens_read / new_seq_len))
        return self.notes

    def set_aside(self, run: RunDir) -> list[str]:
        """Going further: keep the old ending out of the new run's way without destroying it (main
        process only). Its final/ becomes final_step_N/; its checkpoints past the branch point become
        step_N.superseded/, which resume and pruning ignore."""
        if self.branch is None:
            return []
        notes = []
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


def flat_keys(keys: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in keys.items():
        if isinstance(value, dict):
            out.update(flat_keys(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def changed_math_keys(saved: dict[str, Any], recipe: Recipe) -> dict[str, tuple[Any, Any]]:
    """{"train.max_steps": (250, 400), ...}: the math keys that differ from the checkpoint's recipe
    (none known for a checkpoint that did not record them)."""
    if not saved.get("math_keys"):
        return {}
    old, new = flat_keys(saved["math_keys"]), flat_keys(math_keys(recipe))
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def smallest_max_steps(train: TrainConfig, stable_until: int) -> int:
    """The smallest max_steps whose wsd decay starts at `stable_until` or later."""
    guess = (
        stable_until
        if train.decay_fraction >= 1
        else max(stable_until, int(stable_until / (1 - train.decay_fraction)) - 2)
    )
    while (Schedule(replace(train, max_steps=guess)).decay_start() or guess) < stable_until:
        guess += 1
    return guess


def plan_continuation(saved: dict[str, Any], recipe: Recipe, resume: str = "auto") -> Continuation:
    """How the run saved as `saved` (a train state) goes on under `recipe`; raises `ResumeRefused`."""
    t, step = recipe.train, saved["step"]
    plan = Continuation(resume=resume, saved=saved)
    changed = changed_math_keys(saved, recipe)
    plan.batch_changed = [k for k in BATCH_KEYS if k in changed]
    if plan.batch_changed:
        what = ", ".join(f"{k.split('.')[-1]} {changed[k][0]} -> {changed[k][1]}" for k in plan.batch_changed)
        if not t.allow_recipe_change:
            raise ResumeRefused(
                f"{what} since the checkpoint of step {step}: the tokens of every later step, and "
                f"where the data stream stands, would change",
                "pass --allow_recipe_change true to go on from the tokens read so far (the data "
                "position is recomputed in tokens), or go back to the old value",
            )
        plan.notes.append(f"{what} (allow_recipe_change): the data stream goes on from the tokens read so far")
    if not saved.get("math_keys") and saved.get("recipe_fingerprint") not in (None, recipe.fingerprint()):
        plan.notes.append(
            f"warning: the checkpoint of step {step} was written by a recipe with different math "
            f"settings; continuing with the new ones"
        )
    others = [k for k in changed if k not in BATCH_KEYS and k != "train.max_steps"]
    if others:
        plan.notes.append(
            "warning: math keys changed since the checkpoint, continuing with the new ones: "
            + ", ".join(f"{k.split('.')[-1]} {changed[k][0]} -> {changed[k][1]}" for k in others)
        )
    old_max = saved.get("max_steps", t.max_steps)
    if old_max == t.max_steps:
        return plan
    plan.max_steps_changed = True
    new = Schedule(t)
    if t.lr_schedule == "wsd" and saved.get("lr_schedule") == "wsd":
        stable_until = saved.get("decay_start")
        decaying = stable_until is not None and step > stable_until
        at = stable_until if decaying else step
        if (new.decay_start() or t.max_steps) < at:
            raise ResumeRefused(
                f"max_steps={t.max_steps:,} would begin its decay at step {new.decay_start():,}, before "
                f"step {at:,} where this run {'began its decay' if decaying else 'stands'}",
                f"choose max_steps of at least {smallest_max_steps(t, at):,}"
                + (
                    ""
                    if decaying
                    else f", or finish the run early with `hf-pretrain stop {t.output_dir}` while it runs"
                ),
            )
        plan.notes.append(
            f"max_steps {old_max:,} -> {t.max_steps:,}: the peak holds to step {new.decay_start():,}, "
            f"then the learning rate decays to step {t.max_steps:,}"
        )
        if decaying:
            if resume != "auto":
                plan.notes.append(
                    f"warning: the checkpoint of step {step:,} is past the start of its decay (step "
                    f"{stable_until:,}); going on from it as --resume asks, not from step {stable_until:,}"
                )
                return plan
            plan.branch = {
                "branch_step": stable_until,
                "from_step": step,
                "from_max_steps": old_max,
                "from_end": saved.get("end", old_max),
                "max_steps": t.max_steps,
            }
            plan.notes.insert(
                0,
                f"going further: this run stood at step {step:,} (max_steps {old_max:,}), past the "
                f"start of its decay; it goes on from the checkpoint of step {stable_until:,}, the "
                f"last before the decay",
            )
        return plan
    if step < new.warmup:
        return plan  # still warming up: the same rates either way
    old_lr, new_lr = saved.get("lr"), new.lr(step + 1)
    before = f"learning rate {old_lr:.3g} at step {step:,}" if old_lr is not None else f"step {step:,}"
    jump = f" ({new_lr / old_lr:.1f}x)" if old_lr else ""
    how = (
        f"this run's {saved.get('lr_schedule', 'cosine')} schedule over max_steps={old_max:,} reached {before}; "
        f"under {t.lr_schedule} over max_steps={t.max_steps:,} step {step + 1:,} gets {new_lr:.3g}{jump} and every "
        f"later step's rate changes"
    )
    if not t.allow_schedule_change:
        raise ResumeRefused(
            how,
            "pass --allow_schedule_change true to go on this way, or keep max_steps; a run you "
            "may extend is better planned with lr_schedule: wsd",
        )
    plan.notes.append(how + " (allow_schedule_change)")
    return plan


def refuse_another_shape(folder: Path, recipe: Recipe) -> None:
    """Raise `ResumeRefused` when the checkpoint's model (its config.json) has another shape than the
    recipe's, naming the keys; its weights could not be loaded (vocab_size is checked at the load)."""
    try:
        saved = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return  # nothing to compare with: the load will tell
    differences = shape_differences(saved, asdict(recipe.model))
    if differences:
        raise ResumeRefused(shape_mismatch(folder, differences), START_OVER)


def plan_resume(recipe: Recipe, log: Callable[[str], None] = lambda _: None) -> Continuation:
    """The continuation of `recipe`'s run folder: nothing (a fresh start), or the plan from its newest
    checkpoint (or the one `resume` names); raises `ResumeRefused` or `CheckpointError`."""
    t = recipe.train
    if t.resume == "none":
        existing = list_checkpoints(t.output_dir)
        if existing:  # starting over there would truncate its records and prune its checkpoints
            raise ResumeRefused(
                f"{t.output_dir} already holds a run (checkpoints up to step {existing[0].step:,}); "
                f"--resume none would start another one on top of it",
                "choose a new --output_dir to start over, or --resume auto to go on with this run",
            )
        return Continuation(resume="none")
    if t.resume != "auto":
        folder = Path(t.resume)
        if not folder.is_dir():
            raise CheckpointError(f"--resume {t.resume}: no such checkpoint folder")
        saved = verify_checkpoint(folder, checksums=False)
        refuse_another_shape(folder, recipe)
        return replace(plan_continuation(saved, recipe, resume=t.resume), folder=folder)
    skipped: list[str] = []
    found = newest_good_checkpoint(
        t.output_dir, checksums=False, log=lambda reason: (skipped.append(reason), log(reason))
    )
    if found is None and list_checkpoints(t.output_dir):
        raise ResumeRefused(
            f"none of the checkpoints in {t.output_dir} can be resumed from: " + "; ".join(skipped), START_OVER
        )
    if found is None:
        return Continuation(resume="auto")
    refuse_another_shape(found[0], recipe)
    plan = plan_continuation(found[1], recipe)
    plan.folder = found[0]
    if plan.branch is not None:
        branch = checkpoint_path(t.output_dir, plan.branch["branch_step"])
        try:
            verify_checkpoint(branch, checksums=False)
        except CheckpointError as exc:
            raise ResumeRefused(
                f"going further needs the checkpoint of step {plan.branch['branch_step']:,}, the last "
                f"before the decay, and it cannot be used: {exc}",
                "pass --resume with another checkpoint folder to go on from it",
            ) from exc
        plan.resume, plan.folder = str(branch), branch
    return plan
