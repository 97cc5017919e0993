"""Benchmark: hf-pretrain's training loop against a bare PyTorch loop, same model, data and batch.

Both run in this process, one after the other, on the `smoke` model (or `--recipe`), and the
script prints both tokens/s figures and their ratio. The bare loop is the floor of overhead: a
plain forward/backward/AdamW step with manual gradient accumulation and no logging. The first
`--warmup` steps of each are excluded.

    python benchmarks/bench_loop.py                  # CPU, smoke model, ~1 minute
    python benchmarks/bench_loop.py --steps 100 --recipe smoke
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from hf_pretrain.config import load_recipe
from hf_pretrain.data.loader import PackedDataset
from hf_pretrain.data.prepare_run import prepare
from hf_pretrain.data.prepared import read_meta
from hf_pretrain.data.tokenizer import load_tokenizer
from hf_pretrain.model.llama import build_model, llama_config
from hf_pretrain.optim.build import Schedule, build_optimizer, set_learning_rate
from hf_pretrain.run_folder.run_dir import read_jsonl
from hf_pretrain.train import run_training


def bare_pytorch_tokens_per_s(recipe, steps: int, warmup: int) -> float:
    """The same model, optimizer, schedule and batches as the recipe, with nothing else around them."""
    data_dir = Path(recipe.data.data_dir)
    tokenizer = load_tokenizer(data_dir)
    meta = read_meta(data_dir)
    shards = [data_dir / s["file"] for s in meta["splits"]["train"]["shards"]]
    dataset = PackedDataset(shards, recipe.data.seq_len, meta["dtype"])
    torch.manual_seed(recipe.train.seed)
    model = build_model(
        llama_config(
            recipe.model, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
        )
    )
    model.train()
    optimizer = build_optimizer(model, recipe.optim, fused=False)
    accum = recipe.grad_accum_steps(1)
    micro = recipe.train.micro_batch_size
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(recipe.train.seed))
    position = 0
    schedule = Schedule(recipe.optim, max_steps=recipe.train.max_steps)
    for step in range(steps):
        if step == warmup:
            start = time.perf_counter()
        set_learning_rate(optimizer, schedule.lr(step + 1))  # optimizer steps count from 1
        for _ in range(accum):
            indices = order[position % len(order) : position % len(order) + micro]
            if len(indices) < micro:
                indices = order[:micro]
            position += micro
            tokens = torch.stack([dataset[int(i)] for i in indices])
            logits = model(input_ids=tokens[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return (steps - warmup) * recipe.train.global_batch_tokens / (time.perf_counter() - start)


def hf_pretrain_tokens_per_s(recipe, warmup: int) -> float:
    """tokens/s that hf-pretrain itself logged after the warm-up window."""
    run_training(recipe)
    records = [r for r in read_jsonl(Path(recipe.train.output_dir) / "metrics.jsonl") if r["kind"] == "train"]
    timed = [r for r in records if r["step"] > warmup]
    seconds = sum(recipe.train.global_batch_tokens * warmup / r["tokens_per_s"] for r in timed)
    return len(timed) * warmup * recipe.train.global_batch_tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="smoke")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10, help="steps excluded from timing (also the log window)")
    args = parser.parse_args()
    assert args.steps % args.warmup == 0, "--steps must be a multiple of --warmup (the log window)"

    with tempfile.TemporaryDirectory() as tmp:
        recipe = load_recipe(
            args.recipe,
            {
                "data_dir": f"{tmp}/data",
                "output_dir": f"{tmp}/run",
                "max_steps": args.steps,
                "warmup_steps": min(args.warmup, args.steps - 1),
                "log_interval": args.warmup,
                "eval_interval": 0,
                "save_interval": args.steps,
                "resume": "none",
                "report_to": "none",
            },
        )
        prepare(recipe, log=lambda _: None)
        bare = bare_pytorch_tokens_per_s(recipe, args.steps, args.warmup)
        ours = hf_pretrain_tokens_per_s(recipe, args.warmup)

    print(
        f"\nhardware: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, {'CUDA' if torch.cuda.is_available() else 'CPU'} | "
        f"{datetime.date.today().isoformat()}"
    )
    print(
        f"recipe {args.recipe}: {args.steps} steps of {recipe.train.global_batch_tokens} tokens, first {args.warmup} excluded"
    )
    print(f"bare PyTorch loop: {bare:,.0f} tokens/s")
    print(f"hf-pretrain loop:  {ours:,.0f} tokens/s")
    print(f"ratio (hf-pretrain / bare): {ours / bare:.3f}")


if __name__ == "__main__":
    main()
