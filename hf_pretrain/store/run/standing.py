"""Where a run in the store stands, read from the store alone: what `hf-pretrain status s3://...` says.

Any machine answers in seconds, pulling nothing but small records: status.json (the training
machine's last word, with its `store` section), the lease (who trains it, its last heartbeat), and
for the newest checkpoint whose manifest is in the store, the manifest and train_state.json (step N
of M, tokens) with one listing that checks every object's size against the manifest. No weights move.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hf_pretrain.checkpoints.layout import MANIFEST, PREFIX, TRAIN_STATE
from hf_pretrain.store.run.lease import Holder, Lease
from hf_pretrain.store.run.pull import complete_steps

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from hf_pretrain.store.urls import StoreURL


@dataclass
class StoreStanding:
    """What the store says of one run (`read_store`)."""

    url: str
    status: dict[str, Any]  # the store's status.json ({} when none)
    holder: Holder | None  # the lease's holder, fresh or stale
    checkpoint: str | None  # the newest complete checkpoint's URL
    train_state: dict[str, Any] = field(default_factory=dict)  # its train_state.json
    skipped: list[str] = field(default_factory=list)  # newer ones whose objects do not match their manifest

    @property
    def live(self) -> bool:
        """A machine holds the lease and renews it: the run trains now."""
        return self.holder is not None and not self.holder.is_stale()


def read_store(fs: AbstractFileSystem, url: StoreURL) -> StoreStanding:
    """The standing of the run at `url` from its small records (see the module's docstring)."""
    try:
        status = json.loads(fs.cat_file(url.join("status.json").path))
    except (FileNotFoundError, ValueError):
        status = {}
    holder, _ = Lease(fs, url, heartbeat_s=float(status.get("store", {}).get("heartbeat_s") or 30)).read()
    standing = StoreStanding(str(url), status if isinstance(status, dict) else {}, holder, None)
    for step in complete_steps(fs, url):
        folder = url.join("checkpoints", f"{PREFIX}{step:08d}")
        problem = _objects_match_manifest(fs, folder)
        if problem:
            standing.skipped.append(f"{folder}: {problem}")
            continue
        try:
            standing.train_state = json.loads(fs.cat_file(folder.join(TRAIN_STATE).path))
        except (FileNotFoundError, ValueError):
            standing.skipped.append(f"{folder}: no readable {TRAIN_STATE}")
            continue
        standing.checkpoint = str(folder)
        break
    return standing


def _objects_match_manifest(fs: AbstractFileSystem, folder: StoreURL) -> str | None:
    """None when every file the manifest names is in the store at its size, else what is not."""
    try:
        files = json.loads(fs.cat_file(folder.join(MANIFEST).path))["files"]
        listed = {p.rstrip("/"): i.get("size") for p, i in fs.find(folder.path, detail=True).items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its manifest is unreadable ({exc})"
    for name, entry in files.items():
        size = listed.get(folder.join(name).path)
        if size is None:
            return f"{name} is missing"
        if "bytes" in entry and int(entry["bytes"]) != size:
            return f"{name} is {size} bytes, its manifest says {entry['bytes']}"
    return None


def store_lines(section: dict[str, Any] | None, holder: Holder | None = None, data: str | None = None) -> list[str]:
    """The `store` lines of `status`, the same for a URL and for the local copy of a run that uploads:
    the newest checkpoint in the store, how far the store is behind, the lease, the data's URL."""
    lines = []
    if section:
        last = section.get("last_step")
        where = f"step {last:,} is the newest checkpoint in {section.get('url')}" if last is not None else "none yet"
        lines.append(f"  in the store: {where}")
        missing = section.get("not_in_store") or []
        behind = section.get("steps_behind")
        if missing:
            named = ", ".join(f"step {m}" if isinstance(m, int) else f"{m}/" for m in missing)
            lines.append(f"  not in the store yet: {named} (as of {section.get('updated')})")
        elif behind:
            lines.append(
                f"  the store is {behind:,} steps behind the training machine (as of {section.get('updated')})"
            )
        if section.get("last_error"):
            lines.append(f"  store's last error: {section['last_error']}")
    if holder is not None:
        fresh = "fresh" if not holder.is_stale() else "stale: its holder is gone"
        lines.append(f"  lease: {holder.describe()} ({fresh})")
    if data:
        lines.append(f"  data: {data}")
    return lines
