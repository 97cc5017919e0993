"""A 90,000-step run folder, synthetic, and what reading it costs: `metrics.jsonl` (a record every
step, an evaluation every 100), `samples.jsonl`, the resume's truncation, the loop's history at
start-up, and `hf-pretrain report` with its plots.

    python benchmarks/bench_run_files.py [--steps 90000] [--log_interval 1] [--eval_interval 100] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import tempfile
import time
from pathlib import Path

from hf_pretrain.config import load_recipe, save_recipe
from hf_pretrain.run_folder.run_dir import RunDir, read_jsonl, truncate_jsonl

PROMPTS = ["The capital of France is", "def fibonacci(n):", "In a shocking discovery, scientists found that"]


def synthetic_run(folder: Path, steps: int, log_interval: int, eval_interval: int) -> RunDir:
    """What the 1b recipe's loop writes, with a smooth loss curve and noise: the same keys, the same sizes."""
    run = RunDir(folder)
    folder.mkdir(parents=True, exist_ok=True)
    recipe = load_recipe(
        "1b",
        {"output_dir": str(folder), "log_interval": log_interval, "eval_interval": eval_interval, "max_steps": steps},
    )
    save_recipe(recipe, run.resolved_recipe)
    rng = random.Random(0)
    tokens_per_step, price = recipe.train.global_batch_tokens, recipe.reporting.price_per_hour
    with run.metrics.open("w") as metrics, run.samples.open("w") as samples:
        for step in range(log_interval, steps + 1, log_interval):
            tokens, elapsed = step * tokens_per_step, step * 2.2
            loss = 2.2 + 8.0 * (step / 10) ** -0.35 + rng.gauss(0, 0.02)
            record = {
                "kind": "train",
                "step": step,
                "tokens": tokens,
                "loss": loss,
                "lr": 3e-4 * math.cos(step / steps),
                "grad_norm": 0.3 + rng.random() * 0.1,
                "tokens_per_s": 59_600 + rng.gauss(0, 300),
                "elapsed": elapsed,
                "data_wait_share": 0.001,
                "mfu": 0.42,
                "peak_memory_gib": 61.3,
                "cost": elapsed / 3600 * price,
                "projected_cost": steps * 2.2 / 3600 * price,
            }
            metrics.write(json.dumps(record) + "\n")
            if step % eval_interval == 0:
                metrics.write(
                    json.dumps({"kind": "eval", "step": step, "tokens": tokens, "val_loss": loss + 0.05}) + "\n"
                )
                for prompt in PROMPTS:
                    text = " ".join(
                        rng.choice(["the", "of", "model", "data", "=", "return", "Paris"]) for _ in range(48)
                    )
                    samples.write(
                        json.dumps({"step": step, "tokens": tokens, "prompt": prompt, "completion": text}) + "\n"
                    )
    return run


def timed(function, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=90_000)
    parser.add_argument("--log_interval", type=int, default=1, help="1: the worst case (the 1b recipe logs every 10)")
    parser.add_argument("--eval_interval", type=int, default=100)
    parser.add_argument("--keep", type=Path, default=None, help="write the run folder here and keep it")
    args = parser.parse_args()
    from hf_pretrain.run_commands import report

    scratch = Path(tempfile.mkdtemp()) if args.keep is None else args.keep
    try:
        seconds, run = timed(synthetic_run, scratch / "run", args.steps, args.log_interval, args.eval_interval)
        results = {
            "steps": args.steps,
            "metrics_records": sum(1 for _ in run.metrics.open()),
            "metrics_mb": round(run.metrics.stat().st_size / 1e6, 1),
            "samples_records": sum(1 for _ in run.samples.open()),
            "samples_mb": round(run.samples.stat().st_size / 1e6, 1),
            "write_s": seconds,
        }
        results["read_jsonl_metrics_s"], _ = timed(read_jsonl, run.metrics)
        # a resume from the newest checkpoint: nothing after it to drop
        results["truncate_nothing_s"], _ = timed(truncate_jsonl, run.metrics, after_step=args.steps)
        # a resume from a checkpoint 1,000 steps back: the tail goes
        results["truncate_tail_s"], _ = timed(truncate_jsonl, run.metrics, after_step=args.steps - 1000)
        results["report_s"], _ = timed(report.main, [str(run.path), "--output", str(scratch / "report")])
    finally:
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
