"""The training loss: the head's matmul and the cross entropy over the vocabulary, computed one of three ways.

- `stock`: transformers' own `LlamaForCausalLM.forward`: the [tokens, vocabulary] logits, then
  `ForCausalLMLoss`. Its backward keeps the fp32 log-softmax of every token: 4 x vocabulary bytes per
  token (2.1 GB for one 8 x 2048 micro-batch at the 1b's 32,064 rows), and the step materialises the
  bf16 logits and their fp32 copy besides.
- `chunked` (`chunked_loss: true`): the same matmul and log-softmax, a chunk of `LOSS_CHUNK_TOKENS`
  tokens at a time, each chunk under non-reentrant activation checkpointing. The backward keeps the
  hidden states (the stock matmul keeps them too) and one scalar per chunk; each chunk's logits are
  recomputed in the backward, one chunk at a time (one more head matmul: ~2% of the 1b's FLOPs per token).
  Plain torch ops, so it compiles into the step's one graph, and runs the same eagerly.
- `liger` (`liger: true` on CUDA): Liger's fused linear cross entropy, kept out of the compiled graph by
  `torch.compiler.disable` (a deliberate graph break, as torchtitan's Liger integration does: its
  `liger_fused_linear_cross_entropy_loss` is disabled for the compiler). dynamo tracing Liger's
  kernel crashed on an H100 (`addmm(..., out_dtype=torch.float32, out=...)`, ../shared/gpu/README.md),
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

    from hf_pretrain.config import TrainConfig

LossHead = Literal["stock", "chunked", "liger"]

# transformers' and torch's ignored target, which `ForCausalLMLoss` pads its shift with.
IGNORE_INDEX = -100

# Tokens per chunk of the chunked loss: one 2048-token row of the 1b's 8 x 2048 micro-batch, a head matmul
# of 2048 x 2048 x 32,064 (270 GFLOP: big enough for the GEMM's full rate, an estimate) whose logits, their
# fp32 copy and their gradient are 0.66 GB at a time where the whole micro-batch's are 5.3 GB.
LOSS_CHUNK_TOKENS = 2048


def loss_head_for(train: TrainConfig, liger_applied: bool) -> LossHead:
    """Which loss a run's forward computes: Liger's where its kernels were applied (CUDA), the chunked one
    where the recipe asks for it, else transformers' own."""
    if liger_applied:
        return "liger"
    return "chunked" if train.chunked_loss else "stock"


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int):
    # what `ForCausalLMLoss` computes, for a chunk: the head matmul (bf16 under autocast), the
    # log-softmax in fp32, the sum over the targets that count
    logits = F.linear(hidden, weight).float()
    return F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="sum")


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
    from torch.utils.checkpoint import checkpoint

    hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1).to(hidden.device)
    size = chunk_tokens or LOSS_CHUNK_TOKENS
    total = sum(
        checkpoint(_chunk_loss_sum, h, weight, t, ignore_index, use_reentrant=False, preserve_rng_state=False)
        for h, t in zip(hidden.split(size), targets.split(size), strict=True)
    )
    count = (targets != ignore_index).sum() if num_items_in_batch is None else num_items_in_batch
    return total / count


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
