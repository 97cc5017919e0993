"""The demo page as a single self-contained file, so a Hugging Face Space can run it without hf-pretrain."""
