"""How to talk to an object store, shared by both halves that use one (`store/data/`, `store/run/`).

`urls.py` says what a location is (a local path, or `s3://`, `gs://`, `hf://` through fsspec) and opens
its file system; `cache.py` is where a URL's local working copy lives; `store_calls.py` retries a request;
`reach.py` says whether a store answers and accepts us; `location.py` is where a run or its data lives,
decided once at a command's door and handed down. This room reads no checkpoint and no data. A user
who never names a URL imports none of its optional packages. What it writes or prints goes through
`hf_pretrain/redaction.py`.
"""
