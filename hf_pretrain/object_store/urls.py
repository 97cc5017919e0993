"""What a location names: a local folder, or a prefix in an object store reached through fsspec.

fsspec is the ecosystem's file-system layer (datasets, datatrove and huggingface_hub speak it), so one
door serves every store: `s3://` for AWS and every S3-compatible store (R2, MinIO, B2, a GPU cloud's
volume API), `gs://` and `hf://`. Endpoint and credentials come from where the store's own client looks
(for S3: `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `~/.aws/config`, ...); this module never reads or
holds a secret itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

# scheme -> (the pip extra that installs its fsspec implementation, the module it needs)
SCHEMES = {
    "s3": ("s3", "s3fs"),
    "gs": ("gcs", "gcsfs"),
    "hf": (None, "huggingface_hub"),  # HfFileSystem ships with huggingface_hub, a dependency already
}
_URL = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<rest>.*)$")
# botocore's own rule for a bucket name: one it would refuse is refused here, before any network call
# (its ParamValidationError was retried three times and came back as a wall of regex)
_S3_BUCKET = re.compile(r"^[A-Za-z0-9._-]{1,255}$")


class StoreUnavailable(RuntimeError):
    """A URL this machine cannot use: unknown scheme, or its package not installed. One line, with the fix."""


def is_url(location: str | Path) -> bool:
    """True for `scheme://...` other than `file://`; a `Path` is always local."""
    if isinstance(location, Path):
        return False
    match = _URL.match(location)
    return bool(match) and match["scheme"] != "file"


@dataclass(frozen=True)
class StoreURL:
    """`s3://bucket/a/b` as scheme `s3` and path `bucket/a/b` (fsspec's path: no scheme, no trailing /)."""

    scheme: str
    path: str

    @classmethod
    def parse(cls, url: str) -> StoreURL:
        match = _URL.match(url)
        if not match or match["scheme"] == "file":
            raise ValueError(f"{url!r} is not an object-store URL")
        scheme, path = match["scheme"], match["rest"].strip("/")
        if scheme not in SCHEMES:
            known = ", ".join(f"{s}://" for s in SCHEMES)
            raise StoreUnavailable(f"{scheme}:// is not a store hf-pretrain knows; use one of {known} or a local path")
        if not path:
            raise StoreUnavailable(f"{url!r} names no bucket; write it as {scheme}://BUCKET/PREFIX")
        bucket = path.split("/", 1)[0]
        if scheme == "s3" and not _S3_BUCKET.match(bucket):
            raise StoreUnavailable(
                f"{url!r}: {bucket!r} is not a bucket name (letters, digits, '.', '-' and '_' only); "
                f"write it as s3://BUCKET/PREFIX"
            )
        return cls(scheme, path)

    @property
    def bucket(self) -> str:
        return self.path.split("/", 1)[0]

    def join(self, *parts: str) -> StoreURL:
        tail = "/".join(p.strip("/") for p in parts if p.strip("/"))
        return StoreURL(self.scheme, f"{self.path}/{tail}" if tail else self.path)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.path}"


def check_locations(*locations: str) -> None:
    """Raise `StoreUnavailable` for the first URL among `locations` that does not parse: a command refuses
    a malformed output_dir or data_dir in one line before it loads torch or reaches the network."""
    for location in locations:
        if is_url(location):
            StoreURL.parse(location)


def filesystem(url: StoreURL) -> AbstractFileSystem:
    """A fresh fsspec file system for the URL's scheme, with no listing cache.

    A run's store is written by another machine (its trainer, a `stop` from a laptop), so a cached
    listing would be a stale answer; and instance caching would share one connection pool between
    threads that upload and the loop. Both are off.
    """
    extra, module = SCHEMES[url.scheme]
    try:
        __import__(module)
        import fsspec
    except ImportError:
        install = f"pip install 'hf-pretrain[{extra}]'" if extra else f"pip install {module}"
        raise StoreUnavailable(f"{url.scheme}:// needs the {module} package: {install}") from None
    return fsspec.filesystem(url.scheme, skip_instance_cache=True, use_listings_cache=False)
