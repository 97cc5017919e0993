"""Runs and data that no machine owns: `output_dir` and `data_dir` as object-store URLs.

`urls.py` says what a location is (a local path, or `s3://`, `gs://`, `hf://` through fsspec) and opens
its file system; `cache.py` is where a URL's local working copy lives. A user who never names a URL imports none of
this room's optional packages. What it writes or prints goes through `hf_pretrain/redaction.py`.
"""
