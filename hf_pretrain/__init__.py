"""hf-pretrain: pretrain a ~1B Llama from scratch on the Hugging Face stack."""

import logging

__version__ = "0.1.0"


def _not_torchao_import_noise(record: logging.LogRecord) -> bool:
    """Drop what importing torchao (the [fp8] extra) logs on a machine without its CUDA kernels: a warning
    per kernel library it cannot load, and torch's deprecation note for the Enums it registers. transformers
    imports torchao with every model once it is installed, so without this filter every command that loads
    a model would print them; float8 training needs none of those libraries."""
    message = record.getMessage()
    return not (message.startswith("Failed to load") and ".so" in message) and "register_constant()" not in message


for _name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_name).addFilter(_not_torchao_import_noise)
