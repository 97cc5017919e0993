"""The measurements the performance model is checked against (docs/benchmarks.md, tests/test_gpu_market.py):
the H100 rows of the shared GPU table (this project's own step, measured 2026-11-25), the published
runs of the `1b` shape and of MPT-1b, and the published FP8 speed-ups (issue 34)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from hf_pretrain.config import Recipe, load_recipe
from hf_pretrain.economics.measurements import configuration, shipped_measurement
from hf_pretrain.economics.performance import step_time
from hf_pretrain.economics.workload import LOSS_BYTES, Shape, Workload, model_shape, workload
from hf_pretrain.machine.gpus import gpu_named
from hf_pretrain.machine.run_profile import Step
from hf_pretrain.machine.what_if import profile_on

H100_TABLE = (
    "the shared GPU table (2026-11-25): NVIDIA H100 80GB HBM3 (SXM), torch 2.11.0+cu130, transformers 5.23.0, "
    "accelerate 1.15.0, liger-kernel 0.8.5, triton 3.6.0; the `1b` at micro-batch 8 x 2048, 8 accumulation steps"
)
RUN_1B = "the single-A100 run the 1b recipe reproduces (bf16, torch.compile, micro-batch 8)"
FOUNDRY = (
    "MosaicML llm-foundry scripts/train/benchmarking/README.md, MPT-1b, ctx 2048, bf16, 8 GPUs FSDP, "
    "micro-batch 14, no activation checkpointing"
)
FOUNDRY_FP8 = "llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16 and FP8 tables, MPT-1b, 8 GPUs"


@dataclass(frozen=True)
class PublishedRun:
    """A measured throughput the model is checked against."""

    name: str
    gpu: str
    tokens_per_s: float  # measured, per GPU
    workload: Workload
    source: str
    tolerance: float  # the test's bound on the model's relative error
    attention_efficiency: float | None = None  # another attention kernel than SDPA's (MPT's)


def modelled(run: PublishedRun) -> float:
    return step_time(run.workload, gpu_named(run.gpu), attention_efficiency=run.attention_efficiency).tokens_per_s


# llm-foundry's MPT runs (2023) attend with its Triton FlashAttention kernel (ALiBi), not SDPA's
# FlashAttention-2. Chosen: the same ~125 TFLOP/s on both cards, 40% of an A100's peak, FlashAttention-1's
# level (FA2 paper, fig. 4: FA1 reaches ~40% of an A100 forward and backward). The Triton of 2023 emitted
# Ampere's mma instructions on Hopper too (wgmma came with Triton 3), so the kernel ran no faster on the
# H100: every H100 row of llm-foundry's table sits at 40-46% MFU against 55-60% on A100s, the same code.
MPT_ATTENTION_EFFICIENCY = {"A100 80GB SXM": 0.40, "H100 SXM": 0.40 * 312 / 989}


def mpt_1b_shape() -> Shape:
    # llm-foundry scripts/train/yamls/pretrain/mpt-1b.yaml: d_model 2048, 24 layers, 16 heads,
    # expansion_ratio 4 (a GELU MLP: two matrices), vocabulary 50,368 tied; 1,315,950,592 parameters.
    return Shape(
        layers=24,
        hidden=2048,
        kv_width=2048,
        intermediate=8192,
        vocab_rows=50_368,
        seq_len=2048,
        parameters=1_315_950_592,
        mlp_matrices=2,
    )


# llm-foundry's MPT runs its LayerNorm and GELU as single kernels (its layers move what a compiled
# step's do), but its loss is torch's uncompiled cross entropy (an fp32 upcast of the logits): a
# compiled step with the eager loss.
def _mpt_1b(shape: Shape, micro_batch_size: int, tokens_per_step_per_gpu: float, precision: str = "bf16") -> Workload:
    config = Step(micro_batch_size=micro_batch_size, precision=precision)
    work = workload(shape, config, tokens_per_step_per_gpu)
    eager_loss = (LOSS_BYTES["eager"] - LOSS_BYTES["compiled"]) * shape.vocab_rows
    return replace(work, pointwise_bytes=work.pointwise_bytes + eager_loss)


@functools.cache
def shipped_1b() -> Recipe:
    """The shipped `1b` recipe (compiled, AdamW, bf16): the recipe every published run here is a run of."""
    return load_recipe("1b")


def h100(**train) -> float:
    """What the shipped 1b measured on the project's H100 SXM with `train` changed: the shipped records
    (economics/measured.jsonl), the one home of those figures."""
    recipe = shipped_1b().replace(**train)
    on_h100 = profile_on(recipe.step_as_written, "H100 SXM").step  # a what-if: the step it ran there
    batch = recipe.train.global_batch_tokens
    measured = shipped_measurement(
        configuration(recipe.model, recipe.data, on_h100, global_batch_tokens=batch), "H100 SXM"
    )
    if measured is None:
        raise LookupError(f"no shipped H100 SXM measurement of the 1b with {train} in economics/measured.jsonl")
    return measured.tokens_per_s


def published_runs() -> list[PublishedRun]:
    """Every measurement of the check: the shipped 1b's, the published runs of its shape and MPT-1b's."""
    one_b = shipped_1b()
    shape = model_shape(one_b.model, one_b.data)
    step = one_b.train.global_batch_tokens
    compiled = Step(micro_batch_size=one_b.train.micro_batch_size)
    eager = replace(compiled, compiled=False)
    return [
        PublishedRun("1b as shipped (compile)", "H100 SXM", h100(), workload(shape, compiled, step), H100_TABLE, 0.10),
        PublishedRun(
            "1b, --compile false",
            "H100 SXM",
            h100(compile=False),
            workload(shape, eager, step),
            H100_TABLE,
            0.10,
        ),
        PublishedRun(
            "1b, --compile false --liger true",
            "H100 SXM",
            h100(compile=False, liger=True),
            workload(shape, replace(eager, liger=True), step),
            H100_TABLE,
            0.10,
        ),
        PublishedRun("1b", "A100 80GB SXM", 28_300, workload(shape, compiled, step), RUN_1B, 0.15),
        PublishedRun(
            "1b, gradient checkpointing (all 16 layers)",
            "A100 80GB SXM",
            24_000,
            workload(shape, replace(compiled, checkpointed_layers=shape.layers), step),
            RUN_1B,
            0.15,
        ),
        PublishedRun(
            "MPT-1b",
            "A100 80GB SXM",
            20_513,
            _mpt_1b(mpt_1b_shape(), 14, 917_504 / 8),
            FOUNDRY,
            0.15,
            MPT_ATTENTION_EFFICIENCY["A100 80GB SXM"],
        ),
        PublishedRun(
            "MPT-1b",
            "H100 SXM",
            45_455,
            _mpt_1b(mpt_1b_shape(), 14, 229_376 / 8),
            FOUNDRY,
            0.15,
            MPT_ATTENTION_EFFICIENCY["H100 SXM"],
        ),
    ]


# ---------------------------------------------------------------------- FP8 speed-ups (issue 34)
@dataclass(frozen=True)
class Fp8Speedup:
    """A published FP8-over-bf16 tokens/s ratio on H100s, the two workloads it compares."""

    name: str
    published: float
    bf16: Workload
    fp8: Workload
    source: str
    attention_efficiency: float | None = None

    def modelled(self) -> float:
        h100 = gpu_named("H100 SXM")
        fp8 = step_time(self.fp8, h100, attention_efficiency=self.attention_efficiency).tokens_per_s
        return fp8 / step_time(self.bf16, h100, attention_efficiency=self.attention_efficiency).tokens_per_s


def _pair(shape: Shape, micro_batch_size: int, tokens_per_step: float) -> tuple[Workload, Workload]:
    bf16 = Step(micro_batch_size=micro_batch_size)
    return workload(shape, bf16, tokens_per_step), workload(shape, replace(bf16, precision="fp8"), tokens_per_step)


def fp8_speedups() -> list[Fp8Speedup]:
    # Llama 3 8B (Meta's config): 32 layers, 4096 wide, 8 KV heads of 128, MLP 14,336, 128,256 rows untied;
    # torchtitan's benchmark: seq 8192, local batch 1 on 8 H100s (FSDP), torch.compile, torchao float8 tensorwise.
    llama3_8b = Shape(32, 4096, 1024, 14_336, 128_256, 8192, 8_030_261_248)
    # nanochat d26: depth 26, width 26 x 64 = 1664, 13 heads of 128 (no GQA), relu^2 MLP 4x (two matrices),
    # 65,536-token vocabulary untied, seq 2048; micro-batch 32 assumed (the modelled ratio is 1.16-1.19 from 8 to 32).
    d26 = Shape(26, 1664, 1664, 4 * 1664, 65_536, 2048, 26 * 12 * 1664**2 + 2 * 65_536 * 1664, mlp_matrices=2)
    # MPT-1b in llm-foundry's H100 tables (bf16 and fp8 through TransformerEngine, same code otherwise):
    # 52,275 -> 70,315 tokens/s per GPU at 512 tokens (micro-batch 56), 29,157 -> 32,010 at 8,192 (3 and 2).
    mpt = mpt_1b_shape()
    mpt_512, mpt_8k = replace(mpt, seq_len=512), replace(mpt, seq_len=8192)
    hopper_triton = MPT_ATTENTION_EFFICIENCY["H100 SXM"]
    return [
        Fp8Speedup("torchtitan Llama 3 8B, seq 8192", 1.28, *_pair(llama3_8b, 1, 8192), "torchtitan, issue 34"),
        Fp8Speedup("nanochat d26, seq 2048", 1.17, *_pair(d26, 32, 32 * 2048), "nanochat, issue 34"),
        Fp8Speedup(
            "MPT-1b, seq 512",
            70_315 / 52_275,
            _mpt_1b(mpt_512, 56, 917_504 / 8),
            _mpt_1b(mpt_512, 56, 917_504 / 8, "fp8"),
            FOUNDRY_FP8,
            hopper_triton,
        ),
        Fp8Speedup(
            "MPT-1b, seq 8192",
            32_010 / 29_157,
            _mpt_1b(mpt_8k, 2, 524_288 / 8),
            _mpt_1b(mpt_8k, 2, 524_288 / 8, "fp8"),
            FOUNDRY_FP8,
            hopper_triton,
        ),
    ]


# ---------------------------------------------------------------------- the tables docs/benchmarks.md prints
def runs_table() -> str:
    """Each measurement beside the model's figure (docs/benchmarks.md; a test holds the page to it)."""
    lines = ["| run | GPU | measured tokens/s per GPU | model | error | bound |", "|---|---|---|---|---|---|"]
    for run in published_runs():
        rate = modelled(run)
        lines.append(
            f"| {run.name} | {run.gpu} | {run.tokens_per_s:,.0f} | {rate:,.0f} | {rate / run.tokens_per_s - 1:+.1%} "
            f"| {run.tolerance:.0%} |"
        )
    return "\n".join(lines)


def fp8_table() -> str:
    lines = ["| FP8 over bf16, H100 | published | model | error |", "|---|---|---|---|"]
    for speedup in fp8_speedups():
        ratio = speedup.modelled()
        lines.append(
            f"| {speedup.name} | {speedup.published:.2f}x | {ratio:.2f}x | {ratio / speedup.published - 1:+.1%} |"
        )
    return "\n".join(lines)
