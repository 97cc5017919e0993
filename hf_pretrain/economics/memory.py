"""GPU memory a recipe needs on one process, before anything is allocated.

State, for N parameters (tied embeddings counted once):
    fp32 master weights 4N + AdamW exp_avg and exp_avg_sq 8N, always (with `optimizer: muon`, the
        decoder's matrices keep one momentum, 4 bytes, instead of AdamW's 8);
    fp32 gradients 4N, from the first backward pass to the optimizer step (`zero_grad` frees them);
    2N for the bf16/fp16 weight copies autocast makes for the matmuls (mixed precision only), which
    the matmuls keep for their backward: they live as long as the activations.

The peak of a step is the larger of two moments:
    the start of the backward pass: weights, AdamW, the weight copies, every saved activation and
        the loss's buffers, plus the gradients when the step accumulates micro-batches (from the
        second micro-batch on, the gradients of the first are alive through the forward pass);
    the end of the backward pass: weights, AdamW and every gradient, plus, with a tied embedding,
        two V x h fp32 buffers: the lookup's dense gradient and the sum autograd makes of it and
        the output projection's gradient (8Vh).

Activations saved for the backward pass follow Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", sec. 4.1: s*b*h*(34 + 5*a*s/h) bytes per GPT layer),
adapted to what a Hugging Face Llama layer keeps under Accelerate's autocast with SDPA attention.
Per token and layer, with h = hidden_size, h_kv = num_key_value_heads * head_dim (GQA),
I = intermediate_size (SwiGLU), a = num_attention_heads:
    mixed precision:  30h + 4*h_kv + 8I + 4a + 8 bytes
        the residual stream stays fp32 (the weights are fp32, autocast only casts matmul inputs),
        so each RMSNorm keeps its fp32 input and normalised output and hands a bf16 copy to the
        next matmul; Q, K and V (K and V at h_kv width: SDPA takes GQA without repeating heads),
        the attention output and o_proj's input in bf16; gate, up, SiLU(gate) and their product
        (4 x 2I); the fp32 log-sum-exp of the attention rows (4a) and the norms' rsqrt (8).
        Flash / memory-efficient SDPA never stores the s x s scores, so Korthikanti's 5as/h term
        and the dropout masks are gone.
    fp32 (no mixed precision):  32h + 8*h_kv + 16I + 4a + 8 bytes.
These coefficients were measured with `torch.autograd.graph.saved_tensors_hooks` on
transformers 5.x (CPU SDPA, which saves the same tensors as the flash kernel).
With gradient checkpointing (per decoder layer) only each layer's fp32 input is kept (4h per token
and layer) and one layer's activations are recomputed at a time during the backward pass. Selective
checkpointing of k of the L layers (`train.checkpointed_layers`) keeps L - k layers' activations and
k layer inputs; the checkpointed layers are the first k, which the backward pass reaches last, after
the others' activations are freed, so their recomputation adds to the peak only when k = L.
The head adds, per token, the final norm (10h mixed, 12h fp32), and its backward the larger of two
moments: the loss's backward, 12V per token in both precisions (the fp32 log-softmax kept for it, its
incoming gradient and the logits' gradient; in mixed precision the bf16 logits and their gradient
come and go around them), or the output projection's, the logits' gradient (4V per token) beside the
projection's new weight gradient (4Vh), and, from a step's second micro-batch on, autograd's sum of
it with the gradient already there (4Vh more). Liger's fused linear cross entropy never materialises
the logits (chunked), but computes its gradients in the forward pass and keeps them for the backward:
the projection's weight gradient (4Vh) and the input's (4h per token), read from liger-kernel 0.8.5's
source, not measured (its kernels need a GPU).

Calibrated 2026-11-23 against the measured peak of real CPU optimizer steps (`benchmarks/bench_memory.py`:
the CPU allocator's live tensor bytes, not RSS), 1.3M to 187M parameters, fp32 and bf16, with and
without accumulation and checkpointing: every estimate within 3% (docs/gpu.md); the previous
formula (always the sum of everything, 8V/10V at the loss) was 17% low to 21% high.

It is an estimate for one process without FSDP sharding (FSDP divides the static state by the
number of processes): torch.compile and Liger kernels only lower the real figure, while the CUDA
context, cuBLAS workspaces and allocator fragmentation are left to the caller's headroom.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hf_pretrain.config import Recipe
from hf_pretrain.hardware import training_precision
from hf_pretrain.model import llama_config, recipe_parameter_count

# Bytes per parameter: fp32 weights, fp32 gradients, AdamW's two fp32 moments, autocast's 16-bit copy.
# Accelerate's autocast keeps the weights in fp32, so the gradients (and what DDP all-reduces) are fp32.
WEIGHT_BYTES, GRADIENT_BYTES, ADAM_BYTES, HALF_COPY_BYTES = 4, 4, 8, 2
# Muon keeps one fp32 momentum per matrix element (`optimizer: muon`: the decoder's matrices).
MUON_BYTES = 4
# What a checkpoint keeps of that state per parameter: the fp32 weights and AdamW's moments (the
# gradients are freed at every step, autocast's copies are made again). Under FSDP the same total is
# spread over one file per process. With Muon a checkpoint is smaller (about 2/3 of this for the 1b):
# the disk checks keep AdamW's figure, an upper bound.
CHECKPOINT_BYTES_PER_PARAMETER = WEIGHT_BYTES + ADAM_BYTES
# Bytes per token per layer of the fp32 residual stream kept at each checkpointed layer boundary.
RESIDUAL_BYTES = 4
# Share of the device's memory a run can count on: the CUDA context, cuBLAS/NCCL workspaces and
# allocator fragmentation take the rest.
USABLE_MEMORY_FRACTION = 0.9
# Bytes per token and vocabulary row at the loss's backward: three fp32 buffers (module docstring).
LOSS_BYTES_PER_LOGIT = 12


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on one GPU for the recipe's micro-batch; `total(checkpointing)` is the peak."""

    parameters: int
    weights: int
    gradients: int
    optimizer: int
    weight_copies: int  # autocast's bf16/fp16 copies of the weights (0 in fp32)
    activations: int  # every layer's saved activations, no checkpointing
    checkpointed_activations: int  # layer inputs + one layer's activations being recomputed
    head: int  # final norm + logits and loss
    embedding_gradient: int = 0  # the tied embedding's gradient being summed at the end of the backward
    accumulating: bool = True  # more than one micro-batch per step: gradients live through the forward
    layers: int = 0  # decoder layers
    layer_input: int = 0  # one checkpointed layer's saved fp32 input

    @property
    def static(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.weight_copies

    def total(self, checkpointing: bool) -> int:
        """The step's peak with every layer checkpointed or none (module docstring)."""
        return self.peak(self.layers if checkpointing else 0)

    def saved_activations(self, checkpointed_layers: int) -> int:
        """Activations alive at the start of the backward pass with the first k layers checkpointed."""
        k = max(0, min(checkpointed_layers, self.layers))
        if k == self.layers:
            return self.checkpointed_activations
        per_layer = self.activations // self.layers if self.layers else 0
        return (self.layers - k) * per_layer + k * self.layer_input

    def peak(self, checkpointed_layers: int) -> int:
        """The step's peak with `checkpointed_layers` of the layers recomputing their activations: the
        larger of the start and the end of the backward pass (module docstring)."""
        activations = self.saved_activations(checkpointed_layers)
        start = self.weight_copies + activations + self.head + (self.gradients if self.accumulating else 0)
        end = self.gradients + self.embedding_gradient
        return self.weights + self.optimizer + max(start, end)


def uses_mixed_precision(recipe: Recipe, cuda_available: bool) -> bool:
    """bf16/fp16 autocast, decided the way training decides (`hardware.training_precision`)."""
    return training_precision(recipe.train.mixed_precision, cuda_available) != "no"


def layer_activation_bytes_per_token(recipe: Recipe, mixed_precision: bool) -> int:
    """Bytes one decoder layer saves for backward per token (formula in the module docstring)."""
    m = recipe.model
    h, inner, heads = m.hidden_size, m.intermediate_size, m.num_attention_heads
    kv_width = m.num_key_value_heads * (h // heads)
    if mixed_precision:
        return 30 * h + 4 * kv_width + 8 * inner + 4 * heads + 8
    return 32 * h + 8 * kv_width + 16 * inner + 4 * heads + 8


def head_bytes(recipe: Recipe, vocab_rows: int, tokens: int, mixed_precision: bool, accumulating: bool) -> int:
    """Final norm plus the head's backward for `tokens` tokens (module docstring); under Liger's fused
    loss, the gradients it computes in the forward pass instead of the logits."""
    h = recipe.model.hidden_size
    norm = (10 * h if mixed_precision else 12 * h) * tokens
    if recipe.train.liger:
        return norm + GRADIENT_BYTES * vocab_rows * h + GRADIENT_BYTES * tokens * h
    loss = LOSS_BYTES_PER_LOGIT * vocab_rows * tokens
    # the logits' gradient beside the output projection's new weight gradient (and its sum with the
    # gradient of the step's earlier micro-batches)
    projection = GRADIENT_BYTES * vocab_rows * tokens + (2 if accumulating else 1) * GRADIENT_BYTES * vocab_rows * h
    return norm + max(loss, projection)


def decoder_matrix_parameters(recipe: Recipe) -> int:
    """Elements of the decoder's 2-D matrices (q, k, v, o; gate, up, down): what Muon trains."""
    m = recipe.model
    kv = m.num_key_value_heads * (m.hidden_size // m.num_attention_heads)
    per_layer = 2 * m.hidden_size * m.hidden_size + 2 * m.hidden_size * kv + 3 * m.hidden_size * m.intermediate_size
    return m.num_hidden_layers * per_layer


def optimizer_state_bytes(recipe: Recipe, n: int) -> int:
    """AdamW's two moments for every parameter; with Muon, one momentum for the decoder's matrices."""
    if recipe.train.optimizer == "muon":
        return ADAM_BYTES * n - (ADAM_BYTES - MUON_BYTES) * decoder_matrix_parameters(recipe)
    return ADAM_BYTES * n


def estimate_memory(
    recipe: Recipe, tokenizer_size: int, cuda_available: bool = True, world_size: int = 1
) -> MemoryEstimate:
    """Peak training memory of one process for `recipe` (see the module docstring for the formulas).

    `cuda_available` resolves `mixed_precision: auto` the way training will (bf16 on a GPU);
    `world_size` decides whether a process accumulates micro-batches.
    """
    config = llama_config(recipe.model, tokenizer_size)
    n = recipe_parameter_count(recipe, tokenizer_size)
    mixed = uses_mixed_precision(recipe, cuda_available)
    tokens = recipe.train.micro_batch_size * recipe.data.seq_len
    accumulating = recipe.train.global_batch_tokens > tokens * world_size  # more than one micro-batch a step
    layers = recipe.model.num_hidden_layers
    per_layer = tokens * layer_activation_bytes_per_token(recipe, mixed)
    return MemoryEstimate(
        parameters=n,
        weights=WEIGHT_BYTES * n,
        gradients=GRADIENT_BYTES * n,
        optimizer=optimizer_state_bytes(recipe, n),
        weight_copies=HALF_COPY_BYTES * n if mixed else 0,
        activations=layers * per_layer,
        checkpointed_activations=layers * tokens * recipe.model.hidden_size * RESIDUAL_BYTES + per_layer,
        head=head_bytes(recipe, config.vocab_size, tokens, mixed, accumulating),
        embedding_gradient=2 * WEIGHT_BYTES * config.vocab_size * config.hidden_size
        if config.tie_word_embeddings
        else 0,
        accumulating=accumulating,
        layers=layers,
        layer_input=tokens * recipe.model.hidden_size * RESIDUAL_BYTES,
    )


def with_micro_batch(recipe: Recipe, micro_batch_size: int) -> Recipe:
    """The same recipe at another micro-batch size (for 'what would fit' questions)."""
    return dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, micro_batch_size=micro_batch_size))


def with_checkpointed_layers(recipe: Recipe, checkpointed_layers: int) -> Recipe:
    """The same recipe with `checkpointed_layers` of its layers recomputed (0: none)."""
    return dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, checkpointed_layers=checkpointed_layers))


@dataclass(frozen=True)
class Fit:
    """How a recipe fits one GPU: the setting chosen, or why none does."""

    fits: bool
    micro_batch_size: int | None  # None: does not fit
    checkpointed_layers: int | None
    peak_bytes: int  # estimated peak of the setting chosen, or of the smallest one tried
    usable_bytes: int
    reason: str  # one line: what was chosen and why, or why nothing fits


def micro_batch_sizes(recipe: Recipe, world_size: int = 1) -> list[int]:
    """The recipe's micro-batch and every smaller one that still divides its batch, largest first."""
    per_process = recipe.train.global_batch_tokens // world_size
    return [
        size
        for size in range(recipe.train.micro_batch_size, 0, -1)
        if per_process % (size * recipe.data.seq_len) == 0 or size == recipe.train.micro_batch_size
    ]


def fit_in_memory(
    recipe: Recipe,
    tokenizer_size: int,
    memory_bytes: int,
    micro_batch_size: int | None = None,
    checkpointed_layers: int | None = None,
    world_size: int = 1,
) -> Fit:
    """The setting that fits `memory_bytes` (x USABLE_MEMORY_FRACTION): at the recipe's micro-batch,
    no checkpointing, else the fewest checkpointed layers; only when even every layer checkpointed
    does not fit, the next smaller micro-batch that divides the batch, the same way. A micro-batch or
    a number of checkpointed layers given here is kept as it is (the user asked for it): the search
    only moves the other, and says so when that setting cannot fit."""
    usable = int(USABLE_MEMORY_FRACTION * memory_bytes)
    layers = recipe.model.num_hidden_layers
    sizes = [micro_batch_size] if micro_batch_size else micro_batch_sizes(recipe, world_size)
    counts = [checkpointed_layers] if checkpointed_layers is not None else list(range(layers + 1))
    smallest = None
    for size in sizes:
        estimate = estimate_memory(with_micro_batch(recipe, size), tokenizer_size, True, world_size)
        for count in counts:
            peak = estimate.peak(count)
            if peak <= usable:
                return Fit(True, size, count, peak, usable, _fit_reason(recipe, size, count, layers))
            smallest = peak
    assert smallest is not None
    asked = []
    if micro_batch_size:
        asked.append(f"micro_batch_size {micro_batch_size}")
    if checkpointed_layers is not None:
        asked.append(f"{checkpointed_layers} of {layers} layers checkpointed")
    tried = " and ".join(asked) or f"micro-batch 1 with all {layers} layers checkpointed"
    return Fit(
        False,
        None,
        None,
        smallest,
        usable,
        f"does not fit: {tried} needs {smallest / 2**30:,.1f} GiB, {usable / 2**30:,.1f} GiB usable",
    )


def _fit_reason(recipe: Recipe, size: int, count: int, layers: int) -> str:
    smaller = size < recipe.train.micro_batch_size
    if count == 0:
        return "fits" + (f" at micro-batch {size} (accumulation keeps the batch)" if smaller else "")
    return f"{count} of {layers} layers checkpointed" + (f" at micro-batch {size}" if smaller else "")
