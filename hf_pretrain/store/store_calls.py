"""One call to a store, retried with back-off; what still fails is one line with the fix, redacted.

A store answers over a network: a dropped connection or a throttled request is worth a few more tries
(the store's client retries a little on its own, this adds seconds of patience on top); a missing
bucket or refused credentials is not, and says so at once. Nothing here prints a credential: every
message goes through `redact`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from hf_pretrain.redaction import redact

T = TypeVar("T")
# Seconds between tries; the tests shorten them (an outage they cut for good fails sooner).
RETRY_DELAYS = (1.0, 4.0)
RETRY_DELAYS_VARIABLE = "HF_PRETRAIN_STORE_RETRY_DELAYS"


class StoreError(RuntimeError):
    """A store that cannot be used: unreachable, a missing bucket, refused credentials. One line."""


def retry_delays() -> tuple[float, ...]:
    text = os.environ.get(RETRY_DELAYS_VARIABLE)
    if text is None:
        return RETRY_DELAYS
    return tuple(float(x) for x in text.split(",") if x.strip())


def reason(exc: BaseException) -> str:
    """What went wrong, in one redacted line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return redact(text)


def read_bound_s() -> float:
    """The most one read of a store's data waits in all (`store_call`'s `deadline_s` for the data's reads):
    what the S3 client's own bounds allow one request (store/schemes.py: the read timeout, botocore's
    attempts, s3fs's tries: 20 x 3 x 2 = 120 s), enforced here over every try. s3fs wraps a ranged read in
    its retries twice over, so without it one read of a store gone silent waited 4 x 3 x 20 s and more, and
    three of them outlasted the watchdog (issue 59). `HF_PRETRAIN_STORE_TIMEOUTS` (the tests') shortens it."""
    from hf_pretrain.store import schemes

    _, read = schemes.timeouts()
    return read * schemes.BOTOCORE_ATTEMPTS * schemes.S3FS_TRIES


def within(seconds: float, fn: Callable[[], T]) -> T:
    """`fn()`, or `TimeoutError` once `seconds` passed without its answer: the call goes on in a daemon
    thread that nobody waits for (a request blocked in a silent store never holds the process)."""
    outcome: list = []

    def call() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the caller's thread
            outcome.append((False, exc))

    worker = threading.Thread(target=call, name="hf-pretrain-store-call", daemon=True)
    worker.start()
    worker.join(max(0.0, seconds))
    if not outcome:
        raise TimeoutError(f"no answer in {seconds:.0f} s")
    ok, value = outcome[0]
    if ok:
        return value
    raise value


def store_call(what: str, url: str, fn: Callable[[], T], deadline_s: float | None = None) -> T:
    """`fn()` (a store request about `url`), tried again after each of `retry_delays()` on a network error;
    with `deadline_s`, every try together within that many seconds (then `StoreError`, naming the bound).

    FileNotFoundError passes through untouched (the caller knows what a missing object means), except
    a missing bucket, which is a `StoreError` like refused credentials: retrying cannot help either.
    """
    delays = retry_delays()
    ends = time.monotonic() + deadline_s if deadline_s is not None else None
    for attempt in range(len(delays) + 1):
        try:
            if ends is None:
                return fn()
            left = ends - time.monotonic()
            if left <= 0:
                raise TimeoutError("its deadline passed")
            return within(left, fn)
        except FileNotFoundError as exc:
            if "bucket does not exist" in str(exc).lower():
                bucket = url.split("://", 1)[-1].split("/", 1)[0]
                raise StoreError(
                    f"{what} {url}: the bucket `{bucket}` does not exist at this endpoint; create it, or check "
                    f"the URL and AWS_ENDPOINT_URL"
                ) from None
            raise
        except PermissionError as exc:
            raise StoreError(
                f"{what} {url}: the store refused the credentials ({reason(exc)}); check AWS_ACCESS_KEY_ID / "
                f"AWS_SECRET_ACCESS_KEY (or the profile) and the bucket's permissions"
            ) from None
        except Exception as exc:  # the clients raise many types for one outage (botocore, aiohttp, OSError)
            if ends is not None and time.monotonic() + (delays[attempt] if attempt < len(delays) else 0) >= ends:
                raise StoreError(
                    f"{what} {url}: the store did not answer within {deadline_s:.0f} s ({attempt + 1} tries; "
                    f"{reason(exc)}); check the network and AWS_ENDPOINT_URL, then run the same command again"
                ) from None
            if attempt == len(delays):
                raise StoreError(
                    f"{what} {url}: the store did not answer after {attempt + 1} tries ({reason(exc)}); check the "
                    f"network and AWS_ENDPOINT_URL, then run the same command again"
                ) from None
            time.sleep(delays[attempt])
    raise AssertionError("unreachable")
