"""The Llama model built from a recipe, optional Liger kernels, and its size and FLOP counts."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hf_pretrain.config import ModelConfig, Recipe

if TYPE_CHECKING:  # imported where a model is built: the counts `plan` and `stop` read need neither
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM


def padded_vocab_size(tokenizer_size: int, multiple: int) -> int:
    """Embedding rows: the tokenizer's size rounded up to `multiple` for tensor-core friendly matmuls."""
    return multiple * math.ceil(tokenizer_size / multiple)


def recipe_tokenizer_size(recipe: Recipe) -> int:
    """Tokens the recipe's tokenizer will have: the BPE vocabulary plus the extra special tokens."""
    return recipe.data.vocab_size + len(recipe.data.special_tokens)


# The config keys that fix the shapes of the weights: a checkpoint saved under other values cannot be
# loaded into the model (the recipe's model section names all but vocab_size and head_dim the same way).
SHAPE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
)


def shape_differences(saved: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (saved value, wanted value)} for each shape key that both name and that differs."""
    return {
        key: (saved[key], wanted[key])
        for key in SHAPE_KEYS
        if key in saved and key in wanted and saved[key] != wanted[key]
    }


def llama_config(
    model: ModelConfig,
    tokenizer_size: int,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> LlamaConfig:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=padded_vocab_size(tokenizer_size, model.vocab_multiple),
        hidden_size=model.hidden_size,
        intermediate_size=model.intermediate_size,
        num_hidden_layers=model.num_hidden_layers,
        num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_key_value_heads,
        max_position_embeddings=model.max_position_embeddings,
        rope_theta=model.rope_theta,
        rms_norm_eps=model.rms_norm_eps,
        initializer_range=model.initializer_range,
        tie_word_embeddings=model.tie_word_embeddings,
        hidden_act="silu",  # SwiGLU feed-forward
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        use_cache=False,  # training never reads the KV cache; generation turns it on per call
    )


def build_model(config: LlamaConfig, device: str | torch.device | None = None) -> LlamaForCausalLM:
    """A freshly initialised Llama with SDPA attention; on `meta` it allocates nothing."""
    import torch
    from transformers import LlamaForCausalLM

    config._attn_implementation = "sdpa"
    if device is None:
        return LlamaForCausalLM(config)
    with torch.device(device):
        return LlamaForCausalLM(config)


def enable_activation_checkpointing(model: LlamaForCausalLM) -> None:
    """Recompute each decoder layer in the backward pass (non-reentrant, which torch.compile and FSDP
    need). transformers 5.23 renamed `gradient_checkpointing_enable` (a deprecated alias until v6);
    earlier 5.x releases, which the pins allow, have only the old name."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters: tied input and output embeddings count once."""
    return sum(p.numel() for p in model.parameters())


def recipe_parameter_count(recipe: Recipe, tokenizer_size: int | None = None) -> int:
    """Parameters of the recipe's model, counted on the meta device (nothing is allocated).

    `tokenizer_size` defaults to what the recipe's tokenizer will have; pass a prepared one's.
    """
    size = recipe_tokenizer_size(recipe) if tokenizer_size is None else tokenizer_size
    return count_parameters(build_model(llama_config(recipe.model, size), device="meta"))


# Training FLOPs of the dense matmuls per parameter and token: 2 in the forward pass (a multiply and
# an add per weight), 4 in the backward (the gradients of the inputs and of the weights). C = 6ND.
TRAINING_FLOPS_PER_PARAMETER = 6.0


def dense_flops_per_token(n_params: float) -> float:
    """Training FLOPs per token of a model known only by its size: 6N, attention left out."""
    return TRAINING_FLOPS_PER_PARAMETER * n_params


def recipe_flops_per_token(recipe: Recipe) -> tuple[int, float]:
    """(parameters, training FLOPs per token) of the recipe's model at its context length."""
    n_params = recipe_parameter_count(recipe)
    config = llama_config(recipe.model, recipe_tokenizer_size(recipe))
    return n_params, flops_per_token(config, n_params, recipe.data.seq_len)


def flops_per_token(config: LlamaConfig, n_params: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N for the matmuls plus the attention scores (PaLM appendix B).

    N counts the tied embedding once: its lookup is free but the same matrix is the output
    projection, whose matmul is real work. Attention adds 12 * layers * hidden * seq_len
    (QK^T and AV, forward and backward), without the causal-mask halving, as PaLM counts it.
    """
    return dense_flops_per_token(n_params) + 12.0 * config.num_hidden_layers * config.hidden_size * seq_len


# What `liger: true` swaps in; tests/test_gpu_paths.py holds the patched model to it.
LIGER_KERNELS = {
    "rope": True,
    "rms_norm": True,
    "swiglu": True,
    "fused_linear_cross_entropy": True,
    "cross_entropy": False,
}


def apply_liger(model: LlamaForCausalLM, log=print) -> bool:
    """Swap in Liger's Triton kernels (RMSNorm, SwiGLU, RoPE, fused linear cross entropy).

    Liger needs CUDA and Triton; anywhere else we say so and train with the stock modules.
    """
    import torch

    if not torch.cuda.is_available():
        log("liger: CUDA is not available, training with the standard kernels")
        return False
    try:
        patch_with_liger(model)
    except ImportError as exc:
        raise RuntimeError("liger=true needs liger-kernel: pip install 'hf-pretrain[liger]'") from exc
    log("liger: RMSNorm, SwiGLU, RoPE and fused linear cross entropy kernels applied")
    return True


def patch_with_liger(model: LlamaForCausalLM) -> None:
    """liger-kernel's public `apply_liger_kernel_to_llama` on this instance. Its fused loss takes the
    loop's call as it is (`labels` + `shift_labels`: already shifted, not shifted again) and never
    materialises the logits. Patching runs no kernel, so it works wherever liger-kernel imports.

    Note that Liger also patches `transformers.models.llama.modeling_llama` itself (RoPE, the
    RMSNorm and MLP classes): every Llama built afterwards in this process uses its kernels too.
    """
    from liger_kernel.transformers import apply_liger_kernel_to_llama

    apply_liger_kernel_to_llama(model=model, **LIGER_KERNELS)
