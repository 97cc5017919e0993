"""Part (c): the recipe's training step on synthetic tokens, no prepared data: the model, optimizer,
precision (FP8 included), compile, Liger and loss exactly as training builds them
(`training.loop.model_and_optimizer`, `training.step.TrainStep`), fed random token ids of the recipe's
vocabulary and sequence length, so the speed is the recipe's (a step's time does not depend on which
tokens it reads). One process per variant (Accelerate's state is a process singleton; a fresh
process gives each a clean peak-memory count) and one compile per variant: the first step holds it.

The running rate is written after every timed step, so a variant cut at its limit still reports what
it measured. Part (d)'s probes run the same step for two optimizer steps and answer "oom" when the
device runs out of memory (bench/search.py asks them)."""

from __future__ import annotations

import itertools
import time

import torch

from hf_pretrain.bench.variants import DeviceMemory, is_out_of_memory, variant_name
from hf_pretrain.check.figures import Report
from hf_pretrain.config import ComputeConfig, DataConfig, ModelConfig, OptimConfig, TrainConfig
from hf_pretrain.machine.run_profile import RunProfile


def synthetic_batches(vocab_rows: int, micro_batch_size: int, seq_len: int, *, seed: int, count: int = 4):
    """Endless micro-batches of random token ids below `vocab_rows` (`micro_batch_size` x `seq_len + 1`, the
    loader's shape)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (micro_batch_size, seq_len + 1)
    batches = [torch.randint(0, vocab_rows, shape, generator=generator) for _ in range(count)]
    return itertools.cycle(batches)


def built_step(
    profile: RunProfile,
    *,
    model: ModelConfig,
    data: DataConfig,
    train: TrainConfig,
    optim: OptimConfig,
    compute: ComputeConfig,
):
    """(the step, the accelerator) as training builds them from the recipe's sections, run as `profile` says
    (the worker's door's: its machine, its attention kernel the one training resolves), through training's own
    Accelerator builder and model and optimizer builder."""
    from hf_pretrain.config.schema import grad_accum_steps
    from hf_pretrain.model.llama import llama_config, tokenizer_size_of
    from hf_pretrain.training.accelerator import accelerator_for
    from hf_pretrain.training.loop import model_and_optimizer
    from hf_pretrain.training.step import TrainStep

    grad_accum = grad_accum_steps(train, 1, seq_len=data.seq_len)
    accelerator = accelerator_for(profile, compute, grad_accum)  # one process: no group, trackers, folder
    torch.manual_seed(train.seed)
    config = llama_config(model, tokenizer_size_of(data))
    llama, optimizer, _ = model_and_optimizer(model, compute, optim, profile, config, accelerator, starts=False)
    batches = synthetic_batches(config.vocab_size, train.micro_batch_size, data.seq_len, seed=train.seed)
    step = TrainStep(accelerator, llama, optimizer, batches, optim, grad_accum, lambda _: optim.learning_rate)
    return step, accelerator


def measure(
    profile: RunProfile,
    overrides: dict,
    report: Report,
    steps: int,
    warmup: int,
    *,
    model: ModelConfig,
    data: DataConfig,
    train: TrainConfig,
    optim: OptimConfig,
    compute: ComputeConfig,
) -> None:
    """Time `steps` optimizer steps of the recipe's sections run as `profile` says (the worker's door's: `auto`
    resolved to the kernel training runs) after `warmup` (the first holds the compile)."""
    name = variant_name(overrides)
    memory = DeviceMemory(torch.device(profile.machine.kind))
    refused = kernel_refused(model, profile)
    if refused:  # the doctor's refusal: a kernel this card lacks would run math behind it, timed as itself
        report.skip(name, f"refused: {refused}")
        return
    try:
        step, _ = built_step(profile, model=model, data=data, train=train, optim=optim, compute=compute)
        started = time.perf_counter()
        for n in range(1, warmup + 1):
            step(n)
        first = time.perf_counter() - started
        tokens = train.global_batch_tokens
        timed_start = time.perf_counter()
        for n in range(1, steps + 1):
            step(warmup + n)  # each step reads its loss on the host: the device has finished it
            seconds = time.perf_counter() - timed_start
            rate = n * tokens / seconds
            peak = memory.peak_gib()
            report.figure(
                name,
                rate,
                "tokens/s",
                f"{name}: {rate:,.0f} tokens/s over {n} step(s) after {warmup} "
                f"(those took {first:.1f} s, compile included), peak memory {peak:.2f} GiB",
                quiet=n < steps,
                overrides=overrides,
                peak_memory_gib=peak,
                warmup_s=first,
                timed_steps=n,
            )
    except Exception as exc:  # one line: a variant this card or this install cannot run
        if is_out_of_memory(exc):
            report.skip(name, f"out of memory (peak {memory.peak_gib() or 0:.2f} GiB)")
        else:
            report.skip(
                name,
                f"failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}",
            )


def kernel_refused(model: ModelConfig, profile: RunProfile) -> str | None:
    """The doctor's line when the run (`profile`: its SDPA kernel resolved) names a kernel its device lacks
    (preflight/sdpa_kernel.py)."""
    from hf_pretrain.preflight.sdpa_kernel import check_attention_backend

    verdict = check_attention_backend(model, profile)
    return verdict.reason if verdict.status == "fail" else None


def probe(
    profile: RunProfile,
    steps: int,
    *,
    model: ModelConfig,
    data: DataConfig,
    train: TrainConfig,
    optim: OptimConfig,
    compute: ComputeConfig,
) -> dict:
    """A micro-batch probe of the recipe's sections run as `profile` says (the kernel training resolves: a
    micro-batch that fits with one may not with another): `steps` optimizer steps;
    {"status": ok | oom | failed, "message", "peak_memory_gib"}."""
    memory = DeviceMemory(torch.device(profile.machine.kind))
    try:
        step, _ = built_step(profile, model=model, data=data, train=train, optim=optim, compute=compute)
        for n in range(1, steps + 1):
            step(n)
        status, message = "ok", ""
    except Exception as exc:
        status = "oom" if is_out_of_memory(exc) else "failed"
        message = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    return {"status": status, "message": message, "peak_memory_gib": memory.peak_gib()}
