"""Part (f): an object store's rates, where data_dir or output_dir is a URL (`s3://bucket/prefix`,
`gs://...`): the download rate from data_dir (the first bytes of its first file) and the upload rate
to output_dir (a scratch object of the check's own, read back and removed). Reached through the one
door to stores (hf_pretrain/store/urls.py: fsspec, no listing cache); where this install lacks
the scheme's package, one line says so with the pip line. Local folders have nothing to measure here
(part (e) measures their disk).

A store that fails here is the run's store failing from this machine: the figure says which way
(`detail["store"]`: "unreachable" when it did not answer, "refused" when it answered no: a missing bucket,
a key refused), and the check's last line refuses the machine on it (check/verdict.py: `store_failures`)."""

from __future__ import annotations

import os
import time

from hf_pretrain.check.figures import Report
from hf_pretrain.store.location import Where
from hf_pretrain.store.reach import describe_failure, does_not_answer, quiet_orphaned_requests
from hf_pretrain.store.urls import StoreUnavailable, StoreURL
from hf_pretrain.store.urls import filesystem as store_filesystem

SAMPLE_BYTES = 64 * 2**20


class NothingThere(RuntimeError):
    """data_dir's prefix holds no file yet (not prepared): the store answered, nothing to measure."""


def filesystem(url: str):
    """(the store's fsspec filesystem, None) or (None, the one-line reason this install cannot reach it)."""
    try:
        fs = store_filesystem(StoreURL.parse(url))
    except StoreUnavailable as exc:
        return None, f"skipped: object store support not installed ({exc})"
    quiet_orphaned_requests(fs)
    return fs, None


def upload_and_download(url: str, nbytes: int) -> tuple[float, float]:
    """(upload, download) bytes/s of a scratch object of `nbytes` under `url`, removed after."""
    fs, why = filesystem(url)
    if fs is None:
        raise RuntimeError(why)
    scratch = url.rstrip("/") + f"/.hf_pretrain_check.{os.getpid()}.bin"
    payload = os.urandom(nbytes)
    try:
        started = time.perf_counter()
        fs.pipe_file(scratch, payload)
        up = nbytes / (time.perf_counter() - started)
        started = time.perf_counter()
        back = fs.cat_file(scratch)
        down = len(back) / (time.perf_counter() - started)
    finally:
        try:
            fs.rm_file(scratch)
        except (OSError, FileNotFoundError):
            pass
    return up, down


def download(url: str, nbytes: int) -> tuple[float, int]:
    """(bytes/s, bytes) reading the first `nbytes` of the first file under `url`."""
    fs, why = filesystem(url)
    if fs is None:
        raise RuntimeError(why)
    files = fs.find(url, maxdepth=4)
    if not files:
        raise NothingThere(f"nothing under {url} to download")
    started = time.perf_counter()
    data = fs.cat_file(files[0], start=0, end=nbytes)
    return len(data) / (time.perf_counter() - started), len(data)


def measure(where: Where, report: Report) -> None:
    """The download rate of the data's store and the upload rate of the run's, where they are in one (`where`:
    the door's)."""
    places = (("data_dir", where.data), ("output_dir", where.run))
    urls = {name: location.given for name, location in places if location.in_store}
    if not urls:
        report.skip("object store", "skipped: data_dir and output_dir are local folders (part e measures the disk)")
        return
    for name, url in urls.items():
        fs, why = filesystem(url)
        if fs is None:
            report.skip(name, why)
            continue
        try:
            if name == "data_dir":
                rate, got = download(url, SAMPLE_BYTES)
                report.figure(
                    "download", rate / 1e6, "MB/s", f"download from {url}: {rate / 1e6:,.1f} MB/s ({got / 1e6:.1f} MB)"
                )
            else:
                up, down = upload_and_download(url, SAMPLE_BYTES // 4)
                report.figure(
                    "upload",
                    up / 1e6,
                    "MB/s",
                    f"upload to {url}: {up / 1e6:,.1f} MB/s (read back {down / 1e6:,.1f} MB/s)",
                )
        except NothingThere as exc:
            report.skip(name, f"skipped: {exc}")
        except Exception as exc:  # an unreachable bucket, no credentials: one line, the check goes on
            doing = "reading data_dir" if name == "data_dir" else "writing a scratch object under output_dir"
            report.skip(
                name,
                f"failed: {describe_failure(StoreURL.parse(url), exc, doing)}",
                store="unreachable" if does_not_answer(exc) else "refused",
            )
