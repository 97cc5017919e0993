"""GPU memory a recipe needs on one process, before anything is allocated: the configuration that will run.

What is estimated is what `torch.cuda.max_memory_allocated` reports over an optimizer step: the
bytes of live tensors. The card needs more than that, which `USABLE_MEMORY_FRACTION` (90% of it)
leaves aside: the CUDA context, outside PyTorch's allocator (several hundred MiB); blocks the
caching allocator holds but no tensor uses (fragmentation: `memory_reserved` minus
`memory_allocated`, PyTorch's "CUDA semantics: memory management" notes; `expandable_segments`
narrows it); NCCL's buffers on several GPUs. Inside the figure, the allocator rounds every request
up to a multiple of 512 bytes (c10's CUDACachingAllocator, `kMinBlockSize`): nothing at these sizes.

State, for N parameters (tied embeddings counted once):
    fp32 master weights 4N + AdamW exp_avg and exp_avg_sq 8N, always (with `optimizer: muon`, the
        decoder's matrices keep one momentum, 4 bytes, instead of AdamW's 8);
    fp32 gradients 4N, from the first backward pass to the optimizer step (`zero_grad` frees them);
    under bf16/fp16 autocast, a 16-bit copy of every weight (2N) that the matmuls keep for their
        backward: autocast's cache in eager mode, saved tensors of the compiled graph (AOTAutograd's
        partition saves the bf16 weights rather than casting again): they live as long as the activations.

The peak of a step is the larger of two moments:
    the start of the backward pass: weights, AdamW, the weight copies, every saved activation and
        the head's buffers, plus the gradients when the step accumulates micro-batches (from the
        second micro-batch on, the gradients of the first are alive through the forward pass);
    the end of the backward pass: weights, AdamW and every gradient, plus, with a tied embedding,
        two V x h fp32 buffers: the lookup's dense gradient and the sum autograd makes of it and
        the output projection's gradient (8Vh).

Activations saved for the backward pass, per token and layer, with h = hidden_size, h_kv =
num_key_value_heads * head_dim (GQA), I = intermediate_size (SwiGLU), a = num_attention_heads and e
the bytes of the compute dtype (2 under bf16/fp16 autocast, 4 in fp32). The residual stream is in
the compute dtype (`model.train_in_compute_dtype`); attention is a flash-style SDPA, which keeps
Q, K, V (K and V at h_kv width: no repeated heads), its output and the rows' fp32 log-sum-exp (4a),
never the s x s scores (so Korthikanti et al. 2022's 5as/h term and the dropout masks are gone).
    compiled (torch.compile, inductor's partition of the joint graph):  e*(6h + 2h_kv + 3I) + 4a + 8
        the layer's input, each RMSNorm's normalised output and fp32 rsqrt (8), Q, K, V, the
        attention output, the residual between attention and MLP, and gate, up and their SiLU
        product (the down projection's input). The norm's fp32 upcast, SiLU(gate) and autocast's
        casts are fused into kernels and recomputed in the backward.
    eager with Liger's kernels: the same, read from liger-kernel 0.8.5's source (its kernels need a
        GPU): the fused RMSNorm keeps its input and rstd, the fused SwiGLU its gate and up, RoPE
        nothing but cos and sin; the norm's output is already bf16, so one copy feeds Q, K and V.
    eager under autocast:  26h + 4h_kv + 8I + 4a + 8
        each RMSNorm keeps its fp32 upcast (4h) and its bf16 normalised value (2h); autocast casts
        the norm's fp32 output (fp32 weight x bf16) to bf16 once per projection (Q, K, V: 3 x 2h;
        gate, up: 2 x 2h); Q and the attention output (2 x 2h); gate, up, SiLU(gate) and the
        product (4 x 2I).
    eager fp32:  32h + 8h_kv + 16I + 4a + 8.
`tests/test_memory_estimate.py` holds these against the tensors the step saves at the 1b width
(2 layers, a short sequence, per token): AOTAutograd's saved tensors under inductor's partition for
compiled, `torch.autograd.graph.saved_tensors_hooks` for eager.

With activation checkpointing of the first k of L layers (`compute.checkpointed_layers`), a
checkpointed layer keeps only its input (e*h per token) and one layer's activations are recomputed
at a time in the backward pass; the checkpointed layers are the first k, which the backward
reaches last, after the others' activations are freed, so their recomputation adds to the peak
only when k = L.

The head (`head_bytes`): the final norm, then the loss (`loss_bytes`):
    compiled: the final norm keeps e*2h + 4 per token; the graph saves the logits in the compute
        dtype (eV) and two fp32 row statistics (8), and its backward writes the logits' gradient
        (eV) beside them: 2eV + 8 per token;
    eager: the final norm 8h + 4 under autocast (12h + 4 in fp32); the loss's fp32 log-softmax
        kept for the backward, its incoming gradient and the logits' gradient: 12V per token in
        both precisions (`LOSS_BYTES_PER_LOGIT`);
    either way, if larger, the output projection's moment: the logits' gradient beside the
        projection's new weight gradient (4Vh), and, from a step's second micro-batch on, autograd's
        sum of it with the gradient already there (4Vh more);
    Liger's fused linear cross entropy never materialises the logits (chunked), but computes its
        gradients in the forward pass and keeps them for the backward: the projection's weight
        gradient (4Vh) and the input's (e*h per token), read from liger-kernel 0.8.5's source;
        `chunked_loss` (hf_pretrain/model/loss.py) does the same in torch ops, plus one chunk of
        `LOSS_CHUNK_TOKENS` tokens' logits, their fp32 copy and their gradient (e + 8 bytes a logit)
        while it runs. `mixed_precision: fp8` is estimated as bf16 (its fp8 copies are not modelled).
`compile_regions` compiles the decoder layers one by one: their activations are the compiled ones,
the head runs eagerly.

Checked against one H100 80GB (2026-11-25, the peaks in economics/measured.jsonl; `tests/test_memory_estimate.py`,
docs/gpu.md): the 1b recipe at micro-batch 8 x 2048 compiled (+2.1%), eager (-0.1%) and eager with
Liger (-0.7%); the hand-written transformers loop (its own per-layer bytes, from its graph) at
micro-batch 8 and 16, 8-11% low. `ESTIMATE_ERROR` states 15%, the bound the tests hold. It is an estimate for one process without
FSDP sharding (FSDP divides the static state by the number of processes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hf_pretrain.config import ModelConfig, TrainConfig
from hf_pretrain.machine.run_profile import Step
from hf_pretrain.model.llama import llama_config, model_parameter_count

# Bytes per parameter: fp32 weights, fp32 gradients, AdamW's two fp32 moments.
# Accelerate's autocast keeps the weights in fp32, so the gradients (and what DDP all-reduces) are fp32.
WEIGHT_BYTES, GRADIENT_BYTES, ADAM_BYTES = 4, 4, 8
# Muon keeps one fp32 momentum per matrix element (`optimizer: muon`: the decoder's matrices).
MUON_BYTES = 4
# What a checkpoint keeps of that state per parameter: the fp32 weights and AdamW's moments (the
# gradients are freed at every step, autocast's copies are made again). Under FSDP the same total is
# spread over one file per process. With Muon a checkpoint is smaller (about 2/3 of this for the 1b):
# the disk checks keep AdamW's figure, an upper bound.
CHECKPOINT_BYTES_PER_PARAMETER = WEIGHT_BYTES + ADAM_BYTES
# Share of the device's memory a run can count on: the CUDA context, reserved-but-unused allocator
# blocks and NCCL's buffers take the rest (module docstring).
USABLE_MEMORY_FRACTION = 0.9
# How far the estimate may be from a measured peak, either way: the bound tests/test_memory_estimate.py
# holds it to against the H100's peaks (each was within 3%). The doctor refuses only beyond it.
ESTIMATE_ERROR = 0.15
# Bytes per token and vocabulary row at an eager loss's backward: three fp32 buffers (module docstring).
LOSS_BYTES_PER_LOGIT = 12


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on one GPU for the recipe's micro-batch; `peak(k)` is the step's peak with k layers checkpointed."""

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
    layer_input: int = 0  # one checkpointed layer's saved input (the residual stream)
    kind: Step | None = None  # how the step runs (compiled or eager, Liger, precision: run_profile.Step)

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


# The per-token and per-layer figures below read the model section's shape and the step alone: the
# rest of the recipe (batch, data, schedule) enters only through `memory_of`.
def layer_activation_bytes_per_token(m: ModelConfig, kind: Step) -> int:
    """Bytes one decoder layer saves for backward per token (formulas in the module docstring)."""
    h, inner, heads = m.hidden_size, m.intermediate_size, m.num_attention_heads
    kv_width = m.num_key_value_heads * (h // heads)
    e = kind.compute_bytes
    if kind.compiled or kind.liger:  # fused norms and SwiGLU
        return e * (6 * h + 2 * kv_width + 3 * inner) + 4 * heads + 8
    if kind.autocast:
        return 26 * h + 4 * kv_width + 8 * inner + 4 * heads + 8
    return 32 * h + 8 * kv_width + 16 * inner + 4 * heads + 8


def saved_logits_bytes_per_token(kind: Step, vocab_rows: int) -> int:
    """What the loss keeps from its forward for its backward, per token (module docstring): the compiled
    graph the logits in the compute dtype and two fp32 row statistics, eager the fp32 log-softmax and
    the int64 target; a fused loss (Liger's, or the chunked one) keeps no logits."""
    if kind.fused_loss:
        return 0
    if kind.compiled_head:
        return kind.compute_bytes * vocab_rows + 8
    return 4 * vocab_rows + 8


def loss_bytes(model: ModelConfig, kind: Step, vocab_rows: int, tokens: int, accumulating: bool) -> int:
    """The loss's peak buffers for `tokens` tokens (module docstring): the saved logits and the
    gradients the backward writes beside them, or the output projection's gradient when larger; under
    a fused loss (Liger's, or `chunked_loss`), the gradients it computes in the forward pass instead of
    the logits, and, for the chunked one, one chunk's logits, their fp32 copy and their gradient."""
    h, e = model.hidden_size, kind.compute_bytes
    projection_gradient = GRADIENT_BYTES * vocab_rows * h
    if kind.fused_loss:
        chunk = 0
        if kind.chunked_loss:
            from hf_pretrain.model.loss import LOSS_CHUNK_TOKENS

            chunk = min(tokens, LOSS_CHUNK_TOKENS) * vocab_rows * (e + 4 + 4)
        return projection_gradient + e * tokens * h + chunk
    if kind.compiled_head:
        logits_gradient = e * vocab_rows * tokens  # written by one fused kernel, in the compute dtype
        loss = saved_logits_bytes_per_token(kind, vocab_rows) * tokens + logits_gradient
    else:
        logits_gradient = GRADIENT_BYTES * vocab_rows * tokens
        loss = LOSS_BYTES_PER_LOGIT * vocab_rows * tokens  # the log-softmax, its incoming gradient, the logits'
    # the logits' gradient beside the output projection's new weight gradient (and its sum with the
    # gradient of the step's earlier micro-batches)
    return max(loss, logits_gradient + (2 if accumulating else 1) * projection_gradient)


def head_norm_bytes_per_token(model: ModelConfig, kind: Step) -> int:
    """What the final RMSNorm keeps per token (module docstring)."""
    h, e = model.hidden_size, kind.compute_bytes
    if kind.compiled_head or kind.liger:
        return 2 * e * h + 4  # the last layer's output, the normalised value, the rsqrt
    return (8 if kind.autocast else 12) * h + 4


def head_bytes(model: ModelConfig, kind: Step, vocab_rows: int, tokens: int, accumulating: bool) -> int:
    """Final norm plus the loss for `tokens` tokens (module docstring)."""
    norm = head_norm_bytes_per_token(model, kind) * tokens
    return norm + loss_bytes(model, kind, vocab_rows, tokens, accumulating)


def decoder_matrix_parameters(m: ModelConfig) -> int:
    """Elements of the decoder's 2-D matrices (q, k, v, o; gate, up, down): what Muon trains."""
    kv = m.num_key_value_heads * (m.hidden_size // m.num_attention_heads)
    per_layer = 2 * m.hidden_size * m.hidden_size + 2 * m.hidden_size * kv + 3 * m.hidden_size * m.intermediate_size
    return m.num_hidden_layers * per_layer


def optimizer_state_bytes(optimizer: str, model: ModelConfig, n: int) -> int:
    """AdamW's two moments for every parameter; with Muon, one momentum for the decoder's matrices."""
    if optimizer == "muon":
        return ADAM_BYTES * n - (ADAM_BYTES - MUON_BYTES) * decoder_matrix_parameters(model)
    return ADAM_BYTES * n


def memory_of(
    model: ModelConfig, kind: Step, tokenizer_size: int, *, seq_len: int, global_batch_tokens: int
) -> MemoryEstimate:
    """Peak training memory of one process for the model section's Llama, a batch of `global_batch_tokens`
    in sequences of `seq_len`, run as `kind` says (see the module docstring): a door's profile's step (the
    doctor's row), or a what-if's (machine/what_if.profile_on). Its precision sets the activations' bytes; its
    optimizer, the optimizer's state; its world size, whether a process accumulates micro-batches."""
    config = llama_config(model, tokenizer_size)
    n = model_parameter_count(model, tokenizer_size)
    tokens = kind.micro_batch_size * seq_len
    accumulating = global_batch_tokens > tokens * kind.world_size  # more than one micro-batch a step
    layers = model.num_hidden_layers
    per_layer = tokens * layer_activation_bytes_per_token(model, kind)
    layer_input = tokens * model.hidden_size * kind.compute_bytes  # the residual stream's dtype
    return MemoryEstimate(
        parameters=n,
        weights=WEIGHT_BYTES * n,
        gradients=GRADIENT_BYTES * n,
        optimizer=optimizer_state_bytes(kind.optimizer, model, n),
        weight_copies=kind.compute_bytes * n if kind.autocast else 0,
        activations=layers * per_layer,
        checkpointed_activations=layers * layer_input + per_layer,
        head=head_bytes(model, kind, config.vocab_size, tokens, accumulating),
        embedding_gradient=2 * WEIGHT_BYTES * config.vocab_size * config.hidden_size
        if config.tie_word_embeddings
        else 0,
        accumulating=accumulating,
        layers=layers,
        layer_input=layer_input,
        kind=kind,
    )


@dataclass(frozen=True)
class Fit:
    """How a recipe fits one GPU: the setting chosen, or why none does."""

    fits: bool
    micro_batch_size: int | None  # None: does not fit
    checkpointed_layers: int | None
    peak_bytes: int  # estimated peak of the setting chosen, or of the smallest one tried
    usable_bytes: int
    reason: str  # one line: what was chosen and why, or why nothing fits


def micro_batch_sizes(train: TrainConfig, seq_len: int, world_size: int = 1) -> list[int]:
    """The train section's micro-batch and every smaller one that still divides its batch, largest first."""
    per_process = train.global_batch_tokens // world_size
    return [
        size
        for size in range(train.micro_batch_size, 0, -1)
        if per_process % (size * seq_len) == 0 or size == train.micro_batch_size
    ]


def fit_in_memory(
    model: ModelConfig,
    train: TrainConfig,
    step: Step,
    *,
    seq_len: int,
    tokenizer_size: int,
    memory_bytes: int,
    micro_batch_size: int | None = None,
    checkpointed_layers: int | None = None,
) -> Fit:
    """The setting that fits `memory_bytes` (x USABLE_MEMORY_FRACTION): at the train section's micro-batch,
    no checkpointing, else the fewest checkpointed layers; only when even every layer checkpointed
    does not fit, the next smaller micro-batch that divides the batch, the same way. A micro-batch or
    a number of checkpointed layers given here is kept as it is (the user asked for it): the search
    only moves the other, and says so when that setting cannot fit. `step`: how the run executes on the
    machine asked (its precision, kernels, optimizer, world size); the search sets its micro-batch."""
    usable = int(USABLE_MEMORY_FRACTION * memory_bytes)
    layers = model.num_hidden_layers
    sizes = [micro_batch_size] if micro_batch_size else micro_batch_sizes(train, seq_len, step.world_size)
    counts = [checkpointed_layers] if checkpointed_layers is not None else list(range(layers + 1))
    smallest = None
    for size in sizes:
        kind = dataclasses.replace(step, micro_batch_size=size)
        estimate = memory_of(
            model, kind, tokenizer_size, seq_len=seq_len, global_batch_tokens=train.global_batch_tokens
        )
        for count in counts:
            peak = estimate.peak(count)
            if peak <= usable:
                return Fit(True, size, count, peak, usable, _fit_reason(train.micro_batch_size, size, count, layers))
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


def _fit_reason(asked_micro_batch: int, size: int, count: int, layers: int) -> str:
    smaller = size < asked_micro_batch
    if count == 0:
        return "fits" + (f" at micro-batch {size} (accumulation keeps the batch)" if smaller else "")
    return f"{count} of {layers} layers checkpointed" + (f" at micro-batch {size}" if smaller else "")
