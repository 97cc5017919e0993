"""`hf-pretrain bench --quality`: how many tokens (and dollars) a variant saves to reach a loss.

    hf-pretrain bench --recipe smoke --quality --variants optimizer=adamw,muon --seeds 1,2 --steps 300

Speed is tokens per second; quality is loss per token, and only a finished model's loss counts: a
run cooled at the end of its decay against one still at its peak rate compares the schedules, not
the variants. So every variant and seed trains one wsd run that is finished at `points` lengths
(e.g. 25%, 50%, 75% and 100% of `--steps`): the run of the first length decays and is evaluated,
then goes further (from its checkpoint before the decay, as `--max_steps` does) to the next length,
decays and is evaluated, and so on. The stable phase is shared; each extra finished model costs
only its decay. Every variant of a seed starts from the same initial weights and reads the same
batches in the same order (both are functions of the seed), so the comparison is fair.

From those finished losses, L(tokens) per variant and seed: the tokens a variant needs to reach the
baseline's final loss (the first variant is the baseline; interpolated in log tokens between the
two finished models around it), the saving against the baseline's tokens, its mean and spread over
seeds, and what that saving is worth on the recipe's plan (`economics/planning/`).

Any recipe key can shrink the model for the bench (`--num_hidden_layers 4 --hidden_size 256`); the
output says what was shrunk against the recipe as shipped, since a small proxy overstates savings
that shrink with size (docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hf_pretrain.bench.variants import run_in_child, variant_name
from hf_pretrain.config import ModelConfig, Recipe, build_recipe, load_recipe
from hf_pretrain.run_folder.run_dir import RunDir, read_jsonl
from hf_pretrain.store.location import Location

Say = Callable[[str], None]
MODEL_SHAPE_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
)


@dataclass(frozen=True)
class QualityRequest:
    recipe: Recipe  # with the shrink and every other override applied
    shipped: Recipe | None  # the recipe as shipped (for the shrink and the plan), if it loads
    data: Location  # where the recipe's data lives, as the command's door placed it
    output: Path
    variants: list[dict[str, str]]  # the first is the baseline; empty: the recipe as written alone
    seeds: list[int]
    steps: int  # optimizer steps of the longest finished model
    points: int = 4  # finished models per variant and seed
    gpu: str | None = None  # the plan's GPU for the dollars (unset: the recipe's price and rate)

    def __post_init__(self) -> None:
        if self.points < 2:
            raise ValueError("--points must be at least 2: a saving is read between two finished models")
        if self.steps < 4 * self.points:
            raise ValueError(
                f"--steps {self.steps} is too short for {self.points} finished models: use at least {4 * self.points}"
            )
        if not self.seeds:
            raise ValueError("--seeds needs at least one seed (two or more give a spread)")


@dataclass
class Curve:
    """One variant and seed: the validation loss of each finished model."""

    variant: str
    seed: int
    tokens: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    failed: str = ""

    def tokens_to_reach(self, loss: float) -> float | None:
        """Tokens at which the finished-model loss reaches `loss` (log-linear between the two finished
        models around it); None when no finished model reaches it."""
        points = list(zip(self.tokens, self.val_loss, strict=True))
        if points and points[0][1] <= loss:
            return float(points[0][0])  # reached by the first finished model already: at most that
        for (t0, l0), (t1, l1) in itertools.pairwise(points):
            if l1 <= loss < l0:
                share = (l0 - loss) / (l0 - l1)
                return math.exp(math.log(t0) + share * (math.log(t1) - math.log(t0)))
        return None


def finished_lengths(steps: int, points: int) -> list[int]:
    return [round(steps * (i + 1) / points) for i in range(points)]


def shrink_said(model: ModelConfig, shipped: ModelConfig | None) -> str:
    """The model shape keys the bench changed from the shipped recipe's model section."""
    if shipped is None:
        return ""
    changed = [
        f"{k} {getattr(shipped, k)} -> {getattr(model, k)}"
        for k in MODEL_SHAPE_KEYS
        if getattr(shipped, k) != getattr(model, k)
    ]
    return f"model shrunk for the bench: {', '.join(changed)}" if changed else ""


def quality_overrides(request: QualityRequest, seed: int, max_steps: int, output_dir: Path) -> dict[str, Any]:
    """One finished model: a wsd run to `max_steps`, evaluated once at its end, going further from
    its own folder's checkpoint before the decay."""
    return {
        "seed": seed,
        "max_steps": max_steps,
        "lr_schedule": "wsd",
        "warmup_steps": min(
            request.recipe.effective_warmup_steps, finished_lengths(request.steps, request.points)[0] // 2
        ),
        "eval_interval": 10 * request.steps,  # only the last step of each length
        "save_interval": 10 * request.steps,  # only the branch point and the end
        "keep_checkpoints": 1,
        "milestone_interval": 0,
        "log_interval": max(1, max_steps // 50),
        "resume": "auto",
        "report_to": "none",
        "output_dir": str(output_dir),
        "stop_at_step": 0,
        "phases": {},
        "early_stop_cost_per_loss_point": 0.0,
        "early_stop_patience": 0,
        "push_to_hub": "",
        "push_checkpoints": False,
    }


def train_curve(request: QualityRequest, overrides: dict[str, str], seed: int, folder: Path, say: Say) -> Curve:
    curve = Curve(variant_name(overrides), seed)
    run_dir = folder / "run"
    for max_steps in finished_lengths(request.steps, request.points):
        recipe = build_recipe(
            request.recipe.to_dict(), {**quality_overrides(request, seed, max_steps, run_dir), **overrides}
        )
        result = run_in_child(recipe, folder / f"to_{max_steps:06d}", keep_weights=True)
        evals = [r for r in read_jsonl(RunDir(run_dir).metrics) if r["kind"] == "eval" and r["step"] == max_steps]
        if result.status != "ok" or not evals:
            curve.failed = result.message or f"no evaluation at step {max_steps}"
            break
        curve.tokens.append(max_steps * recipe.train.global_batch_tokens)
        curve.val_loss.append(evals[-1]["val_loss"])
        say(
            f"  {curve.variant}, seed {seed}: finished at {curve.tokens[-1]:,} tokens, val_loss {curve.val_loss[-1]:.4f}"
        )
    return curve


def savings(curves: list[Curve], baseline: str) -> dict[str, list[float | None]]:
    """Per variant, one saving per seed: 1 - tokens to reach the baseline's final loss / the baseline's tokens."""
    by_seed = {c.seed: c for c in curves if c.variant == baseline and not c.failed}
    out: dict[str, list[float | None]] = {}
    for curve in curves:
        base = by_seed.get(curve.seed)
        if curve.variant == baseline or base is None or curve.failed:
            continue
        needed = curve.tokens_to_reach(base.val_loss[-1])
        out.setdefault(curve.variant, []).append(None if needed is None else 1 - needed / base.tokens[-1])
    return out


def beaten_by_first_model(curves: list[Curve], baseline: str) -> dict[str, int]:
    """Per variant, the seeds whose first finished model already reaches the baseline's final loss:
    their saving is a lower bound (`tokens_to_reach` can only say "by the first model at most")."""
    final = {c.seed: c.val_loss[-1] for c in curves if c.variant == baseline and not c.failed}
    out: dict[str, int] = {}
    for c in curves:
        if c.variant != baseline and not c.failed and c.seed in final and c.val_loss and c.val_loss[0] <= final[c.seed]:
            out[c.variant] = out.get(c.variant, 0) + 1
    return out


def run_dollars(request: QualityRequest) -> tuple[float | None, str]:
    """The recipe's (as shipped) whole run in dollars on the plan's GPU, and how it was priced."""
    from hf_pretrain.economics.planning.plan import make_plan
    from hf_pretrain.economics.planning.request import PlanRequest

    recipe = request.shipped or request.recipe
    try:
        plan = make_plan(PlanRequest(recipe=recipe, gpu=request.gpu))
    except ValueError as exc:
        return None, str(exc)
    if plan.usd_per_billion_tokens is None:
        return None, plan.throughput_source
    usd = plan.usd_per_billion_tokens * plan.tokens / 1e9
    where = f"{plan.gpu} at ${plan.price_per_gpu_hour:.2f}/h" if plan.gpu else "the recipe's price and rate"
    return usd, f"{recipe.name}'s {plan.tokens / 1e9:,.1f}B tokens on {where} ({plan.throughput_source}): ${usd:,.0f}"


def summary_lines(request: QualityRequest, curves: list[Curve]) -> list[str]:
    baseline = curves[0].variant
    lengths = finished_lengths(request.steps, request.points)
    tokens = [n * request.recipe.train.global_batch_tokens for n in lengths]
    header = "| variant | seed | " + " | ".join(f"val loss @ {t:,}" for t in tokens) + " |"
    lines = [header, "|" + "---|" * (len(tokens) + 2)]
    for c in curves:
        losses = [f"{v:.4f}" for v in c.val_loss] + ["failed"] * (len(tokens) - len(c.val_loss))
        lines.append(f"| {c.variant} | {c.seed} | " + " | ".join(losses) + " |")
    usd, priced = run_dollars(request)
    lines.append("")
    lines.append(f"baseline: {baseline}; saving = tokens the baseline needs for its final loss that a variant does not")
    early = beaten_by_first_model(curves, baseline)
    for variant, values in savings(curves, baseline).items():
        reached = [v for v in values if v is not None]
        if not reached:
            lines.append(f"{variant}: never reaches the baseline's final loss within {tokens[-1]:,} tokens")
            continue
        mean = statistics.fmean(reached)
        spread = (
            f" +/- {statistics.stdev(reached):.1%} (sd over {len(reached)} seeds)"
            if len(reached) > 1
            else " (one seed: no spread)"
        )
        missed = f"; {len(values) - len(reached)} seed(s) never reached it" if len(reached) < len(values) else ""
        worth = f", worth about ${mean * usd:,.0f} of {priced}" if usd else f" (dollars: {priced})"
        bound = (
            f" or more ({early[variant]} seed(s) reach it with the first finished model: more --points, "
            "or a longer --steps, says how much more)"
            if early.get(variant)
            else ""
        )
        lines.append(f"{variant}: {mean:.1%} fewer tokens{bound}{spread}{missed}{worth}")
    lines.append("(a small proxy overstates savings that shrink with model size: see docs/benchmarks.md)")
    return lines


def run_quality(request: QualityRequest, say: Say = print) -> dict[str, Any]:
    from hf_pretrain.bench.sweep import recipe_with_data

    request.output.mkdir(parents=True, exist_ok=True)
    request = dataclasses.replace(
        request, recipe=recipe_with_data(request.recipe, request.data, request.output, request.steps, say)
    )
    shrink = shrink_said(request.recipe.model, request.shipped.model if request.shipped else None)
    if shrink:
        say(shrink)
    variants = request.variants or [{}]
    curves = []
    for v, overrides in enumerate(variants):
        for seed in request.seeds:
            say(f"variant {v}: {variant_name(overrides)}, seed {seed}")
            curves.append(
                train_curve(request, overrides, seed, request.output / "quality" / f"{v:02d}" / f"seed_{seed}", say)
            )
    lines = ([shrink, ""] if shrink else []) + summary_lines(request, curves)
    (request.output / "quality.md").write_text("\n".join(lines) + "\n")
    result = {
        "recipe": request.recipe.name,
        "shrink": shrink,
        "steps": request.steps,
        "seeds": request.seeds,
        "curves": [asdict(c) for c in curves],
        "savings": savings(curves, curves[0].variant),
    }
    (request.output / "quality.json").write_text(json.dumps(result, indent=2))
    say("\n".join(lines))
    say(f"written: {request.output / 'quality.md'}, {request.output / 'quality.json'}")
    return result


def shipped_recipe(name: str) -> Recipe | None:
    """The shipped recipe of that name, to compare a user's with."""
    try:
        return load_recipe(name)
    except Exception:  # a recipe file of the user's: nothing shipped to compare with
        return None
