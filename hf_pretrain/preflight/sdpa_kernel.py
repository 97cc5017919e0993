"""The doctor's question about `attention_backend`: does this card's torch have the SDPA kernel the recipe
names, for its attention shape? Asked the way torch answers it: one tiny causal call (the recipe's head
dimension, query and KV heads, the training dtype) allowed that kernel alone; torch refuses a kernel it
lacks with "No available kernel". A refusal is one line with the fix; `auto` is never refused."""

from __future__ import annotations

import torch

from hf_pretrain.config import ModelConfig
from hf_pretrain.machine.run_profile import RunProfile
from hf_pretrain.model.attention import BACKENDS
from hf_pretrain.preflight.result import CheckResult

PROBE_TOKENS = 16  # a causal call of this many tokens: enough for every kernel to be chosen or refused


def kernel_refusal(backend: str, heads: int, kv_heads: int, head_dim: int, device: torch.device, dtype) -> str | None:
    """Why `backend` cannot run this attention on `device` (torch's first line), or None when it can."""
    from torch.nn.attention import sdpa_kernel

    q = torch.zeros(1, heads, PROBE_TOKENS, head_dim, device=device, dtype=dtype, requires_grad=True)
    k = torch.zeros(1, kv_heads, PROBE_TOKENS, head_dim, device=device, dtype=dtype, requires_grad=True)
    v = torch.zeros_like(k, requires_grad=True)
    import warnings

    try:
        with warnings.catch_warnings(), sdpa_kernel([BACKENDS[backend]]):
            warnings.simplefilter("ignore")  # torch warns why each kernel declined; the refusal says it once
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            out.sum().backward()
    except RuntimeError as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def check_attention_backend(model: ModelConfig, profile: RunProfile) -> CheckResult:
    """The kernel the run profile says will run (`auto` resolved at the door), tried once on this device
    for the model section's attention shape (heads, KV heads, head dimension)."""
    backend, why = profile.step.attention_backend, profile.attention_why
    if backend == "auto":
        return CheckResult(
            "attention",
            "skip",
            "attention_backend=auto: torch's own choice (no `hf-pretrain check` of this card timed the kernels)",
        )
    cuda = profile.machine.kind == "cuda"
    device = torch.device("cuda" if cuda else "cpu")
    dtype = getattr(torch, profile.step.precision_facts.autocast or "float32")  # fp8's attention runs in bf16
    m = model
    where = profile.machine.name if cuda else "the CPU"
    refusal = kernel_refusal(
        backend, m.num_attention_heads, m.num_key_value_heads, m.hidden_size // m.num_attention_heads, device, dtype
    )
    if refusal:
        return CheckResult(
            "attention",
            "fail",
            f"attention_backend={backend}: {where}'s torch {torch.__version__} has no {backend} SDPA kernel for "
            f"this attention ({refusal[:90]}...)",
            "--attention_backend auto (torch's choice), or `hf-pretrain check` to see which kernels this card has",
        )
    return CheckResult("attention", "pass", why or f"attention_backend={backend}: {where} runs it")
