"""The recipe's `compute:` section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .keys import key

# What each choice of `mixed_precision` is lives in hf_pretrain/machine/precisions.py (a row per precision; `no` is its
# fp32). config/ is a leaf and cannot ask that table, so tests/test_precisions.py holds the Literal below and
# this tuple to its rows: the choices whose decoder linears multiply scaled float8 operands (fp8.py), which
# torch._scaled_mm takes only in widths that are multiples of 16 (Recipe's checks).
SCALED_MATMUL_CHOICES = ("fp8",)
SCALED_MATMUL_MULTIPLE = 16


@dataclass
class ComputeConfig:
    """How a step computes: precision, attention kernel, compilation, recomputed layers, the loss path and
    Liger (`run_profile.Step` reads it; nothing else reads `mixed_precision`).
    """

    mixed_precision: Literal["auto", "no", "bf16", "fp16", "fp8"] = key(
        "auto",
        "`auto` (bf16 on a GPU that supports it, fp32 otherwise), `no`, `bf16`, `fp16` or `fp8` (the decoder's "
        "linear layers; compute capability 8.9+)",
    )
    # fp8: the decoder's linear layers in torchao's float8 (hf_pretrain/model/fp8.py); the rest as bf16 runs it.
    fp8_recipe: Literal["tensorwise", "rowwise"] = key(
        "tensorwise",
        "fp8: torchao's scaling, `tensorwise` (one scale per tensor, the fastest) or `rowwise` (one per row, "
        "finer for outliers, slower)",
    )
    fp8_emulate: bool = key(
        False,
        "fp8: emulate the scaled matmuls in fp32 (the same casts and scales), so the FP8 math runs on a CPU "
        "or a GPU older than compute capability 8.9: for tests and quality proxies, never faster",
        math=False,
    )
    # Which SDPA kernel the attention prefers (hf_pretrain/model/attention.py); the check measures them all.
    attention_backend: Literal["auto", "flash", "efficient", "cudnn", "math"] = key(
        "auto",
        "SDPA's kernel: `auto` (the fastest `hf-pretrain check` measured on this card when it has, else torch's "
        "own choice), `flash`, `efficient`, `cudnn` or `math`; the same function, other speed",
        math=False,
    )
    tf32: bool = key(True, "allow TF32 matmuls on CUDA (free speed on Ampere and later)")
    compile: bool = key(False, "torch.compile the model (inductor; on the CPU too, where it builds C++ kernels)")
    compile_regions: bool = key(
        False,
        "with compile: compile one decoder layer and reuse it for all (Accelerate's "
        "regional compilation): the compile time stops growing with depth, but the "
        "head and loss run uncompiled",
    )
    gradient_checkpointing: bool = key(False, "recompute activations in the backward pass to save memory")
    # Selective checkpointing: a card a few GB short recomputes a few layers, not all of them.
    checkpointed_layers: int = key(
        -1,
        "decoder layers that recompute their activations in the backward pass (0 = none, "
        "num_hidden_layers = all); -1: all when gradient_checkpointing is true, else none",
        math=False,
        ge=-1,
    )
    liger: bool = key(False, "Liger kernels (RMSNorm, SwiGLU, RoPE, fused linear cross entropy); CUDA only")
    chunked_loss: bool = key(
        False,
        "the head's matmul and log-softmax a chunk of tokens at a time (hf_pretrain/model/loss.py): the backward "
        "keeps no [tokens, vocabulary] logits (their gradients are computed chunk by chunk in the forward)",
    )
