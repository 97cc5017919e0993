"""Can this machine use the store at all: the checks a run makes before any work, one line each.

A run to a URL asks four questions at its start, in the order a user fixes them: does the endpoint
answer, does the bucket exist, are the credentials accepted, may they write here. Each failure is
one line naming the URL and a fix, through `redact` (exit 78, `StoreRefused`); never a traceback.
The write check puts and deletes one small object under the run's prefix (`.hf_pretrain_probe`):
an object the run itself wrote, so removing it removes nothing of anyone else's.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from hf_pretrain.redaction import redact
from hf_pretrain.run_folder.run_lock import RunDirUnusable
from hf_pretrain.store.schemes import scheme_named
from hf_pretrain.store.urls import StoreUnavailable, StoreURL, filesystem, request_bound

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

PROBE = ".hf_pretrain_probe"  # the one object the write check puts and deletes
# the words a store's client uses for each failure (botocore's error codes, as s3fs quotes them)
_CREDENTIALS = (
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "credentials",
    # s3fs raises a refused key as a PermissionError with S3's sentence only (its code is on the cause)
    "Access Key Id you provided does not exist",
    "signature we calculated does not match",
)
_DENIED = ("AccessDenied", "Forbidden", "not authorized")
# botocore's names for a store that does not answer (s3fs raises them as they are)
_UNREACHABLE = ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError")
# A store answers its first request in milliseconds; one silent as long as the client's connect timeout
# (urls.py) is said while it is waited for, since the start into a store that accepts connections and
# answers nothing was silent for minutes before its refusal. Sooner would print it beside a store merely
# slow under load (the test suite's).
SILENT_S = 5.0


class StoreRefused(RunDirUnusable):
    """The store cannot be used as it is set up: one line, redacted, with the fix (exit 78)."""


def where(url: StoreURL) -> str:
    """`s3://bucket/prefix at http://127.0.0.1:9000`: the endpoint is what a user checks first."""
    variables = scheme_named(url.scheme).endpoint_variables  # AWS_ENDPOINT_URL means nothing to an hf:// client
    endpoint = next((os.environ[name] for name in variables if os.environ.get(name)), None)
    return f"{url} at {endpoint}" if endpoint else str(url)


def does_not_answer(exc: BaseException) -> bool:
    """The store did not answer (refused, reset, timed out): a matter of the network between here and it,
    not of the URL or the credentials, which it would have answered about."""
    return type(exc).__name__ in _UNREACHABLE or isinstance(exc, (ConnectionError, TimeoutError))


def quiet_orphaned_requests(fs) -> None:
    """A request cut by a store that resets connections leaves aiohttp a task whose error nobody reads;
    asyncio printed it as "Task exception was never retrieved" with a traceback (a trainer's log, the
    check's part), after the product's own line had said the same. Those are dropped; any other loop error is printed as before."""
    loop = getattr(fs, "loop", None)  # fsspec's async file systems (s3fs, gcsfs) run on one loop per process
    if loop is None or loop.get_exception_handler() is not None:
        return
    try:
        from aiohttp import ClientError
    except ImportError:
        ClientError = OSError  # noqa: N806

    def handler(loop, context) -> None:
        if not isinstance(context.get("exception"), (OSError, ClientError)):
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


def describe_failure(url: StoreURL, exc: BaseException, doing: str) -> str:
    """What went wrong with the store, in one line with the fix (redacted): for the start checks,
    the uploader's `last_error` and the readers alike."""
    said = " ".join(str(exc).split()) or type(exc).__name__
    name = type(exc).__name__
    cause = f"{said} {exc.__cause__ or ''}"  # botocore's error code, where s3fs kept it
    scheme = scheme_named(url.scheme)  # AWS_ENDPOINT_URL means nothing to an hf:// or gs:// client: its row's fix
    if does_not_answer(exc):
        line = f"the store {where(url)} does not answer while {doing}: {said}; {scheme.unreachable_fix}"
    elif isinstance(exc, FileNotFoundError) and "specified bucket" in said.lower():
        line = _no_bucket(url)
    elif any(word.lower() in cause.lower() or word in name for word in _CREDENTIALS):
        line = f"the store {where(url)} refused the credentials while {doing}: {said}; {scheme.credentials_fix}"
    elif isinstance(exc, PermissionError) or any(word.lower() in said.lower() for word in _DENIED):
        line = (
            f"the credentials may not write to {where(url)} ({doing}: {said}); grant them read and write on "
            f"the prefix, or choose another --output_dir"
        )
    else:
        line = f"the store {where(url)} failed while {doing}: {name}: {said}"
    return redact(line)


def _no_bucket(url: StoreURL) -> str:
    return redact(
        f"the bucket {url.bucket!r} does not exist at {where(url)}; create it "
        f"(e.g. `aws s3 mb s3://{url.bucket}`) or name another in the URL"
    )


def _first_process_says(line: str) -> None:
    if os.environ.get("RANK", "0") == "0":  # every process of a launched job opens the store: one says it
        print(line, file=sys.stdout, flush=True)


def waiting_line(url: StoreURL, doing: str) -> str:
    """The line said while a store gives no answer: which URL, doing what, and how long at most."""
    bound = request_bound(url)
    most = f"at most {bound}" if bound else "as long as its client's own timeouts allow"
    return redact(f"store: no answer yet from {where(url)} ({doing}); waiting for it {most}, then a line saying why")


def open_checked(
    location: str, write: bool = True, what: str = "the run", say: Callable[[str], None] = _first_process_says
) -> tuple[StoreURL, AbstractFileSystem]:
    """The URL and its file system, once the store answered, its bucket exists and (with `write`) a
    probe object could be put and deleted; else `StoreRefused`. `what` the location holds, for the line.
    A first answer that takes over `SILENT_S` is said (`say`) while it is waited for: the refusal comes
    only once the client's bounds ran out, minutes for a store that accepts connections and says nothing."""
    try:
        url = StoreURL.parse(location)
        fs = filesystem(url)
    except StoreUnavailable as exc:
        raise StoreRefused(redact(str(exc))) from None
    doing = f"listing {what}"
    silent = threading.Timer(SILENT_S, lambda: say(waiting_line(url, doing)))
    silent.daemon = True  # a process that ends meanwhile does not wait for it
    silent.start()
    try:
        try:
            fs.ls(url.path, detail=False)
        except FileNotFoundError:  # an empty prefix (a run not begun yet), or no bucket: the bucket says
            fs.ls(url.bucket, detail=False)
    except FileNotFoundError:
        raise StoreRefused(_no_bucket(url)) from None
    except Exception as exc:  # the client's errors have no common base: each said in a line
        raise StoreRefused(describe_failure(url, exc, doing)) from None
    finally:
        silent.cancel()
    if write:
        probe = url.join(PROBE).path
        doing = "writing a probe object"
        try:
            fs.pipe_file(probe, f"{socket.gethostname()} {time.time()}\n".encode())
            fs.rm_file(probe)
        except Exception as exc:
            raise StoreRefused(describe_failure(url, exc, doing)) from None
    return url, fs
