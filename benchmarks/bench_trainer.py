"""Benchmark: hf-pretrain's training loop against `transformers.Trainer`, the trainer a user would
otherwise pick, on the same model, data, batch, precision and optimizer.

Both sides train the recipe's Llama (`smoke` by default) from the same prepared shards
(`PackedDataset`), with the same micro-batch, gradient accumulation and global batch, the same
precision (fp32 on CPU, the recipe's on GPU), the same AdamW object settings (hf_pretrain.optim.build,
handed to Trainer through `optimizers=`) and learning-rate schedule, the same gradient clipping,
the same number of DataLoader workers, and both log every `--warmup` steps. Each run is its own
process (Accelerate's state is a process singleton and both sides use Accelerate); the two
alternate for `--rounds` rounds (AB, BA, ...); each round's two runs, back to back, give a ratio of
their median `--warmup`-step windows, and the median of those ratios is the figure, so drift on a
shared machine cancels. The first `--warmup` steps of every run are excluded.

    python benchmarks/bench_trainer.py                        # CPU, smoke model, ~5 minutes on 2 cores
    python benchmarks/bench_trainer.py --steps 40 --warmup 10 --rounds 4
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from hf_pretrain.config import Recipe, load_recipe
from hf_pretrain.data.loader import PackedDataset
from hf_pretrain.data.prepare_run import prepare
from hf_pretrain.data.prepared import read_meta
from hf_pretrain.data.tokenizer import load_tokenizer
from hf_pretrain.machine.run_profile import run_profile, this_machine
from hf_pretrain.model.llama import build_model, llama_config
from hf_pretrain.optim.build import Schedule, build_optimizer
from hf_pretrain.run_folder.run_dir import read_jsonl
from hf_pretrain.train import run_training

ROOT = Path(__file__).resolve().parent.parent
CONTENDERS = ("hf-pretrain", "trainer")


def bench_recipe(name: str, data_dir: Path, output_dir: Path, steps: int, warmup: int) -> Recipe:
    """The recipe with a short schedule: no evaluation, one save at the end, a log line every `warmup` steps."""
    recipe = load_recipe(name)
    return load_recipe(
        name,
        {
            "data_dir": str(data_dir),
            "output_dir": str(output_dir),
            "max_steps": steps,
            "warmup_steps": min(recipe.optim.warmup_steps, steps - 1),
            "log_interval": warmup,
            "eval_interval": 0,
            "save_interval": steps,
            "resume": "none",
            "report_to": "none",
            "phases": {},
            "early_stop_cost_per_loss_point": 0.0,
            "early_stop_patience": 0,
        },
    )


def hf_pretrain_window_rates(recipe: Recipe, warmup: int) -> list[float]:
    """tokens/s of each `warmup`-step window after the warm-up, as hf-pretrain's own loop logged them."""
    outcome = run_training(recipe)
    assert outcome.exit_code == 0, outcome.message
    records = read_jsonl(Path(recipe.train.output_dir) / "metrics.jsonl")
    return [r["tokens_per_s"] for r in records if r["kind"] == "train" and r["step"] > warmup]


def trainer_window_rates(recipe: Recipe, warmup: int) -> list[float]:
    """tokens/s of each `warmup`-step window after the warm-up, for transformers.Trainer on the same
    model, data, batch, precision and optimizer."""
    from torch.optim.lr_scheduler import LambdaLR
    from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed

    cuda = torch.cuda.is_available()
    train_cfg, data_dir = recipe.train, Path(recipe.data.data_dir)
    tokenizer = load_tokenizer(data_dir)
    meta = read_meta(data_dir)
    shards = [data_dir / s["file"] for s in meta["splits"]["train"]["shards"]]
    dataset = PackedDataset(shards, recipe.data.seq_len, meta["dtype"], preload=recipe.data.preload)

    set_seed(train_cfg.seed)
    model = build_model(
        llama_config(
            recipe.model, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
        )
    )
    if cuda:
        model.to("cuda")  # fused AdamW needs its parameters on the GPU before it is built
    optimizer = build_optimizer(model, recipe.optim, fused=cuda)
    # hf-pretrain sets its Schedule's rate before each optimizer step (counted from 1); LambdaLR
    # (0-based) multiplies the peak by the same factor
    rates = Schedule(recipe.optim, max_steps=recipe.train.max_steps)
    schedule = LambdaLR(optimizer, lambda step: rates.lr(step + 1) / recipe.optim.learning_rate)

    def collate(samples: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        tokens = torch.stack(samples)
        targets = tokens[:, 1:].contiguous()
        # targets are already shifted, as in hf-pretrain: `shift_labels` stops the loss shifting again
        return {"input_ids": tokens[:, :-1], "labels": targets, "shift_labels": targets}

    class Timer(TrainerCallback):
        """The wall clock at the end of every `warmup`-th step, the same windows hf-pretrain logs."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % warmup == 0:
                if cuda:
                    torch.cuda.synchronize()
                self.times.append(time.perf_counter())

    precision = run_profile(
        recipe.step_as_written, this_machine()
    ).accelerate_precision  # Accelerate's word: `no` for fp32
    args = TrainingArguments(
        output_dir=train_cfg.output_dir,
        max_steps=train_cfg.max_steps,
        per_device_train_batch_size=train_cfg.micro_batch_size,
        gradient_accumulation_steps=recipe.grad_accum_steps(1),
        max_grad_norm=recipe.optim.grad_clip,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        tf32=recipe.compute.tf32 if cuda else None,
        use_cpu=not cuda,
        torch_compile=recipe.compute.compile,
        gradient_checkpointing=recipe.compute.gradient_checkpointing,
        dataloader_num_workers=recipe.data.num_workers,
        logging_steps=warmup,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        seed=train_cfg.seed,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    timer = Timer()
    Trainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=collate,
        optimizers=(optimizer, schedule),
        callbacks=[timer],
    ).train()
    window_tokens = warmup * train_cfg.global_batch_tokens
    return [window_tokens / (end - start) for start, end in zip(timer.times, timer.times[1:], strict=False)]


def run_contender(contender: str, args: argparse.Namespace, data_dir: Path, work: Path, round_: int) -> list[float]:
    """One timed run in a fresh process; returns the tokens/s of its windows."""
    result = work / f"{contender}-{round_}.json"
    command = [
        sys.executable,
        __file__,
        "--worker",
        contender,
        "--data-dir",
        str(data_dir),
        "--result",
        str(result),
        "--output-dir",
        str(work / f"{contender}-{round_}"),
        "--recipe",
        args.recipe,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
    ]
    env = dict(
        os.environ,
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{contender} run failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return json.loads(result.read_text())["window_tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="smoke")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10, help="steps excluded from timing (also the log interval)")
    parser.add_argument("--rounds", type=int, default=4, help="runs of each contender, alternating (default 4)")
    parser.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    parser.add_argument("--output-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    assert args.steps % args.warmup == 0 and args.steps > args.warmup, (
        "--steps must be a multiple of --warmup (the log interval) and larger"
    )

    if args.worker:
        recipe = bench_recipe(args.recipe, Path(args.data_dir), Path(args.output_dir), args.steps, args.warmup)
        measure = hf_pretrain_window_rates if args.worker == "hf-pretrain" else trainer_window_rates
        Path(args.result).write_text(json.dumps({"window_tokens_per_s": measure(recipe, args.warmup)}))
        return

    runs: dict[str, list[list[float]]] = {c: [] for c in CONTENDERS}  # per round, the windows' tokens/s
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        recipe = bench_recipe(args.recipe, work / "data", work / "unused", args.steps, args.warmup)
        prepare(recipe, log=lambda _: None)
        for round_ in range(args.rounds):
            for contender in CONTENDERS if round_ % 2 == 0 else CONTENDERS[::-1]:
                runs[contender].append(run_contender(contender, args, work / "data", work, round_))
                print(
                    f"round {round_ + 1}: {contender}: "
                    + ", ".join(f"{r:,.0f}" for r in runs[contender][-1])
                    + " tokens/s",
                    flush=True,
                )

    device = (
        torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    )
    print(f"\nhardware: {device}, torch {torch.__version__} | {datetime.date.today().isoformat()}")
    print(
        f"recipe {args.recipe}: {args.steps} steps of {recipe.train.global_batch_tokens:,} tokens "
        f"(micro-batch {recipe.train.micro_batch_size} x {recipe.grad_accum_steps(1)} accumulation), first "
        f"{args.warmup} excluded, windows of {args.warmup} steps, {args.rounds} alternating rounds"
    )
    # A shared machine drifts by more than the difference being measured, so each round's two runs,
    # back to back, are compared with each other, and the median of those ratios is the figure.
    per_run = {c: [statistics.median(windows) for windows in runs[c]] for c in CONTENDERS}
    ratios = [ours / theirs for ours, theirs in zip(per_run["hf-pretrain"], per_run["trainer"], strict=True)]
    for contender, label in (("hf-pretrain", "hf-pretrain loop:    "), ("trainer", "transformers.Trainer:")):
        print(
            f"{label} " + ", ".join(f"{r:,.0f}" for r in per_run[contender]) + " tokens/s (median window of each run)"
        )
    print("ratio per round (hf-pretrain / Trainer): " + ", ".join(f"{r:.3f}" for r in ratios))
    print(f"ratio (hf-pretrain / Trainer), median of the rounds: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
