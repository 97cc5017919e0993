"""What a store's scheme is: one row per scheme a location may name, and everything the package asks of it.

A URL's scheme (`s3://`, `gs://`, `hf://`) decides which package opens it, with which client options, what a
refusal tells the user to check, how the run's lease is written and what the typo check recognises. Those
facts were branches on the scheme's word in urls.py, reach.py and run/lease.py; here each is a field of the
scheme's row, as a precision's are of its row (machine/precisions.py), and the code asks the row
(`scheme_named`). Adding a scheme is a row here: tests/test_architecture.py refuses a comparison of a scheme
with its word anywhere else.

Every field is something the code reads. The credential variables are the one exception, held by a test:
redaction.py masks them and is a leaf that imports nothing of the package, so it keeps its own list
(SECRET_VARIABLES) and tests/test_object_store_base.py holds the two to the same names. Deriving the list here
from redaction.py instead would put the secrets' one home in the store wing, which the Hub's upload and the
config's writer (both outside it) read too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

# The S3 client's bounds, stated rather than inherited. s3fs's defaults (connect 5 s, read 15 s, its own
# 5 tries around botocore's legacy 5 attempts) let one request caught in an outage wait 6 minutes and more
# before the product's own bounds apply. Here one request to a store that accepts connections and then
# says nothing gives up after READ_TIMEOUT_S x BOTOCORE_ATTEMPTS x S3FS_TRIES = 20 x 3 x 2 = 120 s, and
# every caller above bounds its own wait (the uploader's deadline, `store_wait_s` at the end).
CONNECT_TIMEOUT_S = 5.0  # a TCP handshake takes milliseconds; 5 s is a congested link, more is no store
READ_TIMEOUT_S = 20.0  # silence between bytes of an answer: S3 answers even a 50 MiB part within seconds
BOTOCORE_ATTEMPTS = 3  # "standard" retries: throttling (503 SlowDown) and 5xx, with jittered back-off
S3FS_TRIES = 2  # s3fs's own wrapper (timeouts, SlowDown) on top; the product's retry loops sit above both
TIMEOUTS_VARIABLE = "HF_PRETRAIN_STORE_TIMEOUTS"  # "CONNECT,READ" in seconds: the tests' black hole is short


def timeouts() -> tuple[float, float]:
    """The S3 client's (connect, read) timeouts in seconds: the stated ones, or the tests' shorter ones."""
    if text := os.environ.get(TIMEOUTS_VARIABLE):
        connect, read = (float(x) for x in text.split(","))
        return connect, read
    return CONNECT_TIMEOUT_S, READ_TIMEOUT_S


def _botocore_bounds() -> dict[str, Any]:
    """s3fs's keyword arguments that bound each request (read when the file system is opened: the tests set
    `TIMEOUTS_VARIABLE` after import)."""
    connect, read = timeouts()
    return {
        "config_kwargs": {
            "connect_timeout": connect,
            "read_timeout": read,
            # total_max_attempts counts every attempt; botocore's max_attempts counts retries, so 3 was 4
            # attempts and one silent request waited 20 x 4 x 2 s and its back-off (185 s), not the 120 s stated
            "retries": {"mode": "standard", "total_max_attempts": BOTOCORE_ATTEMPTS},
        },
    }


def _client_defaults() -> dict[str, Any]:
    """No options: a scheme whose client keeps its own bounds."""
    return {}


def _s3_put_if(fs: AbstractFileSystem, path: str, body: bytes, if_match: str | None) -> str | None:
    """Put `body` at `path` only where the object's ETag is still `if_match` (S3's If-Match), or with None only
    where there is no object (If-None-Match: *); the new ETag. A condition that fails raises as s3fs turns
    S3's 412 (run/lease.py reads which); a key gone under If-Match is FileNotFoundError."""
    condition = {"IfMatch": if_match} if if_match else {"IfNoneMatch": "*"}
    bucket, _, key = path.partition("/")
    return fs.call_s3("put_object", Bucket=bucket, Key=key, Body=body, **condition).get("ETag")


@dataclass(frozen=True)
class Scheme:
    name: str  # the URL's scheme, and fsspec's protocol that opens it
    module: str  # the module its fsspec implementation needs
    extra: str | None  # the pip extra that installs it (None: a dependency already, `pip install MODULE` else)
    # environment variables holding its credentials: redaction.py's SECRET_VARIABLES masks them (a test holds it)
    credential_variables: tuple[str, ...] = ()
    credentials_fix: str = "set the store's credentials to a key of this store"  # for a refused key
    unreachable_fix: str = "check the network (is the store up?)"  # for a store that does not answer
    endpoint_variables: tuple[str, ...] = ()  # where its client reads the endpoint, first set first: said in lines
    bucket_name: re.Pattern[str] | None = None  # the bucket names its client accepts; None: any
    client_options: Callable[[], dict[str, Any]] = _client_defaults  # keyword arguments of its fsspec file system
    client_tries: int | None = None  # the file system's own `retries` (a class attribute); None: its client's own
    # A write that lands only if the object is as last read (the run's lease): (fs, path, body, etag or None
    # for "no object yet") -> the new etag. None: no conditional write, the lease is written and read back.
    conditional_put: Callable[[AbstractFileSystem, str, bytes, str | None], str | None] | None = None
    typo_spellings: tuple[str, ...] = ()  # other words a user writes for it (`gcs:bkt`), for the typo check

    @property
    def bounds_requests(self) -> bool:
        """Its client runs under the bounds stated above (S3's), so a wait on it can say how long at most."""
        return self.client_tries is not None


SCHEMES = {
    s.name: s
    for s in (
        # AWS and every S3-compatible store (R2, MinIO, B2, a GPU cloud's volume API)
        Scheme(
            "s3",
            module="s3fs",
            extra="s3",
            credential_variables=(
                "AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN",
                "AWS_SECURITY_TOKEN",
                "AWS_ACCESS_KEY_ID",
            ),
            credentials_fix="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) to a key of this store",
            unreachable_fix="check AWS_ENDPOINT_URL and the network (is the store's server up?)",
            endpoint_variables=("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
            # botocore's own rule for a bucket name: one it would refuse is refused here, before any network call
            # (its ParamValidationError was retried three times and came back as a wall of regex)
            bucket_name=re.compile(r"^[A-Za-z0-9._-]{1,255}$"),
            client_options=_botocore_bounds,
            client_tries=S3FS_TRIES,
            conditional_put=_s3_put_if,
        ),
        Scheme(
            "gs",
            module="gcsfs",
            extra="gcs",
            credential_variables=("GOOGLE_APPLICATION_CREDENTIALS",),
            credentials_fix="set GOOGLE_APPLICATION_CREDENTIALS to a service account's key for this bucket",
            typo_spellings=("gcs",),  # gcsfs's other protocol name, and the extra's
        ),
        # HfFileSystem ships with huggingface_hub, a dependency already
        Scheme(
            "hf",
            module="huggingface_hub",
            extra=None,
            credential_variables=("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"),
            credentials_fix="set HF_TOKEN (or run `hf auth login`) to a token that may write to this repository",
            unreachable_fix="check the network, HF_ENDPOINT and HF_HUB_OFFLINE (offline mode never reaches the Hub)",
        ),
    )
}


def scheme_named(name: str) -> Scheme:
    """The row of `name` (`s3`, `gs`, `hf`). Raises KeyError for another word: `StoreURL.parse` refuses an
    unknown scheme in one line before any row is asked for."""
    return SCHEMES[name]
