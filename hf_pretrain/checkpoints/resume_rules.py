"""The recipe-change policy: what a run may change since its checkpoint, and how it then goes on.

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
  restarts the data stream at the tokens read so far;
- data tokenized by another tokenizer than the checkpoint's: refused, naming both hashes (its weights
  would be paired with the wrong tokens, and every later checkpoint and final/ with the wrong
  tokenizer); other training shards from the same tokenizer: refused unless `allow_data_change`,
  which records the step in `data_changes` (the model card shows it).
Any other math key that changed is named in a warning. `plan_continuation` applies these rules,
one function per kind of change; which checkpoint it is asked about is checkpoints/resume_decision.py's.
"""

from __future__ import annotations

from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any

from hf_pretrain.checkpoints.resume_plan import Continuation, ResumeRefused
from hf_pretrain.config import KEY_SECTION, SECTIONS, CheckpointConfig, OptimConfig, Recipe, TrainConfig, math_keys
from hf_pretrain.optim.build import Schedule

# keys whose change moves the data position: the stream is counted in samples of seq_len per step
BATCH_KEYS = ("global_batch_tokens", "seq_len")


def flat_keys(keys: dict[str, Any]) -> dict[str, Any]:
    """A recipe's math keys by their flat names (as on the command line), whatever section held them: a
    checkpoint saved before the recipe had its sections (every run key under `train`) reads the same."""
    out: dict[str, Any] = {}
    for name, value in keys.items():
        out.update(value if isinstance(value, dict) else {name: value})
    return out


def changed_math_keys(saved: dict[str, Any], keys: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{"max_steps": (250, 400), ...}: the math keys that differ from the checkpoint's recipe
    (none known for a checkpoint that did not record them); `keys`: the run's (`config.math_keys`). A key
    the checkpoint's version did not have yet counts as its default: a new key's default keeps the
    behaviour it was saved with."""
    if not saved.get("math_keys"):
        return {}
    old, new = flat_keys(saved["math_keys"]), flat_keys(keys)
    old = {**{k: key_default(k) for k in set(new) - set(old)}, **old}
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def key_default(name: str) -> Any:
    """The default of a recipe key (None where there is no plain default)."""
    section = SECTIONS.get(KEY_SECTION.get(name, ""))
    found = [f for f in fields(section) if f.name == name] if is_dataclass(section) else []
    return found[0].default if found and found[0].default is not MISSING else None


def smallest_max_steps(optim: OptimConfig, stable_until: int) -> int:
    """The smallest max_steps whose wsd decay starts at `stable_until` or later."""
    fraction = optim.decay_fraction
    guess = stable_until if fraction >= 1 else max(stable_until, int(stable_until / (1 - fraction)) - 2)
    while (Schedule(optim, max_steps=guess).decay_start() or guess) < stable_until:
        guess += 1
    return guess


MIXTURE_KEYS = ("weight", "decay_weight")


def mixture_change(step: int, old: list[dict] | None, new: list[dict] | None) -> str:
    """The sources' change since the checkpoint in words: a new mixture (weights) is drawn by the loader
    when training and needs no new prepare; what else changed is named by source and key, not dumped."""

    def by_name(sources: list[dict] | None) -> dict[str, dict]:
        return {str(s.get("name") or s.get("paths") or i): s for i, s in enumerate(sources or [])}

    before, after = by_name(old), by_name(new)
    weights, settings = [], []
    for name in [*before, *(n for n in after if n not in before)]:
        a, b = before.get(name), after.get(name)
        if a is None or b is None:
            settings.append(f"{name} {'added' if a is None else 'removed'}")
            continue
        weights += [f"{name} {k} {a.get(k)} -> {b.get(k)}" for k in MIXTURE_KEYS if a.get(k) != b.get(k)]
        other = [k for k in sorted(set(a) | set(b)) if k not in MIXTURE_KEYS and a.get(k) != b.get(k)]
        if other:
            settings.append(f"{name}: {', '.join(other)} changed")
    said = [f"note: the data mixture changed since the checkpoint of step {step:,}"]
    if weights:
        said.append(
            f"{'; '.join(weights)}: the new weights apply from step {step + 1:,} on (the loader draws the "
            f"mixture when training: no new prepare is needed)"
        )
    if settings:
        said.append(
            f"{'; '.join(settings)}: prepare's settings; the prepared tokens themselves are checked against "
            f"the checkpoint's (allow_data_change)"
        )
    return ": ".join(said[:2]) + ("; " + said[2] if len(said) > 2 else "")


def check_same_data(
    saved: dict[str, Any], data: dict[str, Any] | None, *, allow_data_change: bool
) -> dict[str, Any] | None:
    """Raise `ResumeRefused` when the run's data is not what the checkpoint trained on (another
    tokenizer always; other shards unless `allow_data_change`); returns the data change to record, if
    any. A checkpoint from before data was recorded, or data not prepared yet, is not compared."""
    old = saved.get("data")
    if not old or not data:
        return None
    step = saved["step"]
    if old["tokenizer_hash"] != data["tokenizer_hash"]:
        raise ResumeRefused(
            f"the data in {data['data_dir']} was tokenized by another tokenizer (tokenizer_hash "
            f"{data['tokenizer_hash'][:12]}...) than the one the checkpoint of step {step:,} trained with "
            f"({old['tokenizer_hash'][:12]}..., data then in {old['data_dir']}): its weights know other token ids",
            "prepare the data again with the run's own tokenizer (the checkpoint folder holds it), or start a "
            "new run in a new --output_dir",
        )
    if old["train_tokens_sha256"] == data["train_tokens_sha256"]:
        return None
    if not allow_data_change:
        raise ResumeRefused(
            f"the training shards in {data['data_dir']} are not the ones the checkpoint of step {step:,} "
            f"trained on (same tokenizer, other tokens: the folder was prepared again or changed)",
            "pass --allow_data_change true to go on on this data (the model card records the step where it "
            "changed), or restore the data the run was prepared with",
        )
    return {
        "step": step,
        "from_data_dir": old["data_dir"],
        "to_data_dir": data["data_dir"],
        "from_train_tokens_sha256": old["train_tokens_sha256"],
        "to_train_tokens_sha256": data["train_tokens_sha256"],
    }


def plan_continuation(
    saved: dict[str, Any],
    recipe: Recipe,
    folder: Path | None = None,
    named: bool = False,
    data: dict[str, Any] | None = None,
) -> Continuation:
    """How the run saved as `saved` (the train state of `folder`) goes on under `recipe` and the
    prepared `data` (`data.data_identity`); `named` when `--resume` named that folder rather than
    `auto`. Raises `ResumeRefused`."""
    plan = Continuation(folder=folder, saved=saved)
    changed = changed_math_keys(saved, math_keys(recipe))
    data_went_on(plan, saved, data, allow_data_change=recipe.checkpoints.allow_data_change)
    batch_went_on(plan, saved, changed, recipe.checkpoints)
    refuse_another_optimizer(saved, changed)
    note_other_changes(plan, saved, changed, fingerprint=recipe.fingerprint())
    old_max = saved.get("max_steps", recipe.train.max_steps)
    if old_max == recipe.train.max_steps:
        return plan
    plan.max_steps_changed = True
    if recipe.optim.lr_schedule == "wsd" and saved.get("lr_schedule") == "wsd":
        wsd_goes_further(plan, saved, recipe.optim, recipe.train, named)
    else:
        schedule_changes(
            plan,
            saved,
            recipe.optim,
            max_steps=recipe.train.max_steps,
            allowed=recipe.checkpoints.allow_schedule_change,
        )
    return plan


def data_went_on(
    plan: Continuation, saved: dict[str, Any], data: dict[str, Any] | None, *, allow_data_change: bool
) -> None:
    """Other data than the checkpoint's: refused, or recorded (allow_data_change)."""
    plan.data_change = check_same_data(saved, data, allow_data_change=allow_data_change)
    if plan.data_change is not None:
        plan.notes.append(
            f"the training data changed since the checkpoint of step {saved['step']:,} (allow_data_change): "
            f"recorded in the train state and the model card"
        )


def batch_went_on(
    plan: Continuation, saved: dict[str, Any], changed: dict[str, tuple], allowed: CheckpointConfig
) -> None:
    """Another batch or sequence length: refused, or the data stream goes on from the tokens read."""
    plan.batch_changed = [k for k in BATCH_KEYS if k in changed]
    if not plan.batch_changed:
        return
    what = ", ".join(f"{k.split('.')[-1]} {changed[k][0]} -> {changed[k][1]}" for k in plan.batch_changed)
    if not allowed.allow_recipe_change:
        raise ResumeRefused(
            f"{what} since the checkpoint of step {saved['step']}: the tokens of every later step, and "
            f"where the data stream stands, would change",
            "pass --allow_recipe_change true to go on from the tokens read so far (the data "
            "position is recomputed in tokens), or go back to the old value",
        )
    plan.notes.append(f"{what} (allow_recipe_change): the data stream goes on from the tokens read so far")


def refuse_another_optimizer(saved: dict[str, Any], changed: dict[str, tuple]) -> None:
    if "optimizer" in changed:
        old, new = changed["optimizer"]
        raise ResumeRefused(
            f"optimizer {old} -> {new} since the checkpoint of step {saved['step']}: its optimizer state is "
            f"{old}'s, and {new} would start from none",
            f"go back to --optimizer {old}, or start a run of its own (--output_dir NEW)",
        )


def note_other_changes(
    plan: Continuation, saved: dict[str, Any], changed: dict[str, tuple], *, fingerprint: str
) -> None:
    """The changes a run goes on with, said: another mixture, other math keys, an older recipe's (whose
    checkpoint recorded only the fingerprint of its math keys: `fingerprint` is the run's)."""
    step = saved["step"]
    if not saved.get("math_keys") and saved.get("recipe_fingerprint") not in (None, fingerprint):
        plan.notes.append(
            f"warning: the checkpoint of step {step} was written by a recipe with different math "
            f"settings; continuing with the new ones"
        )
    if "sources" in changed:
        plan.notes.append(mixture_change(step, *changed["sources"]))
    others = [k for k in changed if k not in BATCH_KEYS and k not in ("max_steps", "sources")]
    if others:
        plan.notes.append(
            "warning: math keys changed since the checkpoint, continuing with the new ones: "
            + ", ".join(f"{k.split('.')[-1]} {changed[k][0]} -> {changed[k][1]}" for k in others)
        )


def branch_step(saved: dict[str, Any], max_steps: int) -> int | None:
    """The step of the checkpoint a start under `max_steps` (with --resume auto) goes on from when it is
    not `saved`'s own: a wsd run asked for another max_steps once its decay began goes further from its
    last checkpoint before the decay (`wsd_goes_further`). None when it goes on from `saved` itself. A
    run in a store asks it before the resume decision: a fresh machine pulled the newest checkpoint only."""
    stable_until = saved.get("decay_start")
    if saved.get("lr_schedule") != "wsd" or saved.get("max_steps", max_steps) == max_steps or stable_until is None:
        return None
    return int(stable_until) if saved.get("step", 0) > stable_until else None


def wsd_goes_further(
    plan: Continuation, saved: dict[str, Any], optim: OptimConfig, train: TrainConfig, named: bool
) -> None:
    """A wsd run under another max_steps: the peak held to the new decay; past its decay, from the
    branch point (the last checkpoint before it), unless --resume named a later checkpoint."""
    step, old_max = saved["step"], saved.get("max_steps", train.max_steps)
    new = Schedule(optim, max_steps=train.max_steps)
    stable_until = saved.get("decay_start")
    decaying = stable_until is not None and step > stable_until
    at = stable_until if decaying else step
    if (new.decay_start() or train.max_steps) < at:
        raise ResumeRefused(
            f"max_steps={train.max_steps:,} would begin its decay at step {new.decay_start():,}, before "
            f"step {at:,} where this run {'began its decay' if decaying else 'stands'}",
            f"choose max_steps of at least {smallest_max_steps(optim, at):,}"
            + (
                ""
                if decaying
                else f", or finish the run early with `hf-pretrain stop {train.output_dir}` while it runs"
            ),
        )
    plan.notes.append(
        f"max_steps {old_max:,} -> {train.max_steps:,}: the peak holds to step {new.decay_start():,}, "
        f"then the learning rate decays to step {train.max_steps:,}"
    )
    if not decaying:
        return
    if named:
        plan.notes.append(
            f"warning: the checkpoint of step {step:,} is past the start of its decay (step "
            f"{stable_until:,}); going on from it as --resume asks, not from step {stable_until:,}"
        )
        return
    plan.branch = {
        "branch_step": stable_until,
        "from_step": step,
        "from_max_steps": old_max,
        "from_end": saved.get("end", old_max),
        "max_steps": train.max_steps,
    }
    plan.notes.insert(
        0,
        f"going further: this run stood at step {step:,} (max_steps {old_max:,}), past the "
        f"start of its decay; it goes on from the checkpoint of step {stable_until:,}, the "
        f"last before the decay",
    )


def schedule_changes(
    plan: Continuation, saved: dict[str, Any], optim: OptimConfig, *, max_steps: int, allowed: bool
) -> None:
    """A cosine run (or a change of schedule) under another max_steps: every later step's rate changes,
    refused unless `allowed` (allow_schedule_change); nothing changes while still warming up."""
    step, old_max = saved["step"], saved.get("max_steps", max_steps)
    new = Schedule(optim, max_steps=max_steps)
    if step < new.warmup:
        return  # still warming up: the same rates either way
    old_lr, new_lr = saved.get("lr"), new.lr(step + 1)
    before = f"learning rate {old_lr:.3g} at step {step:,}" if old_lr is not None else f"step {step:,}"
    jump = f" ({new_lr / old_lr:.1f}x)" if old_lr else ""
    how = (
        f"this run's {saved.get('lr_schedule', 'cosine')} schedule over max_steps={old_max:,} reached {before}; "
        f"under {optim.lr_schedule} over max_steps={max_steps:,} step {step + 1:,} gets {new_lr:.3g}{jump} and every "
        f"later step's rate changes"
    )
    if not allowed:
        raise ResumeRefused(
            how,
            "pass --allow_schedule_change true to go on this way, or keep max_steps; a run you "
            "may extend is better planned with lr_schedule: wsd",
        )
    plan.notes.append(how + " (allow_schedule_change)")
