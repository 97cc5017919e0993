"""A performance model of one training step on one GPU: tokens/s before any rental, and the check
that a rented GPU delivers what its kind should.

Time per token is the sum of four parts (no overlap between them is assumed):

    matmuls      6 x (the decoder layers' weight matrices + the output projection) FLOPs at the
                 GPU's measured matmul efficiency x its dense bf16 peak (gpus.yaml: Bekman's
                 "Maximum Achievable Matmul FLOPS" where published, else DEFAULT_MATMUL_EFFICIENCY)
    attention    the causal scores and their weighted sum, 6 x layers x hidden x seq_len FLOPs (half
                 of PaLM's 12, the mask skips half), at the efficiency of the kernel SDPA runs there:
                 FlashAttention-2 reaches ~50% of an Ampere or Ada peak on a 2K causal sequence and
                 ~35% of a Hopper's, whose new instructions it does not use (Shah et al. 2024,
                 FlashAttention-3, sec. 1); ATTENTION_EFFICIENCY
    memory-bound the norms, SiLU, RoPE, residual adds, the loss and the optimizer: bytes moved at
                 BANDWIDTH_EFFICIENCY of the datasheet bandwidth. The bytes are
                   ACTIVATION_PASSES x the activations the memory estimate (memory.py) saves per
                   token: every saved byte is written, read back, and its gradient written and read
                   again around the elementwise kernels;
                   WEIGHT_BYTES_PER_MICRO_BATCH per parameter for each micro-batch (autocast's bf16
                   copy of the fp32 weights, the fp32 gradient accumulated), spread over its tokens;
                   OPTIMIZER_BYTES_PER_PARAMETER per parameter for each optimizer step (AdamW reads
                   weights, gradients and both moments and writes three of them back), spread over
                   the step's tokens
    recompute    for each checkpointed layer, RECOMPUTE_SHARE x its forward pass again (matmuls,
                 attention and a third of its memory-bound traffic)

Constants and where they come from:
    DEFAULT_MATMUL_EFFICIENCY 0.80   chosen: the lowest NVIDIA figure of the MAMF table (H100 SXM 80.3%)
    ATTENTION_EFFICIENCY             chosen from the FlashAttention-2 and -3 papers (above)
    BANDWIDTH_EFFICIENCY 0.80        chosen: what a streaming kernel reaches of HBM or GDDR
    ACTIVATION_PASSES 7              fitted, with nothing else free, on the three published runs
                                     without checkpointing (PUBLISHED_RUNS)
    RECOMPUTE_SHARE 0.6              fitted on the one published pair with and without checkpointing
                                     (the 1b shape on an A100: 28,300 and ~24,000 tokens/s, 18% apart);
                                     a whole recomputed forward would predict 30%. Part of the gap is
                                     known (torch.compile's partitioner already recomputes the cheap
                                     pointwise ops of the plain step); the rest is not established
The model is checked, not tuned per GPU: docs/benchmarks.md lists each published figure beside the
model's, and tests/test_gpu_market.py holds every one within 15%. It is a model of the recipe's
compiled bf16 step on one GPU with SDPA; Liger's kernels and FSDP's communication are left out.
No modelled rate exceeds the physical limit, the peak over the FLOPs of a token.
"""

from __future__ import annotations

from dataclasses import dataclass

from hf_pretrain.config import Recipe
from hf_pretrain.economics.gpus import GPU, find_gpu, gpu_named
from hf_pretrain.economics.memory import LOSS_BYTES_PER_LOGIT
from hf_pretrain.model import llama_config, recipe_parameter_count, recipe_tokenizer_size

DEFAULT_MATMUL_EFFICIENCY = 0.80
ATTENTION_EFFICIENCY = {"ampere": 0.50, "ada": 0.50, "hopper": 0.35, "blackwell": 0.50}
BANDWIDTH_EFFICIENCY = 0.80
ACTIVATION_PASSES = 7.0
RECOMPUTE_SHARE = 0.6
WEIGHT_BYTES_PER_MICRO_BATCH = 4 + 2 + 8  # read fp32 weight, write its bf16 copy; read + write the fp32 gradient
OPTIMIZER_BYTES_PER_PARAMETER = 16 + 12 + 4  # read w, g, m, v; write w, m, v; zero the gradient
# A measured rate this far below the model's names the node as likely slow or faulty.
SLOW_NODE_FRACTION = 0.75


@dataclass(frozen=True)
class Workload:
    """What one token of a training step costs on one GPU, independent of the GPU."""

    layers: int
    matmul_flops: float  # 6 x (layer matrices + output projection)
    attention_flops: float  # causal: 6 x layers x hidden x seq_len
    layer_forward_flops: float  # one layer's matmuls in the forward pass (what a recompute repeats)
    layer_attention_forward_flops: float  # one layer's causal attention in the forward pass
    activation_bytes: float  # saved per token: every layer's and the head's (memory.py's formulas)
    layer_activation_bytes: float  # one layer's
    weight_bytes: float  # per-micro-batch and per-step weight traffic, per token
    flops_per_token: float  # the project's count (6N + 12 x layers x hidden x seq_len, model.py): MFU, the limit


def dense_workload(
    *,
    layers: int,
    hidden: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    vocab_rows: int,
    seq_len: int,
    parameters: int,
    micro_batch_size: int,
    tokens_per_step: float,
    mlp_matrices: int = 3,
) -> Workload:
    """The workload of a decoder-only transformer (Llama: `mlp_matrices` 3 for SwiGLU; MPT/GPT: 2).

    Activation bytes per token and layer follow memory.py's mixed-precision formula
    (30h + 4 h_kv + 8I + 4a + 8), with a two-matrix MLP keeping 4I instead of SwiGLU's 8I; the head
    keeps its final norm (10h) and the loss's fp32 buffers (12 per vocabulary row).
    """
    kv_width = kv_heads * (hidden // heads)
    layer_matrices = hidden * (2 * hidden + 2 * kv_width) + mlp_matrices * hidden * intermediate
    layer_bytes = 30 * hidden + 4 * kv_width + 4 * intermediate * (mlp_matrices - 1) + 4 * heads + 8
    head_bytes = 10 * hidden + LOSS_BYTES_PER_LOGIT * vocab_rows
    return Workload(
        layers=layers,
        matmul_flops=6.0 * (layers * layer_matrices + vocab_rows * hidden),
        attention_flops=6.0 * layers * hidden * seq_len,
        layer_forward_flops=2.0 * layer_matrices,
        layer_attention_forward_flops=2.0 * hidden * seq_len,
        activation_bytes=float(layers * layer_bytes + head_bytes),
        layer_activation_bytes=float(layer_bytes),
        weight_bytes=WEIGHT_BYTES_PER_MICRO_BATCH * parameters / (micro_batch_size * seq_len)
        + OPTIMIZER_BYTES_PER_PARAMETER * parameters / tokens_per_step,
        flops_per_token=6.0 * parameters + 12.0 * layers * hidden * seq_len,
    )


def recipe_workload(
    recipe: Recipe, tokenizer_size: int | None = None, micro_batch_size: int | None = None, world_size: int = 1
) -> Workload:
    """The workload of the recipe's model on one of `world_size` data-parallel GPUs."""
    size = recipe_tokenizer_size(recipe) if tokenizer_size is None else tokenizer_size
    config = llama_config(recipe.model, size)
    m = recipe.model
    return dense_workload(
        layers=m.num_hidden_layers,
        hidden=m.hidden_size,
        intermediate=m.intermediate_size,
        heads=m.num_attention_heads,
        kv_heads=m.num_key_value_heads,
        vocab_rows=config.vocab_size,
        seq_len=recipe.data.seq_len,
        parameters=recipe_parameter_count(recipe, size),
        micro_batch_size=micro_batch_size or recipe.train.micro_batch_size,
        tokens_per_step=recipe.train.global_batch_tokens / world_size,
    )


@dataclass(frozen=True)
class StepTime:
    """Seconds per token, by part (module docstring)."""

    matmul: float
    attention: float
    memory: float
    recompute: float

    @property
    def total(self) -> float:
        return self.matmul + self.attention + self.memory + self.recompute

    @property
    def tokens_per_s(self) -> float:
        return 1.0 / self.total


def matmul_flops_per_s(gpu: GPU) -> float:
    return (gpu.matmul_efficiency or DEFAULT_MATMUL_EFFICIENCY) * gpu.bf16_flops


def step_time(workload: Workload, gpu: GPU, checkpointed_layers: int = 0) -> StepTime:
    """The model's seconds per token of `workload` on `gpu` with `checkpointed_layers` recomputed."""
    matmul_rate = matmul_flops_per_s(gpu)
    attention_rate = ATTENTION_EFFICIENCY[gpu.architecture] * gpu.bf16_flops
    byte_rate = BANDWIDTH_EFFICIENCY * gpu.bandwidth_bytes_per_s
    one_layer_forward = (
        workload.layer_forward_flops / matmul_rate
        + workload.layer_attention_forward_flops / attention_rate
        + ACTIVATION_PASSES * workload.layer_activation_bytes / 3 / byte_rate
    )
    return StepTime(
        matmul=workload.matmul_flops / matmul_rate,
        attention=workload.attention_flops / attention_rate,
        memory=(ACTIVATION_PASSES * workload.activation_bytes + workload.weight_bytes) / byte_rate,
        recompute=RECOMPUTE_SHARE * min(checkpointed_layers, workload.layers) * one_layer_forward,
    )


def physical_limit(workload: Workload, gpu: GPU) -> float:
    """Tokens/s at 100% of the datasheet peak: no real step reaches it."""
    return gpu.bf16_flops / workload.flops_per_token


def modelled_tokens_per_s(
    recipe: Recipe, gpu: GPU, micro_batch_size: int | None = None, checkpointed_layers: int | None = None
) -> float:
    """The model's tokens/s of one GPU for the recipe (its own micro-batch and checkpointing unless given)."""
    layers = recipe.checkpointed_layer_count if checkpointed_layers is None else checkpointed_layers
    return step_time(recipe_workload(recipe, micro_batch_size=micro_batch_size), gpu, layers).tokens_per_s


# ---------------------------------------------------------------------- published checks
@dataclass(frozen=True)
class PublishedRun:
    """A published throughput the model is checked against (docs/benchmarks.md, the tests)."""

    name: str
    gpu: str
    tokens_per_s: float  # measured, per GPU
    workload: Workload
    checkpointed_layers: int
    source: str


def _mpt_1b(micro_batch_size: int, tokens_per_step_per_gpu: float) -> Workload:
    # llm-foundry scripts/train/yamls/pretrain/mpt-1b.yaml: d_model 2048, 24 layers, 16 heads,
    # expansion_ratio 4 (a GELU MLP: two matrices), vocabulary 50,368 tied; 1,315,950,592 parameters.
    return dense_workload(
        layers=24,
        hidden=2048,
        intermediate=8192,
        heads=16,
        kv_heads=16,
        vocab_rows=50_368,
        seq_len=2048,
        parameters=1_315_950_592,
        micro_batch_size=micro_batch_size,
        tokens_per_step=tokens_per_step_per_gpu,
        mlp_matrices=2,
    )


def published_runs(one_b: Recipe) -> list[PublishedRun]:
    """The published measurements, with `one_b` the shipped `1b` recipe."""
    foundry = (
        "MosaicML llm-foundry scripts/train/benchmarking/README.md, MPT-1b, ctx 2048, bf16, "
        "8 GPUs FSDP, micro-batch 14, no activation checkpointing"
    )
    run_1b = "the single-A100 run the 1b recipe reproduces (bf16, torch.compile, micro-batch 8)"
    return [
        PublishedRun("1b", "A100 80GB SXM", 28_300, recipe_workload(one_b), 0, run_1b),
        PublishedRun(
            "1b, gradient checkpointing",
            "A100 80GB SXM",
            24_000,
            recipe_workload(one_b),
            one_b.model.num_hidden_layers,
            run_1b,
        ),
        PublishedRun("MPT-1b", "A100 80GB SXM", 20_513, _mpt_1b(14, 917_504 / 8), 0, foundry),
        PublishedRun("MPT-1b", "H100 SXM", 45_455, _mpt_1b(14, 229_376 / 8), 0, foundry),
    ]


def modelled(run: PublishedRun) -> float:
    return step_time(run.workload, gpu_named(run.gpu), run.checkpointed_layers).tokens_per_s


# ---------------------------------------------------------------------- is this node slow?
def slow_node_warning(measured_tokens_per_s: float, device_name: str, recipe: Recipe) -> str | None:
    """A line naming this GPU as likely slow or faulty when it delivers less than SLOW_NODE_FRACTION of
    the model for its kind, else None (also for a device the GPU table does not know, e.g. a CPU).

    `measured_tokens_per_s` is one GPU's rate after warm-up (compilation) with the recipe's own
    micro-batch and checkpointing. The model is of the compiled bf16 step: an eager or fp32 run is
    slower by design, not by fault, and is not judged.
    """
    gpu = find_gpu(device_name)
    modelled_step = recipe.train.compile and recipe.train.mixed_precision in ("auto", "bf16")
    if gpu is None or measured_tokens_per_s <= 0 or not modelled_step:
        return None
    expected = modelled_tokens_per_s(recipe, gpu)
    if measured_tokens_per_s >= SLOW_NODE_FRACTION * expected:
        return None
    return (
        f"this {gpu.name} delivers {measured_tokens_per_s:,.0f} tokens/s, {1 - measured_tokens_per_s / expected:.0%} "
        f"below the {expected:,.0f} the performance model expects of one: likely a slow or faulty node "
        f"(clocks or thermals: nvidia-smi -q -d CLOCK,PERFORMANCE; a shared host; a PCIe card sold as SXM); "
        f"the run goes on"
    )
