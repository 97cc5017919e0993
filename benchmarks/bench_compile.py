"""Benchmark: what torch.compile costs and buys on the training step, whole-model or regional.

Each variant runs in its own process with an empty inductor cache (a cold compile, what a fresh
machine pays), on the loop's own call (`model(input_ids, labels, shift_labels)`, backward, AdamW):

- `eager`: no compilation;
- `full`: `torch.compile(model)`, what `compile: true` does (Accelerate's `dynamo_backend=inductor`);
- `regional`: Accelerate's `compile_regions`, each decoder layer compiled once and reused.

Compile time is the first step's extra seconds over the median of the others. Shapes: `smoke`,
or `1b-2layer` (the 1b recipe's width, heads and vocabulary with 2 decoder layers: what fits a CPU).

    python benchmarks/bench_compile.py --shape 1b-2layer --steps 4      # CPU, ~15 minutes
    python benchmarks/bench_compile.py --shape smoke --variants eager full
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

import torch

SHAPES = {
    "smoke": ("smoke", {}, 8, 128),
    "1b-2layer": ("1b", {"num_hidden_layers": 2}, 1, 256),
}


def run_variant(shape: str, variant: str, steps: int) -> dict:
    """One variant in this process: seconds per step, graphs compiled, recompilations, graph breaks."""
    import dataclasses

    from torch._dynamo.utils import counters

    from hf_pretrain.config import load_recipe
    from hf_pretrain.model.llama import build_model, llama_config, tokenizer_size_of
    from hf_pretrain.training.compiling import compile_counts

    name, model_overrides, micro_batch, seq_len = SHAPES[shape]
    recipe = load_recipe(name)
    recipe = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, **model_overrides))
    config = llama_config(recipe.model, tokenizer_size_of(recipe.data))
    torch.manual_seed(0)
    model = build_model(config)
    model.train()
    net = model
    if variant == "full":
        net = torch.compile(model)
    elif variant == "regional":
        from accelerate.utils import compile_regions

        net = compile_regions(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, config.vocab_size, (micro_batch, seq_len + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:].contiguous()
    counters.clear()
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = net(input_ids=inputs, labels=targets, shift_labels=targets).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
    steady = statistics.median(seconds[1:])
    counts = compile_counts()
    return {
        "shape": shape,
        "variant": variant,
        "parameters": sum(p.numel() for p in model.parameters()),
        "tokens_per_step": micro_batch * seq_len,
        "first_step_s": seconds[0],
        "step_s": steady,
        "compile_s": seconds[0] - steady,
        **counts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b-2layer")
    parser.add_argument("--variants", nargs="+", default=["eager", "full", "regional"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_variant(args.shape, args.child, args.steps)))
        return
    print(
        f"# {datetime.date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, shape {args.shape}"
    )
    print("| variant | first step (s) | later steps (s) | compile (s) | graphs | recompilations | graph breaks |")
    print("|---|---|---|---|---|---|---|")
    for variant in args.variants:
        with tempfile.TemporaryDirectory() as cache:  # a cold compile: nothing reused from earlier runs
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, HF_HUB_OFFLINE="1")
            out = subprocess.run(
                [sys.executable, __file__, "--shape", args.shape, "--steps", str(args.steps), "--child", variant],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"| {variant} | {r['first_step_s']:.1f} | {r['step_s']:.2f} | "
            f"{r['compile_s']:.1f} | {r['graphs']} | {r['recompilations']} | {r['graph_breaks']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
