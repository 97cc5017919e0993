"""The GPU side of a run: CUDA where the recipe expects it, bf16 and TF32, and whether it fits in memory."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil

import torch

from hf_pretrain.config import ComputeConfig, DataConfig, ModelConfig, StepAsWritten, TrainConfig
from hf_pretrain.economics.measurements import (
    Measurement,
    configuration,
    measured_here,
    measured_on_a_gpu,
    shipped_measurement,
)
from hf_pretrain.economics.memory import (
    ESTIMATE_ERROR,
    USABLE_MEMORY_FRACTION,
    Fit,
    MemoryEstimate,
    fit_in_memory,
    memory_of,
)
from hf_pretrain.formatting import human_bytes, human_count
from hf_pretrain.machine.hardware import cpu_has_bf16_kernels
from hf_pretrain.machine.run_profile import RunProfile
from hf_pretrain.machine.what_if import profile_on, profile_on_any_card
from hf_pretrain.model.llama import tokenizer_size_of
from hf_pretrain.preflight.result import CheckResult

LIGER_FIX = "--liger false (the rest of the recipe runs on the CPU too), or a CUDA machine"


def cpu_costs(profile: RunProfile) -> list[str]:
    """What the recipe's GPU options cost when the run goes on the CPU (docs/gpu.md has the figures)."""
    step, costs = profile.step, []
    if step.compiled:
        costs.append(
            "compile=true compiles with inductor's C++ backend on the first step (tens of seconds "
            "for a small model, minutes at 1B), then runs the compiled kernels"
        )
    if step.fp8_emulate:
        costs.append("fp8_emulate=true adds FP8's casts and scales to bf16 autocast: slower than bf16, never faster")
    if step.precision == "bf16":
        costs.append(
            "bf16 autocast "
            + (
                "uses oneDNN's bf16 kernels"
                if cpu_has_bf16_kernels()
                else "has no bf16 kernels on this CPU (AVX-512 or AMX has them) and runs slower than fp32"
            )
        )
    return costs


def check_cuda(compute: ComputeConfig, profile: RunProfile) -> CheckResult:
    """CUDA when there is one; without it, the run goes on the CPU with every option but Liger's
    kernels and fp16 (torch.compile and bf16 autocast work there, at a cost this check states).
    The machine and the precision are the profile's; the compute section says whether Liger was asked."""
    if profile.machine.on_gpu:
        return CheckResult(
            "cuda",
            "pass",
            f"{profile.machine.name}, {human_bytes(profile.machine.memory_bytes or 0)}, torch {torch.__version__} "
            f"(CUDA {torch.version.cuda})",
        )
    if compute.liger:
        return CheckResult(
            "cuda",
            "fail",
            f"liger=true but torch {torch.__version__} sees no CUDA device: "
            f"Liger's kernels are Triton, which runs on GPUs only",
            LIGER_FIX,
        )
    if cpu_refusal := profile.step.precision_facts.cpu_refusal:
        return CheckResult(
            "cuda",
            "fail",
            f"mixed_precision={profile.precision} needs CUDA ({cpu_refusal})",
            "--mixed_precision bf16 or no",
        )
    costs = cpu_costs(profile)
    if costs:
        return CheckResult(
            "cuda",
            "warn",
            "no CUDA device: the run goes on the CPU, where " + "; ".join(costs),
            "fine for checking every code path (docs/gpu.md); for real runs use a GPU machine",
        )
    if profile.asked_precision == "auto":
        return CheckResult(
            "cuda",
            "warn",
            "no CUDA device: mixed_precision=auto will train in fp32 on the CPU",
            "fine for a tiny model or checking every code path (docs/gpu.md); for real runs use a GPU machine",
        )
    return CheckResult("cuda", "pass", "no CUDA device; the recipe runs on the CPU (mixed_precision=no)")


def check_liger_under_compile(
    *, model: ModelConfig, data: DataConfig, train: TrainConfig, written: StepAsWritten, recipe_name: str
) -> CheckResult:
    """`liger` with `compile` runs (Liger's loss outside the compiled graph, hf_pretrain/model/loss.py), but no GPU
    has timed the pair: say so rather than promise a speed-up, with what each alone measured on the
    project's H100 where the shipped records hold the recipe (economics/measured.jsonl)."""
    if not (written.compute.liger and written.compute.compile):
        return CheckResult("liger + compile", "skip", "not asked for")

    def on_the_h100(**compute: bool) -> Measurement | None:  # the step with `compute` changed: a what-if there
        changed = dataclasses.replace(written, compute=dataclasses.replace(written.compute, **compute))
        step = profile_on(changed, "H100 SXM").step
        key = configuration(model, data, step, global_batch_tokens=train.global_batch_tokens)
        return shipped_measurement(key, "H100 SXM")

    compiled, liger = on_the_h100(liger=False), on_the_h100(compile=False)
    figures = (
        f" (H100: compiled {compiled.tokens_per_s / 1e3:.1f}k tokens/s, eager+Liger {liger.tokens_per_s / 1e3:.1f}k)"
        if compiled and liger
        else ""
    )
    return CheckResult(
        "liger + compile",
        "warn",
        f"liger=true with compile=true is unmeasured on any GPU{figures}",
        f"hf-pretrain bench --recipe {recipe_name} --variants liger=true,false measures it on this GPU",
    )


def check_compiler(compute: ComputeConfig, profile: RunProfile) -> CheckResult:
    """torch.compile's inductor writes kernels at run time: Triton on a GPU, C++ on the CPU."""
    if not compute.compile:
        return CheckResult("compiler", "skip", "compile=false")
    if profile.machine.on_gpu:
        found = importlib.util.find_spec("triton") is not None
        what, fix = "Triton", "a CUDA build of torch brings Triton (pip install -c constraints.txt -e .)"
    else:
        found = any(shutil.which(c) for c in (os.environ.get("CXX") or "", "c++", "g++", "clang++") if c)
        what, fix = "a C++ compiler", "apt install g++ (or set CXX), or --compile false"
    if found:
        return CheckResult("compiler", "pass", f"compile=true: inductor finds {what}")
    return CheckResult(
        "compiler", "fail", f"compile=true but inductor cannot find {what} to build its kernels with", fix
    )


def check_bf16(profile: RunProfile) -> CheckResult:
    """The precision asked (the profile's) against the card's bf16: the recipe itself adds nothing."""
    requested, card = profile.asked_precision, profile.machine.name
    if not profile.machine.on_gpu:
        return CheckResult("bf16", "skip", "no CUDA device")
    if requested not in ("bf16", "auto"):
        return CheckResult("bf16", "skip", f"not asked for (mixed_precision={requested})")
    if profile.machine.bf16:
        return CheckResult("bf16", "pass", f"supported by {card}")
    if requested == "auto":
        return CheckResult(
            "bf16",
            "warn",
            "this GPU has no bf16: mixed_precision=auto falls back to fp32",
            "--mixed_precision fp16 (with loss scaling) for speed",
        )
    return CheckResult(
        "bf16",
        "fail",
        f"mixed_precision=bf16 but {card} has no bf16",
        "--mixed_precision fp16, or a GPU from Ampere (A100, A10, RTX 30xx) on",
    )


def check_fp8(profile: RunProfile) -> CheckResult:
    """A precision that converts the decoder linears (fp8) needs the tensor cores of its row in precisions.py
    (FP8's: compute capability 8.9 or newer) unless its matmuls are emulated."""
    precision = profile.step.precision_facts
    name, label = precision.name, precision.name.upper()
    if not precision.converts_linears:
        return CheckResult("fp8", "skip", f"not asked for (mixed_precision={profile.asked_precision})")
    if profile.step.fp8_emulate:
        return CheckResult(
            "fp8",
            "pass",
            f"{name} emulated ({profile.step.fp8_recipe} scaling): {label}'s casts and scales, the matmuls in fp32",
        )
    missing = profile.machine.lacks(precision)
    if missing:
        fix = f"--fp8_emulate true (the same {label} math emulated, for a CPU test), or --mixed_precision bf16"
        return CheckResult("fp8", "fail", missing, fix)
    m = profile.machine
    return CheckResult(
        "fp8",
        "pass",
        f"{m.name}: compute capability {m.capability:.1f} has {label} ({profile.step.fp8_recipe} scaling)",
    )


def check_tf32(compute: ComputeConfig, profile: RunProfile) -> CheckResult:
    if not profile.machine.on_gpu:
        return CheckResult("tf32", "skip", "only matters on CUDA")
    if compute.tf32:
        return CheckResult("tf32", "pass", "TF32 matmuls on (tf32=true)")
    return CheckResult(
        "tf32", "warn", "tf32=false: fp32 matmuls run several times slower on Ampere and later", "--tf32 true"
    )


def describe(estimate: MemoryEstimate) -> str:
    kind = f", {estimate.kind.kernels()}" if estimate.kind else ""
    return (
        f"{human_count(estimate.parameters)} parameters need {human_bytes(estimate.total(False))} at the peak"
        f"{kind} ({human_bytes(estimate.static)} weights, gradients and AdamW, "
        f"{human_bytes(estimate.activations)} activations, {human_bytes(estimate.head)} head and loss), "
        f"{human_bytes(estimate.total(True))} with gradient checkpointing"
    )


def bench_command(written: StepAsWritten, recipe_name: str) -> str:
    """`hf-pretrain bench` measuring the memory of the step `written` as it will run (the keys that decide it)."""
    compute = written.compute
    keys = [f"--micro_batch_size {written.micro_batch_size}"]
    if written.checkpointed_layers:
        keys.append(f"--checkpointed_layers {written.checkpointed_layers}")
    keys.append(f"--compile {str(compute.compile).lower()}")
    if compute.compile and compute.compile_regions:
        keys.append("--compile_regions true")
    if compute.liger:
        keys.append("--liger true")
    if written.optimizer != "adamw":
        keys.append(f"--optimizer {written.optimizer}")
    return f"hf-pretrain bench --recipe {recipe_name} {' '.join(keys)} --no_search --steps 10 --warmup 4"


def without_a_gpu(estimate: MemoryEstimate, asked: int, measured: Measurement | None) -> str:
    """The memory row on a machine without a GPU: the configuration asked first (its `asked` checkpointed
    layers), then what a card of the table `measured` for it, where one did (economics/measurements.py)."""
    layers = estimate.layers
    said = "no GPU to compare against; "
    if 0 < asked < layers:
        said += (
            f"with {asked} of {layers} layers checkpointed, as asked: {human_bytes(estimate.peak(asked))} at the peak; "
        )
    said += describe(estimate)
    if measured is not None and measured.peak_memory_gib is not None:
        said += (
            f"; the {measured.gpu} measured a peak of {measured.peak_memory_gib:.1f} GiB for it ({measured.label()})"
        )
    return said


def measured_fit(measured: Measurement, total: int, estimate: MemoryEstimate) -> CheckResult:
    where = f"on an {measured.gpu}" if measured.shipped else "here"  # the project's run, or this machine's
    return CheckResult(
        "gpu memory",
        "pass",
        f"this configuration ran {where}: peak {measured.peak_memory_gib:.2f} GiB of {total / 2**30:.1f} GiB "
        f"({measured.label()}); the estimate, "
        f"modelled: {describe(estimate)}",
    )


def memory_fix(fewest: Fit, smaller: Fit | None) -> str:
    """What to change for a run that would run out of memory: the fewest checkpointed layers at its
    micro-batch (`fewest`), else a smaller micro-batch with as few checkpointed layers as it then needs
    (`smaller`: the search at any micro-batch); accumulation keeps the batch."""
    if fewest.fits:
        return f"--checkpointed_layers {fewest.checkpointed_layers} ({fewest.reason})"
    if smaller is not None and smaller.fits:
        return (
            f"--micro_batch_size {smaller.micro_batch_size} --checkpointed_layers {smaller.checkpointed_layers} "
            f"(accumulation keeps the global batch)"
        )
    return "a GPU with more memory, FSDP over several GPUs, or a smaller model"


def check_memory(
    profile: RunProfile,
    device_memory_bytes: int | None = None,
    *,
    model: ModelConfig,
    data: DataConfig,
    train: TrainConfig,
    written: StepAsWritten,
    recipe_name: str,
) -> CheckResult:
    """Estimated peak memory (economics/memory.py) of the recipe's sections run as `profile` (the door's) against
    `device_memory_bytes` (any GPU's verdict, on any machine), else its GPU's: refused only when over the usable
    memory by more than the estimate's own error (`ESTIMATE_ERROR`, held against measured H100 peaks); closer,
    a warning naming the `hf-pretrain bench` that measures it on the device."""
    machine, world_size = profile.machine, profile.step.world_size
    total = device_memory_bytes if device_memory_bytes is not None else machine.memory_bytes
    # the run's own step on its own machine; a GPU asked of from a CPU is a what-if on a card of the table
    on_a_card = profile.step if machine.on_gpu else profile_on_any_card(written, world_size).step
    step = profile.step if total is None or machine.on_gpu else on_a_card
    tokenizer_size, seq_len, batch = tokenizer_size_of(data), data.seq_len, train.global_batch_tokens
    estimate = memory_of(model, step, tokenizer_size, seq_len=seq_len, global_batch_tokens=batch)
    asked = written.checkpointed_layers
    wanted = configuration(model, data, on_a_card, global_batch_tokens=batch)
    if total is None:
        return CheckResult("gpu memory", "skip", without_a_gpu(estimate, asked, measured_on_a_gpu(wanted)))
    here = machine.gpu_name if device_memory_bytes is None else None  # this card, asked of its own memory
    measured = measured_here(wanted, here) if here else None
    if measured and measured.peak_memory_gib is not None:  # it ran here: the measurement wins over the estimate
        return measured_fit(measured, total, estimate)
    usable = USABLE_MEMORY_FRACTION * total
    layers = model.num_hidden_layers
    where = f"{describe(estimate)}; the device has {human_bytes(total)}, {human_bytes(usable)} usable"
    if asked:
        where = f"{where}; {asked} of {layers} layers checkpointed: {human_bytes(estimate.peak(asked))}"
    # The fewest checkpointed layers that fit at the recipe's micro-batch (economics/memory.py's search):
    # each recomputed layer costs about a third of its forward-and-backward time, so fewer is cheaper.
    sizes = {"seq_len": seq_len, "tokenizer_size": tokenizer_size, "memory_bytes": total}
    fewest = fit_in_memory(model, train, step, micro_batch_size=written.micro_batch_size, **sizes)
    if estimate.peak(asked) <= usable:
        if fewest.fits and fewest.checkpointed_layers < asked:
            none = fewest.checkpointed_layers == 0
            return CheckResult(
                "gpu memory",
                "warn",
                ("fits without gradient checkpointing" if none else f"fits with fewer checkpointed layers than {asked}")
                + f": {where}",
                (
                    "--gradient_checkpointing false --checkpointed_layers -1"
                    if none
                    else f"--checkpointed_layers {fewest.checkpointed_layers}"
                )
                + " (each recomputed layer costs throughput: the whole model's recompute is 15-20%)",
            )
        return CheckResult("gpu memory", "pass", where)
    # It would run out of memory: the search again at any micro-batch, where none fits at this one
    fix = memory_fix(fewest, None if fewest.fits else fit_in_memory(model, train, step, **sizes))
    if asked == layers or (not asked and estimate.total(True) > usable):
        how = "even with gradient checkpointing"
    else:
        how = f"with {asked} of {layers} layers checkpointed" if asked else "without gradient checkpointing"
    peak = estimate.peak(asked)
    if peak * (1 - ESTIMATE_ERROR) <= usable:  # over, but within the estimate's own error: measure it
        return CheckResult(
            "gpu memory",
            "warn",
            f"may not fit {how}: {human_bytes(peak)} estimated, within the estimate's "
            f"{ESTIMATE_ERROR:.0%} of {human_bytes(usable)} usable; {where}",
            f"measure it on this GPU: {bench_command(written, recipe_name)} (or {fix})",
        )
    return CheckResult("gpu memory", "fail", f"does not fit {how}: {where}", fix)
