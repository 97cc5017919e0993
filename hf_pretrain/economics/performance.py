"""The one performance model of a training step on one GPU: tokens/s before any rental (`plan`), the
check that a rented GPU delivers what its kind should (the doctor's slow-node warning, bench), and
docs/gpu.md's step budget (benchmarks/estimate_step_budget.py prints it).

    modelled_tokens_per_s(work, gpu)       tokens/s of one GPU running a workload (workload.run_workload)

What a token costs comes from workload.py (FLOPs by kind, bytes by kernel, for the configuration:
compiled or eager, Liger, AdamW or Muon, bf16/fp8/fp32, micro-batch, checkpointed layers). Its time
on a GPU is the sum of these parts (no overlap between them is assumed):

    matmuls      the decoder's linear layers and the output projection at the GPU's matmul rate:
                 its best measured bf16 matmul (gpus.yaml, Bekman's MAMF; DEFAULT_MATMUL_EFFICIENCY
                 where none is published) x GEMM_SHARE, the share of that rate the step's own GEMMs
                 reach (16K-token rows, 512-8K columns, their epilogues)
    attention    causal SDPA at ATTENTION_EFFICIENCY of the bf16 peak (the FlashAttention kernel SDPA
                 runs there), times ATTENTION_BACKEND_SPEED for the recipe's `attention_backend`
    memory-bound the pointwise kernels, the loss, the weight casts and the optimizer (bytes from
                 workload.py) at BANDWIDTH_EFFICIENCY of the datasheet bandwidth
    optimizer    Muon's Newton-Schulz matmuls, at the matmul rate
    fp8          with FP8 (a precision that converts the decoder linears, precisions.py), the decoder
                 linears where FP8 pays (fp8.py's size rule) run at the precision's peak (FP8's)
                 x the GPU's matmul efficiency x GEMM_SHARE x FP8_GEMM_SHARE, and their casts to fp8
                 are memory-bound bytes; the smaller projections (the 1b's K and V; all but the
                 MLP's gate and up under rowwise), the head, the attention and the optimizer stay bf16
    recompute    each checkpointed layer's forward pass again (its matmuls, attention and pointwise
                 kernels): a non-reentrant checkpoint reruns the layer's forward in the backward

Constants and where they come from:
    GEMM_SHARE 0.82              fitted on the H100 row of the shared GPU table (the `1b` as shipped,
                                 compiled: 77,750-78,120 tokens/s); checked on the runs it was not
                                 fitted on: the published A100 pair, MPT-1b on A100 and H100, the H100's
                                 eager and eager + Liger rows (docs/benchmarks.md, tests/test_gpu_market.py)
    DEFAULT_MATMUL_EFFICIENCY    chosen: the lowest NVIDIA figure of the MAMF table (H100 SXM 80.3%)
    ATTENTION_EFFICIENCY         chosen from the FlashAttention-2 and -3 papers: FA2 reaches ~50% of an
                                 Ampere or Ada peak on a 2K causal sequence and ~35% of a Hopper's, whose
                                 new instructions it does not use (Shah et al. 2024, FlashAttention-3, sec. 1)
    ATTENTION_BACKEND_SPEED      ESTIMATES from published ratios, never measured here (the check
                                 measures them on the card: `hf-pretrain check`): `auto` and `flash`
                                 1.0 (the kernel ATTENTION_EFFICIENCY describes); `cudnn` on Hopper
                                 1.7, the low end of the 1.7-2.3x over FlashAttention-2 reported for
                                 cuDNN 9's training attention on H100 (NVIDIA's cuDNN 9 release notes
                                 and blog), elsewhere 1.0; `efficient` 0.6 (FlashAttention-2 paper,
                                 Dao 2023: FA2 1.3-2.5x faster than xformers' cutlass kernel, which SDPA's
                                 memory-efficient backend is); `math` 0.15 (the T x T scores written
                                 and read in fp32 by separate kernels: bandwidth-bound, chosen)
    BANDWIDTH_EFFICIENCY 0.80    chosen: what a streaming kernel reaches of HBM or GDDR
    FP8_GEMM_SHARE 0.90          fitted on the published FP8 speed-ups on H100s (issue 34: torchtitan
                                 Llama 3 8B 1.28x, nanochat d26 1.17x, MPT-1b 1.35x at 512 tokens and
                                 1.10x at 8K): the value of 0.7-1.0 that keeps all four within 9%;
                                 scaled matmuls reach less of the FP8 peak than bf16 GEMMs of theirs
                                 (the scales, the fp8 layouts cuBLAS needs). The casts are counted
                                 bytes (workload.py)
    FP32_MATMUL_SHARE            datasheets: TF32 dense is half the bf16 rate; fp32 on CUDA cores ~1/16
                                 (fp32 runs are priced coarsely and not judged by the slow-node check)
    a precision's tokens for bf16's loss (`plan` charges them) are its row's in precisions.py: FP8's
                                 measured on a 1.48M-parameter proxy (docs/benchmarks.md, "FP8 vs bf16"):
                                 1.007x +/- 0.013 bf16's tokens for its loss (3 seeds, emulated); the 1B
                                 estimate, 1.01-1.11x, is printed beside it by plan
    workload.py's byte counts    counted kernel by kernel (its docstring), not fitted; the eager layer's
                                 count is checked against a dispatch-level count of the real step on the
                                 CPU (tests/test_performance_model.py: -9%)
No modelled rate exceeds the physical limit: the peaks over the FLOPs of a token (FP8's for the
decoder linears under FP8). Not modelled: FSDP's communication, CPU-bound launches (a compiled,
GPU-bound step hides them), how the micro-batch changes GEMM efficiency (only its weight traffic).
"""

from __future__ import annotations

from dataclasses import dataclass

from hf_pretrain.economics.workload import Workload
from hf_pretrain.machine.gpus import GPU, find_gpu
from hf_pretrain.machine.precisions import Precision
from hf_pretrain.machine.run_profile import refusal_for

GEMM_SHARE = 0.82
DEFAULT_MATMUL_EFFICIENCY = 0.80
ATTENTION_EFFICIENCY = {"ampere": 0.50, "ada": 0.50, "hopper": 0.35, "blackwell": 0.50}
BANDWIDTH_EFFICIENCY = 0.80
# Estimates (module docstring): SDPA kernel speed against the FlashAttention-2 path, by kernel and architecture.
ATTENTION_BACKEND_SPEED = {
    "auto": {},
    "flash": {},
    "cudnn": {"hopper": 1.7},
    "efficient": {"ampere": 0.6, "ada": 0.6, "hopper": 0.6, "blackwell": 0.6},
    "math": {"ampere": 0.15, "ada": 0.15, "hopper": 0.15, "blackwell": 0.15},
}
FP8_GEMM_SHARE = 0.90
# Without autocast: TF32 tensor cores run at half the dense bf16 rate on every card of the table; with
# tf32 off, fp32 runs on the CUDA cores at ~1/16 of it (A100: 19.5 of 312 TFLOP/s).
FP32_MATMUL_SHARE = {True: 0.5, False: 1 / 16}
# A measured rate this far below the model's names the node as likely slow or faulty.
SLOW_NODE_FRACTION = 0.75


@dataclass(frozen=True)
class StepTime:
    """Seconds per token, by part (module docstring)."""

    matmul: float
    attention: float
    memory: float
    optimizer: float
    fp8_casts: float
    recompute: float

    @property
    def total(self) -> float:
        return self.matmul + self.attention + self.memory + self.optimizer + self.fp8_casts + self.recompute

    @property
    def tokens_per_s(self) -> float:
        return 1.0 / self.total

    def parts(self) -> dict[str, float]:
        return {
            "matmuls": self.matmul,
            "attention": self.attention,
            "memory-bound (pointwise, loss, weight casts, optimizer)": self.memory,
            "Muon's Newton-Schulz": self.optimizer,
            "FP8 casts": self.fp8_casts,
            "recompute (checkpointed layers)": self.recompute,
        }


def matmul_flops_per_s(gpu: GPU, autocast: bool = True, tf32: bool = True) -> float:
    """The rate the step's bf16 (without autocast, fp32: tf32) GEMMs reach on `gpu`."""
    rate = (gpu.matmul_efficiency or DEFAULT_MATMUL_EFFICIENCY) * gpu.bf16_flops * GEMM_SHARE
    return rate if autocast else rate * FP32_MATMUL_SHARE[tf32]


def converted_matmul_flops_per_s(gpu: GPU, precision: Precision) -> float:
    """The rate of the decoder linears a precision converts (FP8's scaled matmuls) on `gpu`."""
    peak = gpu.flops_at(precision.peak)
    if peak is None:
        raise ValueError(refusal_for(gpu, precision))
    return (gpu.matmul_efficiency or DEFAULT_MATMUL_EFFICIENCY) * peak * GEMM_SHARE * FP8_GEMM_SHARE


def step_time(workload: Workload, gpu: GPU, *, attention_efficiency: float | None = None) -> StepTime:
    """The model's seconds per token of `workload` on `gpu` (raises ValueError for FP8 on a card without).

    `attention_efficiency` replaces ATTENTION_EFFICIENCY for a run whose attention is another kernel
    than SDPA's (published.py: llm-foundry's Triton kernel)."""
    config, precision = workload.config, workload.config.precision_facts
    if refusal := refusal_for(gpu, precision):
        raise ValueError(refusal)
    matmul_rate = matmul_flops_per_s(gpu, config.autocast, config.tf32)
    linear_rate = converted_matmul_flops_per_s(gpu, precision) if precision.converts_linears else matmul_rate
    attention_rate = (attention_efficiency or ATTENTION_EFFICIENCY[gpu.architecture]) * gpu.bf16_flops
    attention_rate *= ATTENTION_BACKEND_SPEED.get(config.attention_backend, {}).get(gpu.architecture, 1.0)
    if not config.autocast:
        attention_rate *= FP32_MATMUL_SHARE[config.tf32]
    byte_rate = BANDWIDTH_EFFICIENCY * gpu.bandwidth_bytes_per_s
    bf16_layer_flops = workload.layer_forward_flops - workload.layer_fp8_forward_flops
    one_layer_forward = (
        workload.layer_fp8_forward_flops / linear_rate
        + bf16_layer_flops / matmul_rate
        + workload.layer_attention_forward_flops / attention_rate
        + workload.layer_forward_bytes / byte_rate
    )
    return StepTime(
        matmul=workload.fp8_linear_flops / linear_rate
        + (workload.linear_flops - workload.fp8_linear_flops + workload.head_flops) / matmul_rate,
        attention=workload.attention_flops / attention_rate,
        memory=(workload.pointwise_bytes + workload.weight_bytes) / byte_rate,
        optimizer=workload.optimizer_flops / matmul_rate,
        fp8_casts=workload.fp8_cast_bytes / byte_rate,
        recompute=min(config.checkpointed_layers, workload.layers) * one_layer_forward,
    )


def physical_limit(workload: Workload, gpu: GPU) -> float:
    """Tokens/s at 100% of the datasheet peaks (FP8's for the decoder linears under FP8): no step reaches it."""
    precision = workload.config.precision_facts
    if precision.converts_linears and (peak := gpu.flops_at(precision.peak)):
        linear = workload.fp8_linear_flops
        return 1.0 / (linear / peak + (workload.flops_per_token - linear) / gpu.bf16_flops)
    return gpu.bf16_flops / workload.flops_per_token


def modelled_tokens_per_s(work: Workload, gpu: GPU) -> float:
    """The model's tokens/s of one GPU running `work` (workload.run_workload: the run's step as configured,
    compile, liger, optimizer, mixed_precision, tf32, micro-batch and checkpointing; the step is the same on
    every card of the table). Raises ValueError (one line) for mixed_precision fp8 on a card without FP8."""
    return step_time(work, gpu).tokens_per_s


def scaled_to_measurement(work: Workload, measured_tokens_per_s: float, measured_gpu: GPU, gpu: GPU) -> float:
    """An estimate for `gpu` from a measurement of `work` on `measured_gpu`: the model's figure for `gpu` times
    the measured card's measured-to-modelled ratio (bench's other GPUs, labelled estimates)."""
    return modelled_tokens_per_s(work, gpu) * measured_tokens_per_s / modelled_tokens_per_s(work, measured_gpu)


# ---------------------------------------------------------------------- is this node slow?
def slow_node_warning(measured_tokens_per_s: float, device_name: str, work: Workload) -> str | None:
    """A line naming this GPU as likely slow or faulty when it delivers less than SLOW_NODE_FRACTION of
    the model for its kind and this configuration (`work`: compiled or eager, Liger, optimizer, precision),
    else None (also for a device the GPU table does not know, e.g. a CPU).

    `measured_tokens_per_s` is one GPU's rate after warm-up (compilation) with the recipe's own
    micro-batch and checkpointing, one process's workload. fp32 runs are modelled only coarsely and are
    not judged.
    """
    gpu = find_gpu(device_name)
    if gpu is None or measured_tokens_per_s <= 0 or not work.config.autocast:
        return None
    try:
        expected = modelled_tokens_per_s(work, gpu)
    except ValueError:  # fp8 on a card without: the doctor refuses that, not this check
        return None
    if measured_tokens_per_s >= SLOW_NODE_FRACTION * expected:
        return None
    return (
        f"this {gpu.name} delivers {measured_tokens_per_s:,.0f} tokens/s, {1 - measured_tokens_per_s / expected:.0%} "
        f"below the {expected:,.0f} the performance model expects of one for this configuration: likely a slow "
        f"or faulty node (clocks or thermals: nvidia-smi -q -d CLOCK,PERFORMANCE; a shared host; a PCIe card "
        f"sold as SXM); the run goes on"
    )
