"""Data pipeline: corpus sources -> tokenizer -> a datatrove token folder per source -> mixed, packed loaders.

The names below load on first use: the loader imports torch, and `hf-pretrain prepare --help` must not.
"""

from hf_pretrain.lazy_exports import lazy_exports

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
__getattr__ = lazy_exports(
    __name__,
    {
        "PackedDataset": "hf_pretrain.data.loader",
        "build_train_loader": "hf_pretrain.data.loader",
        "build_val_loader": "hf_pretrain.data.loader",
        "prepare": "hf_pretrain.data.prepare_run",
        "DataMismatchError": "hf_pretrain.data.prepared",
        "check_prepared_data": "hf_pretrain.data.prepared",
        "data_identity": "hf_pretrain.data.prepared",
        "read_meta": "hf_pretrain.data.prepared",
        "load_tokenizer": "hf_pretrain.data.tokenizer",
        "tokenizer_hash": "hf_pretrain.data.tokenizer",
    },
)
