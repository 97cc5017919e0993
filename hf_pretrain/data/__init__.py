"""Data pipeline: corpus sources -> tokenizer -> a datatrove token folder per source -> mixed, packed loaders."""

from hf_pretrain.data.loader import PackedDataset, build_train_loader, build_val_loader
from hf_pretrain.data.prepare_run import prepare
from hf_pretrain.data.prepared import DataMismatchError, check_prepared_data, data_identity, read_meta
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
