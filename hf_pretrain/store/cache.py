"""Where a URL's local working copy lives: the user's cache, never the working directory.

`$HF_PRETRAIN_HOME`, else `$XDG_CACHE_HOME/hf_pretrain`, else `~/.cache/hf_pretrain` (the measurement
store's home too); a recipe key may move it (`cache_dir`). Each URL gets its own folder named by the URL
itself, so two runs never share a copy and the same URL on the same machine finds its copy again.
"""

from __future__ import annotations

import os
from pathlib import Path

from hf_pretrain.store.urls import StoreUnavailable, StoreURL


def home() -> Path:
    """The user's hf-pretrain cache folder."""
    if explicit := os.environ.get("HF_PRETRAIN_HOME"):
        return Path(explicit).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "hf_pretrain"


def local_copy(url: StoreURL, kind: str, cache_dir: str | Path | None = None) -> Path:
    """The local folder of `url`'s working copy: `<cache>/<kind>/<scheme>/<bucket>/<prefix>`.

    `kind` is "runs" or "data": a run and its data may share a prefix in the store, never a copy.
    """
    root = Path(cache_dir).expanduser() if cache_dir else home()
    return root / kind / url.scheme / url.path


def url_of_copy(path: str | Path, cache_dir: str | Path | None = None) -> str | None:
    """The run URL whose working copy `path` is (`local_copy`'s rule read backwards), else None: a fix
    the product prints names the URL the user gave, not the cache's folder."""
    root = (Path(cache_dir).expanduser() if cache_dir else home()) / "runs"
    try:
        scheme, rest = Path(path).relative_to(root).as_posix().split("/", 1)
    except ValueError:
        return None
    return f"{scheme}://{rest}"


def check_cache_root(cache_dir: str | Path | None = None) -> None:
    """Make the cache folder, or raise `StoreUnavailable` in one line: a `cache_dir` this machine cannot
    write was a FileNotFoundError traceback from deep in the pull or the prepare."""
    root = Path(cache_dir).expanduser() if cache_dir else home()
    flag = "--cache_dir" if cache_dir else "--cache_dir (or HF_PRETRAIN_HOME)"
    try:
        root.mkdir(parents=True, exist_ok=True)
        writable = os.access(root, os.W_OK)
    except OSError as exc:
        writable, why = False, exc.strerror or type(exc).__name__
    else:
        why = "not writable"
    if not writable:
        raise StoreUnavailable(
            f"the cache folder {root} cannot hold the local copies ({why}); set {flag} to a folder this machine can write"
        )
