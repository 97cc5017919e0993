"""Data pipeline: corpus sources -> tokenizer -> token shards + meta.json -> packed loaders."""

from hf_pretrain.data.loader import PackedDataset, build_train_loader, build_val_loader
from hf_pretrain.data.shards import DataMismatchError, check_prepared_data, data_identity, prepare, read_meta
from hf_pretrain.data.tokenizer import load_tokenizer, tokenizer_hash

__all__ = [
    "DataMismatchError",
    "data_identity",
    "PackedDataset",
    "build_train_loader",
    "build_val_loader",
    "check_prepared_data",
    "load_tokenizer",
    "prepare",
    "read_meta",
    "tokenizer_hash",
]
