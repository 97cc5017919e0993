"""`hf-pretrain report RUN_DIR`: plots and a markdown page for a run folder.

    hf-pretrain report runs/1b                      # writes runs/1b/report/report.md and its PNGs
    hf-pretrain report runs/1b --price_per_hour 2.49 --output /tmp/report

Reads what training leaves in the folder: metrics.jsonl (loss, tokens/s, lr, elapsed time),
samples.jsonl, resolved_recipe.yaml (price_per_hour, phases, milestone_interval), phases.json when
a phase has ended, and benchmarks.jsonl when the model was scored. Anything missing is left out
of the page with a line that says why, so a report works on a run that is still going.

The forecast plot draws the power law fitted to the stable part of the loss curve
(economics/forecast.py) out to the end of the plan, with its uncertainty band, over the measured curve.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hf_pretrain.config import CommandParser
from hf_pretrain.economics.cost import (
    Phase,
    PhaseRow,
    dollars_per_billion_tokens,
    markdown_table,
    phase_row,
    phases_from_recipe,
)
from hf_pretrain.economics.forecast import BAND_SIGMAS, LossFit, fit_run
from hf_pretrain.exit_codes import EXIT_CONFIG
from hf_pretrain.formatting import human_count, table_cell, usd
from hf_pretrain.optim.build import Cooldown, Schedule
from hf_pretrain.plots import new_axes, plot_loss, token_unit, tokens_axis, value_at_steps
from hf_pretrain.run_folder.run_dir import RunDir, read_jsonl

# One colour per phase band, cycled; light enough that the curves stay readable on top.
PHASE_COLOURS = ["#dbe9f6", "#fde2c8", "#d9f0d3", "#eadcf2", "#fbe3e8", "#e8e8e8"]


@dataclass
class RunData:
    """Everything the report reads from a run folder."""

    name: str
    train: list[dict[str, Any]]  # "train" records of metrics.jsonl, in step order
    evals: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    benchmarks: list[dict[str, Any]]
    price_per_hour: float  # 0 = unknown
    milestone_interval: int
    phases: list[PhaseRow]
    stable_steps: tuple[int, int]  # the stretch of the curve the forecast fits
    end_step: int  # where the plan ends (max_steps, or the end of a cooldown)


def load_run(run_dir: Path, price_override: float | None = None) -> RunData:
    run = RunDir(run_dir)
    metrics = read_jsonl(run.metrics)
    train = [r for r in metrics if r.get("kind") == "train"]
    if not train and not run.metrics.is_file():  # not a run folder, or a run that has not trained yet
        what = (
            "no such folder"
            if not run.path.is_dir()
            else f"no training records (no {run.metrics.name}): not a run folder, or no step trained yet"
        )
        raise FileNotFoundError(f"{run.path}: {what}; give a run folder (the recipe's output_dir)")
    if not train:
        raise FileNotFoundError(f"{run.metrics} holds no training records yet")
    recipe = run.load_recipe()
    price = price_override if price_override is not None else (recipe.reporting.price_per_hour if recipe else 0.0)
    cooldowns = [r for r in metrics if r.get("kind") == "cooldown"]
    cooldown = Cooldown(cooldowns[-1]["step"], cooldowns[-1]["end"]) if cooldowns else None
    if recipe is not None:
        schedule = Schedule(recipe.optim, max_steps=recipe.train.max_steps)
        stable, end = schedule.stable_steps(cooldown), schedule.end(cooldown)
    else:  # no recipe: skip the first tenth of the curve, where a warmup would be
        stable, end = (train[-1]["step"] // 10 + 1, train[-1]["step"]), train[-1]["step"]
    return RunData(
        name=recipe.name if recipe else run_dir.name,
        train=train,
        evals=[r for r in metrics if r.get("kind") == "eval"],
        samples=read_jsonl(run.samples),
        benchmarks=read_jsonl(run.benchmarks),
        price_per_hour=price,
        milestone_interval=recipe.checkpoints.milestone_interval if recipe else 0,
        phases=load_phases(run, train, recipe.reporting.phases if recipe else {}, price, price_override is not None),
        stable_steps=stable,
        end_step=end,
    )


def load_phases(
    run: RunDir, train: list[dict[str, Any]], phase_ends: dict[str, int], price: float, reprice: bool
) -> list[PhaseRow]:
    """The run's phases.json rows, else rows computed from the recipe's `phases` for those that ended.

    With `reprice` (a `--price` given) the rows are recomputed at `price`.
    """
    phases_file = run.phases_json
    if phases_file.exists():
        rows = [PhaseRow(**row) for row in json.loads(phases_file.read_text())]
        if not reprice:
            return rows
        phases = [Phase(row.name, row.start_step, row.end_step) for row in rows]
    else:
        phases = [p for p in phases_from_recipe(phase_ends) if p.end_step <= train[-1]["step"]]
    return [phase_row(train, phase, price) for phase in phases]


# ---------------------------------------------------------------------- plots
def dollars_at_steps(run: RunData, steps: list[float]) -> np.ndarray:
    return value_at_steps(run.train, "elapsed", steps) / 3600 * run.price_per_hour


def _shade_phases(axes, run: RunData, to_x) -> None:
    """A band per phase over [start, end] in the axis' units, named at the top."""
    for index, phase in enumerate(run.phases):
        start, end = to_x([phase.start_step, phase.end_step])
        axes.axvspan(start, end, color=PHASE_COLOURS[index % len(PHASE_COLOURS)], zorder=0, lw=0)
        axes.text(
            (start + end) / 2,
            1.0,
            phase.name,
            transform=axes.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=8,
        )


def plot_run_loss(run: RunData, path: Path, against: str) -> Path:
    """Train and validation loss against tokens (`against="tokens"`) or dollars (`"dollars"`), phases shaded."""
    if against == "tokens":
        to_x, label = tokens_axis(run.train)
    else:

        def to_x(steps):
            return dollars_at_steps(run, steps)

        label = f"dollars spent (at {usd(run.price_per_hour)}/h)"
    return plot_loss(path, run.train, run.evals, to_x, label, background=lambda axes: _shade_phases(axes, run, to_x))


def plot_throughput_and_lr(run: RunData, path: Path) -> Path:
    figure, (top, bottom) = new_axes(height=2.6, rows=2)
    steps = [r["step"] for r in run.train]
    top.plot(steps, [r["tokens_per_s"] for r in run.train], lw=1.2)
    top.set_ylabel("tokens/s")
    top.set_ylim(bottom=0)
    bottom.plot(steps, [r["lr"] for r in run.train], lw=1.2, color="tab:orange")
    bottom.set_ylabel("learning rate")
    bottom.set_xlabel("optimizer step")
    for axes in (top, bottom):
        _shade_phases(axes, run, lambda s: s)
        axes.grid(alpha=0.3)
    figure.savefig(path, dpi=110)
    return path


def plot_forecast(run: RunData, fit: LossFit, path: Path) -> Path:
    """The measured train loss against tokens, the fitted law out to the end of the plan, and its band."""
    figure, (axes,) = new_axes()
    tokens_per_step = run.train[-1]["tokens"] / run.train[-1]["step"]
    end_tokens = max(run.end_step * tokens_per_step, run.train[-1]["tokens"])
    unit, label = token_unit(end_tokens)
    axes.plot(
        [r["tokens"] / unit for r in run.train],
        [r["loss"] for r in run.train],
        lw=1.0,
        color="tab:blue",
        label="train loss (measured)",
    )
    x = np.linspace(fit.first_tokens, end_tokens, 200)
    y, band = fit.loss_at(x), BAND_SIGMAS * fit.sd_at(x)
    axes.fill_between(
        x / unit, y - band, y + band, color="tab:orange", alpha=0.25, lw=0, label=f"forecast +/- {BAND_SIGMAS:g} sd"
    )
    axes.plot(
        x / unit,
        y,
        "--",
        color="tab:orange",
        lw=1.4,
        label=f"fit: {fit.irreducible:.2f} + {fit.amplitude:.2f} (D/D0)^-{fit.exponent:.2f}",
    )
    axes.axvspan(fit.first_tokens / unit, fit.last_tokens / unit, color="#eeeeee", zorder=0, lw=0)
    axes.set_xlabel(label)
    axes.set_ylabel("loss (nats/token)")
    low = min(float((y - band).min()), min(r["loss"] for r in run.train))
    axes.set_ylim(low - 0.05 * abs(low), max(r["loss"] for r in run.train if r["tokens"] >= fit.first_tokens) * 1.1)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    axes.set_title("where the loss is heading (grey: the fitted stretch; a final decay drops it further)", fontsize=9)
    figure.savefig(path, dpi=110)
    return path


def forecast_section(run: RunData, output: Path) -> list[str]:
    fit = fit_run(run.train, *run.stable_steps)
    if fit is None:
        return [
            f"No forecast yet: the fit needs more logged steps between steps {run.stable_steps[0]:,} and "
            f"{run.stable_steps[1]:,} (after the warmup, before any decay)."
        ]
    tokens_per_step = run.train[-1]["tokens"] / run.train[-1]["step"]
    end_tokens = run.end_step * tokens_per_step
    loss, sd = float(fit.loss_at(end_tokens)), float(fit.sd_at(end_tokens))
    return [
        f"![forecast]({plot_forecast(run, fit, output / 'forecast.png').name})",
        "",
        f"Fitted over steps {round(fit.first_tokens / tokens_per_step):,}-{round(fit.last_tokens / tokens_per_step):,} "
        f"(the later half of the stable phase so far): "
        f"L = {fit.irreducible:.3f} + {fit.amplitude:.3f} x (D / {human_count(fit.tokens_0)})^-{fit.exponent:.3f}. "
        f"At the end of the plan (step {run.end_step:,}, {human_count(end_tokens)} tokens) the curve is "
        f"forecast at {loss:.3f} +/- {BAND_SIGMAS * sd:.3f}, before any final decay. "
        f"`hf-pretrain plan --run RUN_DIR --tokens N` prices going further.",
    ]


def plot_cost_per_loss_point(run: RunData, path: Path) -> Path:
    """A bar per phase: dollars per unit of loss it bought (no bar, a note, where the loss rose)."""
    figure, (axes,) = new_axes(height=3.5)
    names = [row.name for row in run.phases]
    values = [row.cost_per_loss_point or 0.0 for row in run.phases]
    bars = axes.bar(
        names,
        values,
        color=[PHASE_COLOURS[i % len(PHASE_COLOURS)] for i in range(len(names))],
        edgecolor="black",
        lw=0.6,
    )
    for bar, row in zip(bars, run.phases, strict=True):
        note = "no drop" if row.cost_per_loss_point is None else usd(row.cost_per_loss_point)
        axes.annotate(
            note,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 2),
            textcoords="offset points",
        )
    axes.set_ylabel("$ per loss point")
    axes.set_title("what each phase paid for a unit of loss", fontsize=10)
    axes.grid(axis="y", alpha=0.3)
    figure.savefig(path, dpi=110)
    return path


# ---------------------------------------------------------------------- tables
def sample_steps(samples: list[dict[str, Any]], milestone_interval: int) -> list[int]:
    """Steps to show: the milestones (and the last step) when the run keeps milestones, else all."""
    steps = sorted({s["step"] for s in samples})
    if milestone_interval and steps:
        return [s for s in steps if s % milestone_interval == 0 or s == steps[-1]]
    return steps


def samples_table(samples: list[dict[str, Any]], milestone_interval: int = 0) -> str:
    """Rows are steps, columns the prompts: how the completions changed as the model trained."""
    prompts = list(dict.fromkeys(s["prompt"] for s in samples))
    by_key = {(s["step"], s["prompt"]): s for s in samples}
    lines = [
        "| step | tokens | " + " | ".join(f"`{table_cell(p)}`" for p in prompts) + " |",
        "|---|---|" + "---|" * len(prompts),
    ]
    for step in sample_steps(samples, milestone_interval):
        row = [by_key.get((step, p)) for p in prompts]
        tokens = next((s["tokens"] for s in row if s), 0)
        lines.append(
            f"| {step} | {human_count(tokens)} | "
            + " | ".join(table_cell(s["completion"]) if s else " " for s in row)
            + " |"
        )
    return "\n".join(lines) + "\n"


def benchmarks_table(records: list[dict[str, Any]]) -> str:
    """Rows are steps, columns `task metric`, from `evaluate_checkpoint`'s records
    ({"step", "tasks": {task: {metric: percent, metric_stderr: percent}}})."""
    values = {
        (r["step"], f"{task} {metric}"): value
        for r in records
        for task, metrics in r["tasks"].items()
        for metric, value in metrics.items()
        if not metric.endswith("_stderr")
    }
    columns = list(dict.fromkeys(column for _, column in values))
    lines = ["| step | " + " | ".join(table_cell(c) for c in columns) + " |", "|---|" + "---|" * len(columns)]
    for step in sorted({r["step"] for r in records}):
        cells = [values.get((step, c)) for c in columns]
        lines.append(
            f"| {step} | " + " | ".join(f"{v:.4g}" if isinstance(v, (int, float)) else " " for v in cells) + " |"
        )
    return "\n".join(lines) + "\n"


def summary(run: RunData) -> str:
    last = run.train[-1]
    hours = last["elapsed"] / 3600
    parts = [
        f"{last['step']:,} steps",
        f"{human_count(last['tokens'])} tokens",
        f"{hours:,.2f} h",
        f"last train loss {last['loss']:.3f}",
    ]
    if run.evals:
        parts.append(f"best validation loss {min(r['val_loss'] for r in run.evals):.3f}")
    if run.price_per_hour:
        average_rate = last["tokens"] / last["elapsed"] if last["elapsed"] else 0.0
        per_billion = dollars_per_billion_tokens(average_rate, run.price_per_hour)
        parts.append(
            f"{usd(hours * run.price_per_hour)} at {usd(run.price_per_hour)}/h ({usd(per_billion)} per billion tokens)"
        )
    return " | ".join(parts)


def sessions_section(run_dir: Path, price_per_hour: float) -> list[str]:
    """Every session of the run (sessions.jsonl): where, its start-up and what it went to, how it ended,
    the steps it lost and what they cost (run_folder/sessions.py)."""
    from hf_pretrain.run_folder.sessions import report_section, sessions

    return report_section(sessions(run_dir), price_per_hour or None)


# ---------------------------------------------------------------------- the page
def write_report(run_dir: Path, output: Path, price: float | None = None) -> Path:
    """report.md and its PNGs in `output`; returns the page's path."""
    run = load_run(run_dir, price)
    output.mkdir(parents=True, exist_ok=True)
    page = [f"# Run report: {run.name}", "", summary(run), "", "## Loss", ""]
    page.append(f"![loss against tokens]({plot_run_loss(run, output / 'loss_vs_tokens.png', 'tokens').name})")
    if run.price_per_hour:
        page.append(f"![loss against dollars]({plot_run_loss(run, output / 'loss_vs_dollars.png', 'dollars').name})")
    else:
        page.append(
            "\nNo loss-against-dollars plot: the run has no price (set reporting.price_per_hour or pass `--price`)."
        )
    page += ["", "## Forecast", ""] + forecast_section(run, output)
    page += [
        "",
        "## Throughput and learning rate",
        "",
        f"![tokens/s and learning rate]({plot_throughput_and_lr(run, output / 'throughput_lr.png').name})",
        "",
        "## Phases",
        "",
    ]
    if run.phases:
        page += [
            markdown_table(run.phases),
            f"![cost per loss point]({plot_cost_per_loss_point(run, output / 'cost_per_loss_point.png').name})",
        ]
        if not run.price_per_hour:
            page.append("\nCosts are zero: the run has no price (set reporting.price_per_hour or pass `--price`).")
    else:
        page.append("No phase has ended yet, or the recipe names none (reporting.phases).")
    page += ["", "## Sessions", ""] + sessions_section(run_dir, run.price_per_hour)
    page += ["", "## Samples", ""]
    page.append(
        samples_table(run.samples, run.milestone_interval)
        if run.samples
        else "No samples yet (samples.jsonl is written at every evaluation)."
    )
    page += ["", "## Benchmarks", ""]
    page.append(
        benchmarks_table(run.benchmarks)
        if run.benchmarks
        else "No benchmark scores (benchmarks.jsonl) in this run folder."
    )
    report = output / "report.md"
    report.write_text("\n".join(page).rstrip() + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="hf-pretrain report",
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n", 1)[1],
    )
    parser.add_argument("run_dir", help="a run folder (the recipe's output_dir), or its URL (s3://...)")
    parser.add_argument("--output", type=Path, help="where the page and plots go (unset: RUN_DIR/report)")
    parser.add_argument(
        "--price_per_hour", type=float, ge=0, help="$ per hour for the whole job (unset: the run's price_per_hour)"
    )
    args = parser.parse_args(argv)
    price = args.price_per_hour
    if price is not None and (price < 0 or not math.isfinite(price)):
        parser.refuse("--price_per_hour must be a non-negative number of dollars per hour")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("hf-pretrain report: needs matplotlib: pip install matplotlib", file=sys.stderr)
        return EXIT_CONFIG
    from hf_pretrain.store.location import Location
    from hf_pretrain.store.reach import StoreRefused
    from hf_pretrain.store.run.reading import readable

    run = Location.of(args.run_dir)  # local or a store: decided here, once, and handed down
    try:
        run_dir = readable(run, checkpoint=False)  # a URL: its records, pulled into the cache
    except StoreRefused as exc:
        print(f"hf-pretrain report: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    output = args.output or run_dir / "report"
    if run.in_store and not args.output:  # not inside the cache's read-only view: beside the command
        output = Path("reports") / args.run_dir.split("://", 1)[1].strip("/").replace("/", "__")
    try:
        page = write_report(run_dir, Path(output), price)
    except FileNotFoundError as exc:
        print(f"hf-pretrain report: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"written: {page} and its plots in {page.parent}")
    return 0
