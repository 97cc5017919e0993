"""hf-pretrain: pretrain a ~1B Llama from scratch on the Hugging Face stack."""

__version__ = "0.1.0"
