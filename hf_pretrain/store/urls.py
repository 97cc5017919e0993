"""What a location names: a local folder, or a prefix in an object store reached through fsspec.

fsspec is the ecosystem's file-system layer (datasets, datatrove and huggingface_hub speak it), so one
door serves every store: `s3://` for AWS and every S3-compatible store (R2, MinIO, B2, a GPU cloud's
volume API), `gs://` and `hf://`. Endpoint and credentials come from where the store's own client looks
(for S3: `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `~/.aws/config`, ...); this module never reads or
holds a secret itself. What each scheme is (its package, client options, bucket rule) is its row of
store/schemes.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hf_pretrain.store.schemes import BOTOCORE_ATTEMPTS, S3FS_TRIES, SCHEMES, scheme_named, timeouts

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

_URL = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<rest>.*)$")
# What a mistyped URL looks like: `s3:/bkt/x`, `s3:bkt`, `S3://bkt`, `gs:/x`. Taken as a local path, each
# trained into a folder named `s3:` in the working directory and exited 0 with nothing in the store. A
# scheme of two letters or more (a Windows drive `C:` is one) followed by one slash, or a store's scheme
# not followed by `://`, is a URL the user meant and got wrong.
_ONE_SLASH = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]+):/(?!/)")
_SPELLINGS = (*SCHEMES, *(word for scheme in SCHEMES.values() for word in scheme.typo_spellings))
_STORE_SCHEME_TYPO = re.compile(rf"^(?P<scheme>{'|'.join(_SPELLINGS)}):(?!//)", re.IGNORECASE)
_UPPERCASE_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]+)://")
# `s3//bkt/x`: a legal local path, but a store's scheme with `//` and no colon is a URL missing its `:`
_NO_COLON = re.compile(rf"^(?P<scheme>{'|'.join(SCHEMES)})//", re.IGNORECASE)
# how a store's URL begins, rightly spelled or not (`s3://`, `s3:/`, `s3//`), or a `file:` URL
_STORE_BEGINNING = re.compile(rf"^(?:(?:{'|'.join(SCHEMES)})(?::|//)|file:)", re.IGNORECASE)
# `file:///abs/x`: a local path spelled as a URL; taken as a path it named a folder `file:` here
_FILE_URL = re.compile(r"^file:", re.IGNORECASE)
# schemes a command line may carry that are not a store (an endpoint, a Hub page): never refused here
_NOT_STORES = ("http", "https", "file")


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
        if any(part in (".", "..") for part in path.split("/")):
            # the local copy's folder is named by the path: `..` would put it outside the cache
            raise StoreUnavailable(f"{url!r} holds a `.` or `..` part; write the prefix without them")
        bucket, rule = path.split("/", 1)[0], scheme_named(scheme).bucket_name
        if rule is not None and not rule.match(bucket):
            raise StoreUnavailable(
                f"{url!r}: {bucket!r} is not a bucket name (letters, digits, '.', '-' and '_' only); "
                f"write it as {scheme}://BUCKET/PREFIX"
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


def mistyped(location: str) -> str | None:
    """One line saying how `location` is a URL gone wrong, with the spelling that works (blank space around
    it, a missing colon or slash, an uppercase scheme, a `file:` URL for a local path); None when it is a
    URL hf-pretrain can open or plainly a local path (or not a location at all)."""
    if not isinstance(location, str):
        return None
    stripped = location.strip()
    # `--output_dir " $RUN_URL"` trained into a local folder named ` s3:`
    if stripped != location and _STORE_BEGINNING.match(stripped):
        return mistyped(stripped) or f"{location!r} has blank space around a URL; write it as {stripped}"
    if _FILE_URL.match(location):
        return _file_url(location)
    no_colon = _NO_COLON.match(location)
    if no_colon:
        fixed = f"{no_colon['scheme'].lower()}://{location[len(no_colon[0]) :]}"
        return f"{location!r} is a URL without its colon; write it as {fixed}, or ./{location} for a local folder"
    upper = _UPPERCASE_SCHEME.match(location)
    if upper and upper["scheme"] != upper["scheme"].lower() and upper["scheme"].lower() in SCHEMES:
        fixed = upper["scheme"].lower() + location[len(upper["scheme"]) :]
        return f"{location!r} is not a URL hf-pretrain reads (a scheme is lowercase); write it as {fixed}"
    typo = _ONE_SLASH.match(location) or _STORE_SCHEME_TYPO.match(location)
    if typo:
        rest = location[len(typo["scheme"]) + 1 :].lstrip("/")
        fixed = f"{typo['scheme'].lower()}://{rest}"
        return (
            f"{location!r} looks like a URL but is not one (a URL is SCHEME://BUCKET/PREFIX); write it as "
            f"{fixed}, or ./{location} for a local folder"
        )
    return None


def _file_url(location: str) -> str:
    """The line for a `file:` URL: hf-pretrain reads local folders by their path, which is the fix."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(location)
    if parts.netloc not in ("", "localhost"):
        return f"{location!r} is a file URL naming the host {parts.netloc!r}; write the local folder's path itself"
    return f"{location!r} is a file URL; write the local folder's path itself: {unquote(parts.path) or '.'}"


def check_location(location: str, any_arg: bool = False) -> None:
    """`StoreUnavailable` (one line, with the fix) for a mistyped URL, an unknown scheme or a malformed
    store URL; nothing for a local path or a URL this machine can name. `any_arg`: `location` is any
    argument of a command line, where an http(s):// URL (an endpoint, a page) is not a location."""
    line = mistyped(location)
    if line:
        raise StoreUnavailable(line)
    match = _URL.match(location) if isinstance(location, str) else None
    if match and not (any_arg and match["scheme"] in _NOT_STORES):
        StoreURL.parse(location)


def check_locations(*locations: str | None) -> None:
    """Raise `StoreUnavailable` for the first of `locations` that is a URL gone wrong: a command refuses
    a malformed output_dir or data_dir in one line before it loads torch or reaches the network."""
    for location in locations:
        if location is not None:
            check_location(str(location))


def check_command_line(argv: list[str]) -> None:
    """Every argument of a command line (and each `--key=value`'s value) that is a location checked as
    `check_location` does: `hf-pretrain COMMAND` refuses `s3:/bkt/x` before any work, whichever command
    and flag carries it (a run, a checkpoint, a data folder, a model)."""
    for arg in argv:
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        if not value.startswith("-"):
            check_location(value, any_arg=True)


def filesystem(url: StoreURL) -> AbstractFileSystem:
    """A fresh fsspec file system for the URL's scheme, with no listing cache.

    A run's store is written by another machine (its trainer, a `stop` from a laptop), so a cached
    listing would be a stale answer; and instance caching would share one connection pool between
    threads that upload and the loop. Both are off.
    """
    scheme = scheme_named(url.scheme)
    extra, module = scheme.extra, scheme.module
    try:
        __import__(module)
        import fsspec
    except ImportError:
        from hf_pretrain.extras import install_line, pip_command  # the fix that works where the user stands

        install = install_line(extra) if extra else f"{pip_command()} install {module}"
        raise StoreUnavailable(f"{url.scheme}:// needs the {module} package: {install}") from None
    fs = fsspec.filesystem(url.scheme, skip_instance_cache=True, use_listings_cache=False, **client_options(url))
    if scheme.client_tries is not None:
        fs.retries = scheme.client_tries  # a class attribute of s3fs, not an argument of its constructor
    return fs


# The S3 client's bounds (CONNECT_TIMEOUT_S, READ_TIMEOUT_S, BOTOCORE_ATTEMPTS, S3FS_TRIES and the tests'
# TIMEOUTS_VARIABLE) are its row's facts: store/schemes.py.


def request_bound_s() -> float:
    """The most one S3 request to a store that accepts connections and answers nothing waits before it fails:
    each attempt's read timeout, and the back-off between them (botocore's standard mode waits at most
    2**k s after its attempt k+1, s3fs 0.1 x 1.7**i s after its try i)."""
    _, read = timeouts()
    backoff = sum(min(2**k, 20) for k in range(BOTOCORE_ATTEMPTS - 1))
    return S3FS_TRIES * (BOTOCORE_ATTEMPTS * read + backoff) + sum(0.1 * 1.7**i for i in range(S3FS_TRIES))


def request_bound(url: StoreURL) -> str | None:
    """`request_bound_s` in words, from the client's bounds (S3's; None for a scheme whose client keeps its
    own)."""
    if not scheme_named(url.scheme).bounds_requests:
        return None
    _, read = timeouts()
    return (
        f"{request_bound_s():.0f} s (read timeout {read:g} s x {BOTOCORE_ATTEMPTS} attempts x {S3FS_TRIES} tries, "
        f"and the back-off between them)"
    )


def client_options(url: StoreURL) -> dict:
    """The keyword arguments of `url`'s fsspec file system that bound each request (its row's: S3's bounds,
    nothing for the schemes that keep their client's own)."""
    return scheme_named(url.scheme).client_options()
