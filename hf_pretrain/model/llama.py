"""The Llama model built from a recipe, optional Liger kernels, and its size and FLOP counts."""

from __future__ import annotations

import types
from typing import TYPE_CHECKING

from hf_pretrain.config import DataConfig, ModelConfig
from hf_pretrain.config.model_section import padded_vocab_size

if TYPE_CHECKING:  # imported where a model is built: the counts `plan` and `stop` read need neither
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM


def tokenizer_size_of(data: DataConfig) -> int:
    """Tokens the data section's tokenizer will have: the BPE vocabulary plus the extra special tokens."""
    return data.vocab_size + len(data.special_tokens)


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


def build_model(
    config: LlamaConfig, device: str | torch.device | None = None, attention_backend: str = "auto"
) -> LlamaForCausalLM:
    """A freshly initialised Llama with causal SDPA attention (attention.py: no mask tensor, flash-eligible
    in compiled runs too; `attention_backend` the SDPA kernel it prefers); on `meta` it allocates nothing."""
    import torch
    from transformers import LlamaForCausalLM

    from hf_pretrain.model.attention import implementation_name

    config._attn_implementation = implementation_name(attention_backend)
    if device is None:
        return LlamaForCausalLM(config)
    with torch.device(device):
        return LlamaForCausalLM(config)


def enable_activation_checkpointing(model: LlamaForCausalLM, layers: int | None = None) -> None:
    """Recompute the first `layers` decoder layers in the backward pass (all of them when None): the
    recipe's `checkpointed_layers`, so a card a few GB short pays for a few layers, not all.

    Non-reentrant, which torch.compile and FSDP need. transformers 5.23 renamed
    `gradient_checkpointing_enable` (a deprecated alias until v6); earlier 5.x releases, which the
    pins allow, have only the old name. Which layers recompute is each decoder layer's public
    `gradient_checkpointing` flag (transformers' GradientCheckpointingLayer): set for all, then cleared
    for the layers after the first `layers`. Every layer holds the same activations, so which ones
    recompute does not change the memory; the first ones are the simplest to name.
    """
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if layers is not None:
        for index, layer in enumerate(model.model.layers):
            layer.gradient_checkpointing = index < layers


def train_in_compute_dtype(model: LlamaForCausalLM) -> None:
    """What a GPU's bf16 step should compute, set up on this instance with public means: a forward hook
    and the instance's `forward` (tests/test_compiled_step.py reads the compiled graph):

    - under autocast the embedding's output is cast to the autocast dtype. An embedding lookup is not
      an autocast op, so it would return fp32, and the residual stream, each RMSNorm's input and the
      RoPE products would all run in fp32 (twice the pointwise traffic and saved activations). The
      RMSNorm still takes its variance in fp32 (transformers' LlamaRMSNorm upcasts inside), and the
      loss's log-softmax runs in fp32 (an autocast fp32 op). Without autocast (fp32 runs) nothing changes.
    - a forward given `labels` returns the loss alone. The logits are never read by the step or the
      evaluation; returned, they would be a graph output kept in memory, and Accelerate's
      `convert_outputs_to_fp32` makes an fp32 copy of them (2.1 GB for one 8 x 2048 micro-batch at a
      32K vocabulary). Dropped here, the compiled graph's dead-code elimination removes both.
    """
    model.get_input_embeddings().register_forward_hook(_embeddings_in_autocast_dtype)
    # An instance `forward`, not a module hook: torch.compile runs a top-level module's hooks outside
    # the graph, while Accelerate wraps (autocast, fp32 outputs) whatever `forward` it finds in `prepare`.
    # It calls the forward there now (Liger's, where Liger patched the class), unbound: a copy of the
    # module (Accelerate's regional compilation makes one) must run its own, compiled, layers.
    forward = model.forward.__func__

    def loss_only_when_labelled(self: LlamaForCausalLM, *args, **kwargs):
        output = forward(self, *args, **kwargs)
        if kwargs.get("labels") is None or getattr(output, "loss", None) is None:
            return output
        return type(output)(loss=output.loss)

    model.forward = types.MethodType(loss_only_when_labelled, model)


def _embeddings_in_autocast_dtype(module: torch.nn.Module, args, output: torch.Tensor) -> torch.Tensor | None:
    import torch

    device_type = output.device.type
    if torch.is_autocast_enabled(device_type):
        return output.to(torch.get_autocast_dtype(device_type))
    return None


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters: tied input and output embeddings count once."""
    return sum(p.numel() for p in model.parameters())


def model_parameter_count(model: ModelConfig, tokenizer_size: int) -> int:
    """Parameters of the model section's Llama, counted on the meta device (nothing is allocated).

    `tokenizer_size`: what the data section's tokenizer will have (`tokenizer_size_of`), or a prepared one's.
    """
    return count_parameters(build_model(llama_config(model, tokenizer_size), device="meta"))


# Training FLOPs of the dense matmuls per parameter and token: 2 in the forward pass (a multiply and
# an add per weight), 4 in the backward (the gradients of the inputs and of the weights). C = 6ND.
TRAINING_FLOPS_PER_PARAMETER = 6.0


def dense_flops_per_token(n_params: float) -> float:
    """Training FLOPs per token of a model known only by its size: 6N, attention left out."""
    return TRAINING_FLOPS_PER_PARAMETER * n_params


def model_flops_per_token(model: ModelConfig, data: DataConfig) -> tuple[int, float]:
    """(parameters, training FLOPs per token) of the model section's Llama with the data section's
    tokenizer, at its context length."""
    config = llama_config(model, tokenizer_size_of(data))
    n_params = count_parameters(build_model(config, device="meta"))
    return n_params, flops_per_token(config, n_params, data.seq_len)


def flops_per_token(config: LlamaConfig, n_params: int, seq_len: int) -> float:
    """Training FLOPs per token of a Llama config (`shape_flops_per_token`)."""
    return shape_flops_per_token(n_params, config.num_hidden_layers, config.hidden_size, seq_len)


def shape_flops_per_token(n_params: float, layers: int, hidden: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N for the matmuls plus the attention scores (PaLM appendix B). The
    project's one count: MFU, `plan` and the performance model's limit read it.

    N counts the tied embedding once: its lookup is free but the same matrix is the output
    projection, whose matmul is real work. Attention adds 12 * layers * hidden * seq_len
    (QK^T and AV, forward and backward), without the causal-mask halving, as PaLM counts it.
    """
    return dense_flops_per_token(n_params) + 12.0 * layers * hidden * seq_len


# What `liger: true` has liger-kernel patch; tests/test_gpu_paths.py holds the patched model to it. Liger's
# fused linear cross entropy is not patched in (its forward would be traced by torch.compile, which crashed
# on an H100): hf_pretrain/model/loss.py calls it, outside the compiled graph, from a forward of ours.
LIGER_KERNELS = {
    "rope": True,
    "rms_norm": True,
    "swiglu": True,
    "fused_linear_cross_entropy": False,
    "cross_entropy": False,
}


def apply_liger(model: LlamaForCausalLM, log=print) -> bool:
    """Swap in Liger's Triton kernels (RMSNorm, SwiGLU, RoPE); True when they were applied, and then the
    loss is Liger's fused linear cross entropy too (hf_pretrain/model/loss.py, `loss_head_for`).

    Liger needs CUDA and Triton: the run profile asks for it on a GPU only (run_profile.Step.liger).
    """
    try:
        patch_with_liger(model)
    except ImportError as exc:
        from hf_pretrain.extras import install_line

        raise RuntimeError(f"liger=true needs liger-kernel: {install_line('liger')}") from exc
    log("liger: RMSNorm, SwiGLU, RoPE and fused linear cross entropy kernels applied")
    return True


def patch_with_liger(model: LlamaForCausalLM) -> None:
    """liger-kernel's public `apply_liger_kernel_to_llama` on this instance: the norms, the MLPs and RoPE.
    The forward stays transformers' own; `use_loss_head(model, "liger")` gives it Liger's fused loss.
    Patching runs no kernel, so it works wherever liger-kernel imports.

    Note that Liger also patches `transformers.models.llama.modeling_llama` itself (RoPE, the
    RMSNorm and MLP classes): every Llama built afterwards in this process uses its kernels too.
    """
    from liger_kernel.transformers import apply_liger_kernel_to_llama

    apply_liger_kernel_to_llama(model=model, **LIGER_KERNELS)
