"""How honest is the forecast? Fit the loss curve of a finished run up to a cut, predict the rest.

    python benchmarks/bench_forecast.py runs/smoke [runs/long ...] [--cut 0.5]

For each run folder: the power law (economics/forecast.py) is fitted to the train records of the
stable phase up to `cut` of it, exactly as the loop fits it at that step (its later half), then
compared with every later logged loss of the stable phase, and with the last logged loss of the
run (after its final decay, which the fit does not model). Prints one table row per run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from hf_pretrain.economics.forecast import BAND_SIGMAS, fit_run
from hf_pretrain.optim.build import Cooldown, Schedule
from hf_pretrain.run_folder.run_dir import RunDir, read_jsonl


def honesty(run_dir: Path, cut: float) -> dict:
    run = RunDir(run_dir)
    recipe = run.load_recipe()
    records = read_jsonl(run.metrics)
    train = [r for r in records if r["kind"] == "train"]
    cooldowns = [r for r in records if r["kind"] == "cooldown"]
    cooldown = Cooldown(cooldowns[-1]["step"], cooldowns[-1]["end"]) if cooldowns else None
    first, last = Schedule(recipe.optim, max_steps=recipe.train.max_steps).stable_steps(cooldown)
    last = min(last, train[-1]["step"])
    cut_step = first + int(cut * (last - first))
    fit = fit_run(train, first, cut_step)
    later = [r for r in train if cut_step < r["step"] <= last]
    tokens = np.array([r["tokens"] for r in later], dtype=float)
    measured = np.array([r["loss"] for r in later])
    predicted, band = fit.loss_at(tokens), BAND_SIGMAS * fit.sd_at(tokens)
    error = predicted - measured
    end = train[-1]
    return {
        "run": str(run_dir),
        "schedule": recipe.optim.lr_schedule,
        "steps": end["step"],
        "fitted": f"{round(fit.first_tokens / (end['tokens'] / end['step']))}-{cut_step}",
        "predicted": f"{cut_step + 1}-{last}",
        "mean_abs_error": float(np.abs(error).mean()),
        "max_abs_error": float(np.abs(error).max()),
        "error_at_last_stable": float(error[-1]),
        "relative_error_at_last_stable": float(error[-1] / measured[-1]),
        "band_at_last_stable": float(band[-1]),
        "inside_band": float(np.mean(np.abs(error) <= band)),
        "last_loss": end["loss"],
        "predicted_last": float(fit.loss_at(end["tokens"])),
        "decay_bonus": float(fit.loss_at(end["tokens"]) - end["loss"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished run folders")
    parser.add_argument("--cut", type=float, default=0.5, help="share of the stable phase fitted (default 0.5)")
    args = parser.parse_args()
    print(
        "| run | schedule | steps | fitted steps | predicted steps | mean abs error | max abs error | "
        "error at the last stable log (rel.) | +/- band there | logs inside the band | last loss (after decay) | "
        "fit there |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run_dir in args.runs:
        h = honesty(run_dir, args.cut)
        print(
            f"| {h['run']} | {h['schedule']} | {h['steps']} | {h['fitted']} | {h['predicted']} | "
            f"{h['mean_abs_error']:.3f} | {h['max_abs_error']:.3f} | {h['error_at_last_stable']:+.3f} "
            f"({h['relative_error_at_last_stable']:+.1%}) | {h['band_at_last_stable']:.3f} | "
            f"{h['inside_band']:.0%} | {h['last_loss']:.3f} | {h['predicted_last']:.3f} |"
        )


if __name__ == "__main__":
    main()
