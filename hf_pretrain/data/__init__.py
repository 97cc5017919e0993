"""Data pipeline: corpus sources -> tokenizer -> a datatrove token folder per source -> mixed, packed loaders.

Each name is imported from the module that defines it (`from hf_pretrain.data.loader import ...`): this file
imports nothing, so `hf-pretrain prepare --help` loads no torch and a reader finds every name where it lives.
"""
