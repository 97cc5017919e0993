"""Prepared data that no machine owns: `data_dir` as an object-store URL.

`data_upload.py` puts a prepared folder into a store (meta.json last), `data_blocks.py` records each
shard's block checksums at prepare time, `data_cache.py` trains from the URL through a verified block
cache. Read by `data/`; it talks to stores through `store/` and knows nothing of runs or
checkpoints (tested: it never imports `store/run/` or `checkpoints/`).
"""
