"""The recipe's `model:` section: the Llama architecture (`hf_pretrain/model/llama.py` builds it)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .keys import key


@dataclass
class ModelConfig:
    """The Llama architecture."""

    # Checked-and-refused rather than ignored: every consumer of these keys (the doctor's memory, plan's
    # FLOPs and cost, the resume shape check) then describes the model that actually trains.
    init_from: str = key(
        "",
        "start from a published model's weights instead of random ones (empty = random init): a Hub id "
        "(through huggingface_hub's cache; HF_HUB_OFFLINE=1 reads only the cache) or a local "
        "LlamaForCausalLM folder (an `hf-pretrain export`). The model is built from its config.json, "
        "which must agree with the model keys below: a difference is refused before any work, naming "
        "each key and its flag. `tokenizer` must be its tokenizer, with vocab_size its size",
    )
    hidden_size: int = key(128, "width of the residual stream", ge=1)
    intermediate_size: int = key(384, "SwiGLU feed-forward width", ge=1)
    num_hidden_layers: int = key(4, "decoder layers", ge=1)
    num_attention_heads: int = key(4, "query heads", ge=1)
    num_key_value_heads: int = key(2, "key/value heads (grouped-query attention when fewer than query heads)", ge=1)
    max_position_embeddings: int = key(2048, "longest context the RoPE tables are built for", ge=1)
    rope_theta: float = key(10000.0, "RoPE base frequency", gt=0)
    rms_norm_eps: float = key(1e-5, "RMSNorm epsilon", gt=0)
    initializer_range: float = key(0.02, "std of the normal weight init", gt=0)
    tie_word_embeddings: bool = key(True, "the output projection shares the input embedding")
    # Tensor cores want matrix dimensions that are multiples of 8/64.
    vocab_multiple: int = key(1, "round the embedding rows up to a multiple of this", ge=1)
    expected_params: int = key(
        0, "parameter count the recipe claims (0 = no claim); tests hold it to within 2%", math=False, ge=0
    )


def padded_vocab_size(tokenizer_size: int, multiple: int) -> int:
    """Embedding rows: the tokenizer's size rounded up to `multiple` for tensor-core friendly matmuls."""
    return multiple * math.ceil(tokenizer_size / multiple)


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
