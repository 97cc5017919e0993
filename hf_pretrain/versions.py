"""The installed version of a package: one lookup for the doctor's range checks and the Space's pins.

A module of its own, importing nothing heavy, so that `hf-pretrain space` does not pay for the
doctor's imports (torch, datasets) to read a version number.
"""

from __future__ import annotations

from importlib import metadata

from packaging.version import InvalidVersion, Version


def installed_version(package: str) -> Version | None:
    """`Version("2.13.0+cpu")`, or None when the package is not installed (or has an unreadable version).
    `.public` drops the local tag (`2.13.0`), which PyPI does not know."""
    try:
        return Version(metadata.version(package))
    except (metadata.PackageNotFoundError, InvalidVersion):
        return None
