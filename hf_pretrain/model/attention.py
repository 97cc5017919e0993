"""The attention the training step runs: causal SDPA with no mask tensor, in eager and compiled runs alike.

transformers' stock `sdpa` builds a boolean `[B, 1, T, T]` mask whenever it cannot prove the mask is
plain causal, and under `torch.compile` it never can: its packed-sequence check is data-dependent,
so dynamo traces the mask in. SDPA then gets `attn_mask` set, `is_causal=False` and K/V repeated to
every query head; no flash kernel takes that call on a GPU, and every score of the T x T square is
computed (tests/test_compiled_step.py reads it off the graph).

Our batches never need a mask: every row is one full packed window, no padding, causal throughout
(document masking is not used: docs/gpu.md). So the model runs `CAUSAL_SDPA`, a function registered
with transformers' public `AttentionInterface` and no mask function in `AttentionMaskInterface`:
for such an implementation transformers builds no mask at all ("custom attention without equivalent
mask creation: we don't need a mask", masking_utils.py), not even the eager path's packed-sequence
check, which reads the device once per forward. The attention is transformers' own SDPA call given
no mask, which then picks `is_causal=True` (any query longer than one token) and `enable_gqa=True`
(K/V not repeated). Decoding with a KV cache works too: the prefill is causal, each decoded token
attends to the whole cache (a batch of one prompt, as generation here runs, has no padding to hide).
An explicit 4D mask a caller passes reaches the function and is honoured.

Which kernel SDPA runs is the recipe's `attention_backend`: `auto` leaves torch its own choice (its
priority order, cuDNN first on Hopper with a recent cuDNN); `flash`, `efficient`, `cudnn` or `math`
registers the same function under its own name (`implementation_name`) whose call is wrapped in
`torch.nn.attention.sdpa_kernel([chosen, math], set_priority=True)`: dynamo traces that context
manager, so the compiled graph calls the chosen kernel (tests/test_compiled_step.py reads it off the
graph). Math stays as the fallback for a call the chosen kernel cannot take (a decoding step's odd
shape), so a choice never fails a run; the doctor refuses a kernel this card lacks before it starts
(preflight/gpu.py). On a CPU torch only looks at whether a kernel is allowed, not at the order: its
flash kernel runs unless `math` is chosen.

The name lives only in this process: `config.json` never stores the attention implementation
(transformers drops `_attn_implementation` when it writes the config), so an exported model loads
with the client's default, `sdpa`, which computes the same function.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

# The implementation name the training model runs under (model.py sets it on every model it builds).
CAUSAL_SDPA = "hf_pretrain_causal_sdpa"
# `attention_backend` -> torch's SDPA backend (`auto`: none named, torch chooses).
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


def implementation_name(backend: str) -> str:
    """The attention implementation a model with this `attention_backend` runs under (transformers takes a
    name containing "flash" for its own flash-attention kernels: the kernel's enum value names it instead)."""
    return CAUSAL_SDPA if backend not in BACKENDS else f"{CAUSAL_SDPA}_backend{BACKENDS[backend].value}"


def backend_priority(backend: str) -> list[SDPBackend]:
    """The chosen kernel first, math behind it (the call no other kernel takes)."""
    return list(dict.fromkeys([BACKENDS[backend], SDPBackend.MATH]))


def chosen_kernel(backend: str):
    """The context in which SDPA prefers `backend` (nothing for `auto`)."""
    if backend not in BACKENDS:
        return contextlib.nullcontext()
    return sdpa_kernel(backend_priority(backend), set_priority=True)


def causal_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention with no mask: `is_causal` and `enable_gqa` follow from that."""
    if attention_mask is not None:  # only a caller's explicit 4D mask gets here: honour it rather than ignore it
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    kwargs.pop("is_causal", None)
    return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)


def _with_backend(backend: str, module, query, key, value, attention_mask, **kwargs):
    with chosen_kernel(backend):
        return causal_sdpa_attention(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(CAUSAL_SDPA, causal_sdpa_attention)
for _name in BACKENDS:
    AttentionInterface.register(implementation_name(_name), functools.partial(_with_backend, _name))
