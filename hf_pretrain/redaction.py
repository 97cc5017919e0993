"""Credentials never leave the process: what the product writes or prints goes through `redact`.

A store's client takes keys from the environment and config files; they reach text only by accident
(an exception that quotes a signed URL, a URL with `user:secret@`, an environment dumped into a log).
`redact` removes every value of the credential variables this process holds, and the shapes of secrets
it does not hold (signed-URL signatures, Hub tokens), so a recognisable fake key in a test never shows.
"""

from __future__ import annotations

import os
import re

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
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"), MASK),  # Hub tokens
)


def redact(text: str) -> str:
    """`text` with every credential this process holds, and every secret-shaped value, masked."""
    for name in SECRET_VARIABLES:
        value = os.environ.get(name)
        if value and len(value) >= 4:  # a one-letter "secret" would mask half the text
            text = text.replace(value, MASK)
    for shape, replacement in _SHAPES:
        text = shape.sub(replacement, text)
    return text
