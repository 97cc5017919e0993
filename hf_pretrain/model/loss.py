"""The training loss: the head's matmul and the cross entropy over the vocabulary, computed one of three ways.

- `stock`: transformers' own `LlamaForCausalLM.forward`: the [tokens, vocabulary] logits, then
  `ForCausalLMLoss`. Its eager backward keeps the fp32 log-softmax of every token: 4 x vocabulary bytes
  per token (2.1 GB for one 8 x 2048 micro-batch at the 1b's 32,064 rows); compiled (inductor's
  partition) it keeps the bf16 logits, 2 x vocabulary bytes (1.05 GB), and recomputes the log-softmax.
  The step materialises the bf16 logits and their fp32 copy besides.
- `chunked` (`chunked_loss: true`): the same matmul and log-softmax, a chunk of `LOSS_CHUNK_TOKENS`
  tokens at a time, and each chunk's gradients computed in the same pass (as Liger's fused kernel does,
  in torch ops): the backward keeps the gradient of the hidden states (their size) and of the head's
  weight (its size, fp32: 263 MB at the 1b), nothing per token as wide as the vocabulary, and does no
  matmul again. Plain torch ops, so it compiles into the step's one graph, and runs the same eagerly.
- `liger` (`liger: true` on CUDA): Liger's fused linear cross entropy, kept out of the compiled graph by
  `torch.compiler.disable` (a deliberate graph break, as torchtitan's Liger integration does: its
  `liger_fused_linear_cross_entropy_loss` is disabled for the compiler). dynamo tracing Liger's
  kernel crashed on an H100 (`addmm(..., out_dtype=torch.float32, out=...)`, docs/gpu.md),
  and compiled, the same loss is silently wrong where labels carry `ignore_index`
  (linkedin/Liger-Kernel#1338). Outside the graph it runs as it ran eagerly (+42.5% over eager, measured).

Each one is the stock loss: the mean over the targets that are not `ignore_index` (tests/test_loss.py,
with and without ignored targets, eager and compiled, gradients included).
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

    from hf_pretrain.config import ComputeConfig

LossHead = Literal["stock", "chunked", "liger"]

# transformers' and torch's ignored target, which `ForCausalLMLoss` pads its shift with.
IGNORE_INDEX = -100

# Tokens per chunk of the chunked loss: one 2048-token row of the 1b's 8 x 2048 micro-batch, a head matmul
# of 2048 x 2048 x 32,064 (270 GFLOP: big enough for the GEMM's full rate, an estimate) whose logits, their
# fp32 copy and their gradient are 0.66 GB at a time where the whole micro-batch's are 5.3 GB.
LOSS_CHUNK_TOKENS = 2048


def loss_head_for(compute: ComputeConfig, liger_applied: bool) -> LossHead:
    """Which loss a run's forward computes: Liger's where its kernels were applied (CUDA), the chunked one
    where the recipe asks for it, else transformers' own."""
    if liger_applied:
        return "liger"
    return "chunked" if compute.chunked_loss else "stock"


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """The loss and, in the same pass, its gradients, a chunk of tokens at a time (Liger's scheme in torch
    ops): each chunk's logits live only inside the loop, and what the backward keeps is the gradient of
    the hidden states (their size) and of the head weight (its size, fp32), scaled there by the incoming
    gradient. Under autocast the three matmuls run in its dtype, the log-softmax in fp32, as stock."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, count, ignore_index: int, chunk_tokens: int):
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, hidden.shape[0], chunk_tokens):
            h, t = hidden[start : start + chunk_tokens], targets[start : start + chunk_tokens]
            logits = F.linear(h, weight)
            log_probs = torch.log_softmax(logits.float(), dim=-1)
            counted = t != ignore_index
            picked = t.masked_fill(~counted, 0).unsqueeze(1)
            total = total - (log_probs.gather(1, picked).squeeze(1) * counted).sum()
            # d(sum of the counted losses)/d(logits) = softmax - one-hot, zero on ignored rows
            grad_logits = log_probs.exp_().scatter_add_(1, picked, torch.full_like(log_probs[:, :1], -1.0))
            grad_logits = (grad_logits * counted.unsqueeze(1)).to(logits.dtype)
            grad_hidden[start : start + chunk_tokens] = grad_logits @ weight.to(logits.dtype)
            grad_weight += grad_logits.t() @ h.to(logits.dtype)
        ctx.save_for_backward(grad_hidden / count, grad_weight / count)
        return total / count

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_output, grad_weight * grad_output, None, None, None, None


def chunked_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
    num_items_in_batch: torch.Tensor | int | None = None,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """Cross entropy of `hidden @ weight.T` against `targets` (already shifted), never holding more than
    one chunk's logits: the mean over counted targets, or their sum over `num_items_in_batch` (transformers'
    convention for gradient accumulation). `hidden` is [..., hidden], `targets` the matching [...];
    `chunk_tokens` defaults to LOSS_CHUNK_TOKENS."""
    hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1).to(hidden.device)
    count = (targets != ignore_index).sum() if num_items_in_batch is None else num_items_in_batch
    count = torch.as_tensor(count, device=hidden.device)
    size = chunk_tokens or LOSS_CHUNK_TOKENS
    if not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)):  # evaluation
        total = sum(
            F.cross_entropy(F.linear(h, weight).float(), t, ignore_index=ignore_index, reduction="sum")
            for h, t in zip(hidden.split(size), targets.split(size), strict=True)
        )
        return total / count
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, targets, count, ignore_index, size)


@torch.compiler.disable
def liger_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """Liger's fused linear cross entropy, run eagerly even inside a compiled model (module docstring)."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    loss = liger_fused_linear_cross_entropy(
        hidden.reshape(-1, hidden.shape[-1]),
        weight,
        targets.reshape(-1).to(hidden.device),
        ignore_index=ignore_index,
        reduction="mean" if num_items_in_batch is None else "sum",
    )
    return loss if num_items_in_batch is None else loss / num_items_in_batch


LOSS_HEADS = {"chunked": chunked_linear_cross_entropy, "liger": liger_linear_cross_entropy}


def use_loss_head(model: LlamaForCausalLM, head: LossHead) -> None:
    """Give this instance a forward whose loss is `head`'s; `stock` leaves transformers' forward as it is.

    A call with `labels` runs the decoder (`model.model`), then the loss from its last hidden states and
    the head's weight (the tied embedding, where tied): no logits are returned, so none are kept. A call
    without labels (generation, export) is the stock forward. Set on the instance, as
    `train_in_compute_dtype` sets its own, and called unbound, so a copy of the module runs its own layers.
    """
    if head == "stock":
        return
    from transformers.modeling_outputs import CausalLMOutputWithPast

    loss_of = LOSS_HEADS[head]
    stock_forward = model.forward.__func__

    def forward_with_loss_head(self, input_ids=None, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        if labels is None:
            return stock_forward(self, input_ids=input_ids, **kwargs)
        kwargs.pop("logits_to_keep", None)  # no logits are computed
        ignore_index = kwargs.pop("ignore_index", IGNORE_INDEX)
        hidden = self.model(input_ids=input_ids, **kwargs).last_hidden_state
        if shift_labels is None:  # as `ForCausalLMLoss` shifts: the last position predicts nothing
            shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        loss = loss_of(
            hidden, self.lm_head.weight, shift_labels, ignore_index=ignore_index, num_items_in_batch=num_items_in_batch
        )
        return CausalLMOutputWithPast(loss=loss)

    model.forward = types.MethodType(forward_with_loss_head, model)
