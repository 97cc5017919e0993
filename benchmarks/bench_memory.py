"""Benchmark: the doctor's memory estimate (economics/memory.py) against the measured peak of real CPU steps.

Each shape builds the recipe's model and optimizer as training does, prepares them with an
Accelerator on the CPU (fp32, or bf16 autocast) and runs the loop's own optimizer step
(`training.step.TrainStep`: forward with `labels` + `shift_labels`, backward, clipping, AdamW) on
one or more micro-batches. The first step creates AdamW's moments; the second is measured: its peak of
allocated tensor bytes (PyTorch's profiler, memory events of the CPU allocator, not the process's
RSS) plus what was already allocated before it (weights and moments). Each shape runs in its own
process.

    python benchmarks/bench_memory.py                 # CPU, the default shapes (docs/gpu.md), ~15 minutes
    python benchmarks/bench_memory.py --shapes smoke:8x128:no
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys

import torch

# recipe[-layers]:micro_batch x seq_len[x accumulation]:precision[:gc]
DEFAULT_SHAPES = [
    "smoke:8x128:no",
    "smoke:8x128x2:no",
    "smoke:8x128x2:bf16",
    "smoke:32x256x2:no",
    "134m:1x512:no",
    "134m:1x512x2:no",
    "134m:1x512:bf16",
    "134m:1x512:no:gc",
    "134m:1x512x2:no:gc",
    "1b-2:1x512:no",
    "1b-2:1x512x2:no",
]


def parse_shape(shape: str):
    parts = shape.split(":")
    name, _, layers = parts[0].partition("-")
    micro, seq, accum = (parts[1].split("x") + ["1"])[:3]
    return (
        name,
        int(layers) if layers else None,
        int(micro),
        int(seq),
        int(accum),
        parts[2],
        len(parts) > 3 and parts[3] == "gc",
    )


def peak_allocated(step) -> int:
    """Highest sum of live tensor bytes the CPU allocator reported while `step()` ran, from zero at the start."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def measure(shape: str) -> dict:
    from accelerate import Accelerator

    from hf_pretrain.config import load_recipe
    from hf_pretrain.economics.memory import memory_of
    from hf_pretrain.machine.run_profile import THE_CPU, run_profile
    from hf_pretrain.model.llama import (
        build_model,
        enable_activation_checkpointing,
        llama_config,
        tokenizer_size_of,
        train_in_compute_dtype,
    )
    from hf_pretrain.optim.build import build_optimizer
    from hf_pretrain.training.step import TrainStep

    name, layers, micro, seq, accum, precision, gc = parse_shape(shape)
    recipe = load_recipe(name)
    model_cfg = dataclasses.replace(recipe.model, **({"num_hidden_layers": layers} if layers else {}))
    recipe = recipe.replace(
        micro_batch_size=micro,
        global_batch_tokens=micro * seq * accum,
        mixed_precision=precision,
        gradient_checkpointing=gc,
        liger=False,
        compile=False,
        seq_len=seq,
    )
    recipe = dataclasses.replace(recipe, model=model_cfg)
    tokenizer_size = tokenizer_size_of(recipe.data)
    step = run_profile(recipe.step_as_written, THE_CPU).step  # the step it runs here, on this CPU
    estimate = memory_of(
        recipe.model, step, tokenizer_size, seq_len=seq, global_batch_tokens=recipe.train.global_batch_tokens
    )

    accelerator = Accelerator(cpu=True, mixed_precision=precision)
    torch.manual_seed(0)
    config = llama_config(recipe.model, tokenizer_size)
    model = build_model(config)
    if gc:
        enable_activation_checkpointing(model)
    train_in_compute_dtype(model)  # as training/loop.py does
    optimizer = build_optimizer(model, recipe.optim, fused=False)
    model, optimizer = accelerator.prepare(model, optimizer)
    batches = iter([torch.randint(0, config.vocab_size, (micro, seq + 1)) for _ in range(2 * accum)])
    step = TrainStep(
        accelerator,
        model,
        optimizer,
        batches,
        recipe.optim,
        grad_accum=accum,
        lr_of=lambda _: recipe.optim.learning_rate,
    )
    step(1)  # creates AdamW's moments
    before = sum(t.nbytes for t in model.parameters()) + sum(
        v.nbytes for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)
    )
    peak = before + peak_allocated(lambda: step(2))
    return {
        "shape": shape,
        "parameters": estimate.parameters,
        "estimate": estimate.total(gc),
        "measured": peak,
        "static_estimate": estimate.static,
        "static_measured_before_step": before,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    print(
        f"# {datetime.date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}"
    )
    print("| shape | parameters | estimate (MiB) | measured peak (MiB) | estimate / measured |")
    print("|---|---|---|---|---|")
    for shape in args.shapes:
        out = subprocess.run(
            [sys.executable, __file__, "--child", shape],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, HF_HUB_OFFLINE="1"),
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"| {shape} | {r['parameters'] / 1e6:.1f}M | {r['estimate'] / 2**20:,.0f} | "
            f"{r['measured'] / 2**20:,.0f} | {r['estimate'] / r['measured']:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
