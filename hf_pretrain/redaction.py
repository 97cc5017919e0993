"""Credentials never leave the process: what the product writes or prints goes through `redact`.

A store's client takes keys from the environment and config files; they reach text only by accident
(an exception that quotes a signed URL, a URL with `user:secret@`, an environment dumped into a log).
`redact` removes every value of the credential variables this process holds, and the shapes of secrets
it does not hold (signed-URL signatures, Hub tokens), so a recognisable fake key in a test never shows.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

# Environment variables whose values are secrets for the stores fsspec reaches.
SECRET_VARIABLES = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ACCESS_KEY_ID",  # not a secret alone, but it names the account: kept out too
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "GOOGLE_APPLICATION_CREDENTIALS",
)
MASK = "***"
# Secrets this process does not hold but may quote: (shape, what replaces it).
_SHAPES = (
    # the query strings of presigned URLs (S3 SigV4 and V2, GCS)
    (
        re.compile(
            r"(?i)((?:X-Amz-(?:Signature|Credential|Security-Token)|Signature|AWSAccessKeyId"
            r"|X-Goog-Signature|X-Goog-Credential)=)[^&\s'\"]+"
        ),
        rf"\g<1>{MASK}",
    ),
    (re.compile(r"(://[^/\s:@]+:)[^@\s/]+@"), rf"\g<1>{MASK}@"),  # scheme://user:secret@host
    # Hub tokens (`hf_` and 34 letters or digits today): at least 20, so `hf_pretrain` or `hf_transfer` stay
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"), MASK),
)


# The shortest held credential masked in a file the product writes and reads back (status.json, the resolved
# recipe): a stand-in key such as localstack's `test` would turn the path `runs/test-1` into `runs/***-1` there.
# Real ones are longer (an AWS key id is 20 characters, its secret 40, a Hub token 37).
SHORTEST_SECRET_IN_FILES = 12


def redact(text: str, shortest: int = 4, held: Iterable[str | None] = ()) -> str:
    """`text` with every credential this process holds (of `shortest` characters or more), and every
    secret-shaped value, masked. `held`: credentials it holds outside the environment, such as the Hub token
    huggingface_hub read from its login file (publish/hub.py, the doctor's Hub row)."""
    for value in (*(os.environ.get(name) for name in SECRET_VARIABLES), *held):
        if value and len(value) >= shortest:  # a one-letter "secret" would mask half the text
            text = text.replace(value, MASK)
    for shape, replacement in _SHAPES:
        text = shape.sub(replacement, text)
    return text


def redact_values(value: Any) -> Any:
    """`value` (a record: dicts, lists, scalars) with every string in it through `redact`, keys too. Each
    string on its own, before it is serialised: a YAML or JSON writer may fold or escape a secret so
    that the text it writes no longer holds it whole."""
    if isinstance(value, str):
        return redact(value, SHORTEST_SECRET_IN_FILES)
    if isinstance(value, dict):
        return {redact_values(k): redact_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_values(v) for v in value]
    return value
