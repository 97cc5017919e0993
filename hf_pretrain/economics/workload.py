"""What one token of a training step costs, independent of the GPU: FLOPs by kind and bytes moved by
the memory-bound kernels, for the configuration that will run (compiled or eager, Liger, the
optimizer, the precision, the micro-batch, the checkpointed layers: run_profile.Step). performance.py turns it into
seconds on a GPU.

Bytes are counted kernel by kernel, per token, in the forward pass of one decoder layer; the
backward moves BACKWARD_POINTWISE times as much (each elementwise kernel's backward reads its saved
input and the incoming gradient and writes the outgoing one, and some read two saved tensors).
Activations are bf16 (2 bytes; the residual stream too, model.train_in_compute_dtype), fp32 where
the code upcasts. With h the hidden width, kv the key/value width and I the MLP width:

    compiled (inductor fuses each run of pointwise ops into one kernel: each reads its inputs and
    writes its outputs once)
        RMSNorm in 2h, out 2h (x2), RoPE q and k in and out, the residual adds (each also feeding the
        next norm), SwiGLU gate and up in, product out:                22h + 4kv + 6I
    eager (transformers' modules op by op, each op a kernel; autocast on fp32 weights)
        RMSNorm: to fp32 6h, pow 8h, mean 4h, x rsqrt 8h, to bf16 6h, x fp32 weight (fp32 out) 6h
        = 38h, and every linear reading it casts it back to bf16 (6h each: q, k, v; gate, up);
        RoPE per tensor of width w: q*cos 4w, the negated half 2w, cat 4w, *sin 4w, add 6w = 20w;
        the attention output's transpose copy 4h; residual adds 6h each; SiLU 4I, the product 6I:
                                                                        142h + 20kv + 10I
    eager with Liger (its Triton RMSNorm, RoPE and SwiGLU are one kernel each; the residual adds
    and the attention output's copy stay eager):                        28h + 4kv + 6I
    compiled with Liger: the compiled layer (Liger's layer kernels move what inductor's do)

The loss, per vocabulary row (logit) and token, forward and backward together: compiled, the fused
log-softmax reads the bf16 logits, the backward reads them again and writes their gradient (6);
eager, transformers' loss upcasts them to fp32 (6), log-softmax (8), the dense gradient of the NLL
(4), log-softmax's backward (12), the cast back (6) = 36; Liger's fused linear cross entropy writes
each chunk of logits once and turns it into its gradient in place (4).
"""

from __future__ import annotations

from dataclasses import dataclass

from hf_pretrain.config import DataConfig, ModelConfig
from hf_pretrain.machine.run_profile import Step
from hf_pretrain.model.fp8 import pays_in_fp8
from hf_pretrain.model.llama import llama_config, model_parameter_count, shape_flops_per_token, tokenizer_size_of

# Chosen: an elementwise op's backward reads its saved input and the incoming gradient and writes the
# outgoing gradient; norms and products read two saved tensors (docs/gpu.md's step budget, issue 26).
BACKWARD_POINTWISE = 2.0
# Bytes per vocabulary row and token of the loss, forward and backward (module docstring).
LOSS_BYTES = {"compiled": 6, "eager": 36, "liger": 4}
# Per parameter and micro-batch: autocast reads the fp32 weight and writes its bf16 copy; the fp32
# gradient is read and written to accumulate each micro-batch's.
WEIGHT_BYTES_PER_MICRO_BATCH = 4 + 2 + 8
# Per parameter and optimizer step: fused AdamW reads weight, gradient and both moments and writes
# three of them back; the gradient is zeroed. Muon's momentum and update move about as much.
OPTIMIZER_BYTES_PER_PARAMETER = 16 + 12 + 4
# torch.optim.Muon's Newton-Schulz iterations per matrix and optimizer step (its DEFAULT_NS_STEPS;
# hf_pretrain/optim/muon.py does not change it).
MUON_NS_STEPS = 5


# A precision that converts the decoder linears (FP8: torchao float8, dynamic tensorwise scaling), bytes per
# element that a converted linear casts (inputs in the forward, output gradients in the backward), with o its
# operand bytes (precisions.py; fp8: 1): the bf16 tensor read (2), written as an operand (o), and its
# transposed copy for the other matmul of the backward (read o, write o). Compiled, the amax is taken in the
# kernel that produces the tensor; eager, it reads the tensor once more (2). The weights, per parameter and
# micro-batch: the fp32 master read for its amax and its cast (4 + 4), written as an operand (o), transposed
# (o + o).
def cast_bytes_per_element(operand_bytes: int, compiled: bool) -> int:
    return 2 + (0 if compiled else 2) + 3 * operand_bytes


def cast_weight_bytes_per_micro_batch(operand_bytes: int) -> int:
    return 4 + 4 + 3 * operand_bytes


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's shape (Llama: 3 MLP matrices, SwiGLU; MPT/GPT: 2, one activation)."""

    layers: int
    hidden: int
    kv_width: int  # key/value heads x head dim
    intermediate: int
    vocab_rows: int  # the output projection's rows (the padded vocabulary)
    seq_len: int
    parameters: int
    mlp_matrices: int = 3

    @property
    def layer_matrix_parameters(self) -> int:
        """One decoder layer's linear weights: q and o (h x h), k and v (h x kv), the MLP."""
        h = self.hidden
        return h * (2 * h + 2 * self.kv_width) + self.mlp_matrices * h * self.intermediate

    def projections(self) -> list[tuple[int, int]]:
        """(in_features, out_features) of one decoder layer's linear layers: q, k, v, o, then the MLP's."""
        h, kv, i = self.hidden, self.kv_width, self.intermediate
        return [(h, h), (h, kv), (h, kv), (h, h), *[(h, i)] * (self.mlp_matrices - 1), (i, h)]

    def fp8_projections(self, fp8_recipe: str) -> list[tuple[int, int]]:
        """The projections fp8.py's size rule converts to FP8 (a GPU run: emulation is not priced)."""
        return [(n_in, n_out) for n_in, n_out in self.projections() if pays_in_fp8(n_in, n_out, fp8_recipe)]

    def muon_matrices(self) -> list[tuple[int, int]]:
        """(rows, cols) of every decoder matrix Muon orthogonalises."""
        h, kv, i = self.hidden, self.kv_width, self.intermediate
        mlp = [(i, h)] * (self.mlp_matrices - 1) + [(h, i)]
        return [(h, h), (kv, h), (kv, h), (h, h), *mlp] * self.layers


def layer_forward_bytes(shape: Shape, config: Step) -> float:
    """Bytes the memory-bound kernels of one decoder layer's forward move per token (module docstring)."""
    h, kv, i = shape.hidden, shape.kv_width, shape.intermediate
    gated = shape.mlp_matrices == 3  # SwiGLU: gate and up in, product out; else one activation, in and out
    if config.compiled or config.liger:
        base = 22 * h + 4 * kv + (6 * i if gated else 4 * i)
        if config.liger and not config.compiled:
            base += 6 * h  # the residual adds and the attention output's copy stay eager
    else:
        base = 142 * h + 20 * kv + (10 * i if gated else 4 * i)
    return base * config.compute_bytes / 2  # counted in bf16's 2 bytes; fp32 activations: twice the bytes


def loss_bytes_per_row(config: Step) -> int:
    if config.liger:
        return LOSS_BYTES["liger"]
    return LOSS_BYTES["compiled" if config.compiled else "eager"]


@dataclass(frozen=True)
class Workload:
    """What one token of a training step costs on one GPU, independent of the GPU."""

    shape: Shape
    config: Step
    linear_flops: float  # the decoder layers' linear layers, forward and backward: 6 x their weights
    head_flops: float  # the output projection: 6 x vocabulary rows x hidden
    attention_flops: float  # causal (the mask skips half): 6 x layers x hidden x seq_len
    optimizer_flops: float  # Muon's Newton-Schulz matmuls, spread over the step's tokens on this GPU
    pointwise_bytes: float  # the memory-bound kernels of every layer and the loss, forward and backward
    weight_bytes: float  # weight casts and gradient accumulation per micro-batch, the optimizer per step
    fp8_cast_bytes: float  # FP8 only: the decoder linears' casts to fp8 (activations, gradients, weights)
    fp8_linear_flops: float  # FP8 only: the part of linear_flops in the projections that go FP8 (the rest: bf16)
    layer_forward_flops: float  # one layer's linear forward FLOPs (what a recompute repeats)
    layer_fp8_forward_flops: float  # of which in FP8
    layer_attention_forward_flops: float
    layer_forward_bytes: float
    flops_per_token: float  # the project's count (model.shape_flops_per_token): MFU, limit

    @property
    def layers(self) -> int:
        return self.shape.layers


def muon_flops_per_step(shape: Shape) -> float:
    """Newton-Schulz FLOPs of one optimizer step: per matrix (m <= n after transposing) and iteration,
    X X^T (2 m^2 n), A A (2 m^3), B X (2 m^2 n) (torch.optim.Muon's _zeropower_via_newtonschulz)."""
    total = 0.0
    for rows, cols in shape.muon_matrices():
        m, n = min(rows, cols), max(rows, cols)
        total += 4.0 * m * m * n + 2.0 * m**3
    return MUON_NS_STEPS * total


def workload(shape: Shape, config: Step, tokens_per_step: float) -> Workload:
    """The workload of `shape` run as `config`, with `tokens_per_step` tokens per optimizer step on this GPU."""
    h, s = shape.hidden, shape.seq_len
    layer_bytes = layer_forward_bytes(shape, config)
    final_norm = 4 * h if (config.compiled or config.liger) else 44 * h
    pointwise = shape.layers * layer_bytes * (1 + BACKWARD_POINTWISE) + final_norm * (1 + BACKWARD_POINTWISE)
    pointwise += loss_bytes_per_row(config) * shape.vocab_rows
    tokens_per_micro_batch = config.micro_batch_size * s
    weights = WEIGHT_BYTES_PER_MICRO_BATCH * shape.parameters / tokens_per_micro_batch
    weights += OPTIMIZER_BYTES_PER_PARAMETER * shape.parameters / tokens_per_step
    if not config.autocast:
        weights -= 2 * shape.parameters / tokens_per_micro_batch  # no bf16 copy of the weights
    fp8, fp8_layer_weights, precision = 0.0, 0, config.precision_facts
    if precision.converts_linears:  # only the projections where FP8 pays (fp8.py) cast; the others stay bf16
        converted = shape.fp8_projections(config.fp8_recipe)
        fp8_layer_weights = sum(n_in * n_out for n_in, n_out in converted)
        cast_elements = sum(n_in + n_out for n_in, n_out in converted)  # each input, each output's gradient
        per_element = cast_bytes_per_element(precision.operand_bytes, config.compiled)
        fp8 = shape.layers * per_element * cast_elements
        weight_casts = cast_weight_bytes_per_micro_batch(precision.operand_bytes)
        fp8 += weight_casts * shape.layers * fp8_layer_weights / tokens_per_micro_batch
    optimizer_flops = muon_flops_per_step(shape) / tokens_per_step if config.optimizer == "muon" else 0.0
    return Workload(
        shape=shape,
        config=config,
        linear_flops=6.0 * shape.layers * shape.layer_matrix_parameters,
        head_flops=6.0 * shape.vocab_rows * h,
        attention_flops=6.0 * shape.layers * h * s,
        optimizer_flops=optimizer_flops,
        pointwise_bytes=pointwise,
        weight_bytes=weights,
        fp8_cast_bytes=fp8,
        fp8_linear_flops=6.0 * shape.layers * fp8_layer_weights,
        layer_forward_flops=2.0 * shape.layer_matrix_parameters,
        layer_fp8_forward_flops=2.0 * fp8_layer_weights,
        layer_attention_forward_flops=2.0 * h * s,
        layer_forward_bytes=layer_bytes,
        flops_per_token=shape_flops_per_token(shape.parameters, shape.layers, h, s),
    )


def model_shape(m: ModelConfig, data: DataConfig, tokenizer_size: int | None = None) -> Shape:
    """The model section's shape at the data section's context length; its vocabulary the data section's
    tokenizer's unless `tokenizer_size` (a prepared one's) is given."""
    size = tokenizer_size_of(data) if tokenizer_size is None else tokenizer_size
    return Shape(
        layers=m.num_hidden_layers,
        hidden=m.hidden_size,
        kv_width=m.num_key_value_heads * (m.hidden_size // m.num_attention_heads),
        intermediate=m.intermediate_size,
        vocab_rows=llama_config(m, size).vocab_size,
        seq_len=data.seq_len,
        parameters=model_parameter_count(m, size),
    )


def run_workload(
    model: ModelConfig, data: DataConfig, step: Step, global_batch_tokens: int, tokenizer_size: int | None = None
) -> Workload:
    """The workload of `step` (a door's profile's, or a what-if's for a card, machine/what_if.py) on one of its
    `world_size` data-parallel GPUs: the model section's shape at the data section's context, a share of
    `global_batch_tokens` per optimizer step; its vocabulary the data section's tokenizer's unless
    `tokenizer_size` (a prepared one's) is given."""
    return workload(model_shape(model, data, tokenizer_size), step, global_batch_tokens / step.world_size)
