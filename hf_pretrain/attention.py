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

The name lives only in this process: `config.json` never stores the attention implementation
(transformers drops `_attn_implementation` when it writes the config), so an exported model loads
with the client's default, `sdpa`, which computes the same function.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

# The implementation name the training model runs under (model.py sets it on every model it builds).
CAUSAL_SDPA = "hf_pretrain_causal_sdpa"


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


AttentionInterface.register(CAUSAL_SDPA, causal_sdpa_attention)
