"""A run in the store brought into a local folder: its records and its newest complete checkpoint.

A checkpoint is complete in the store once its manifest is there: the uploader sends the manifest
last. The newest complete one is downloaded beside where it goes (`step_N.download/`), checked
against its manifest's checksums, and only then renamed into place; a file that fails is named and
the previous complete checkpoint is tried. The run's small files (status.json, metrics, samples,
the resolved recipe, a stop request) come with it when the store is at least as far as the local copy.
Then the local resume logic runs as for any folder.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hf_pretrain.checkpoints.layout import MANIFEST, PREFIX, checkpoint_path, checkpoints_root
from hf_pretrain.checkpoints.manifest import CheckpointError, verify_showing
from hf_pretrain.checkpoints.progress import ByteCount, LiveLine
from hf_pretrain.checkpoints.store import list_checkpoints
from hf_pretrain.object_store.urls import StoreURL
from hf_pretrain.redaction import redact
from hf_pretrain.run_store.transfer import get_files

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

DOWNLOAD_SUFFIX = ".download"  # a checkpoint being downloaded: never listed, never resumed from
# the run's own records, mirrored both ways beside the checkpoints
SMALL_FILES = (
    "status.json",
    "resolved_recipe.yaml",
    "metrics.jsonl",
    "samples.jsonl",
    "benchmarks.jsonl",
    "phases.json",
    "phases.md",
    "stop_request.json",
)


def complete_steps(fs: AbstractFileSystem, url: StoreURL) -> list[int]:
    """The steps whose checkpoint is complete in the store (its manifest there), newest first."""
    root = url.join("checkpoints").path
    try:
        manifests = fs.glob(f"{root}/{PREFIX}*/{MANIFEST}")
    except FileNotFoundError:
        return []
    steps = []
    for path in manifests:
        name = path.rstrip("/").split("/")[-2][len(PREFIX) :]
        if name.isdigit():
            steps.append(int(name))
    return sorted(steps, reverse=True)


def pull_run(
    fs: AbstractFileSystem,
    url: StoreURL,
    local: Path,
    say: Callable[[str], None] = print,
    activity: Callable[[str | None], None] | None = None,
) -> int | None:
    """Bring `url` into `local`: its newest complete checkpoint that verifies (unless the local copy
    has it or a newer one), and its small files when the store is as far. The step pulled or found."""
    local.mkdir(parents=True, exist_ok=True)
    here = max((c.step for c in list_checkpoints(local)), default=None)
    found = None
    for step in complete_steps(fs, url):
        if here is not None and step <= here:
            found = here  # this machine's copy is as far: nothing to fetch
            break
        try:
            download_checkpoint(fs, url, step, local, say, activity)
        except CheckpointError as exc:
            say(redact(f"store: {exc}; trying the previous complete checkpoint"))
            continue
        found = step
        break
    if found is None and here is not None:
        found = here
    if here is None or found is None or found > here:  # the store is as far as this copy, or further
        pull_small_files(fs, url, local)
    return found


def pull_small_files(fs: AbstractFileSystem, url: StoreURL, local: Path) -> None:
    """The run's records from the store, each replacing the local one (a missing one is left alone)."""
    pairs = [(url.join(name).path, local / name) for name in SMALL_FILES if fs.exists(url.join(name).path)]
    get_files(fs, pairs)


def download_checkpoint(
    fs: AbstractFileSystem,
    url: StoreURL,
    step: int,
    local: Path,
    say: Callable[[str], None] | None = print,
    activity: Callable[[str | None], None] | None = None,
) -> Path:
    """`step`'s checkpoint from the store into `local/checkpoints/`, verified; else `CheckpointError`
    naming the file (the partial download removed)."""
    final = checkpoint_path(local, step)
    folder = checkpoint_path(".", step).name  # step_00000012
    remote = url.join("checkpoints", folder)
    incoming = final.with_name(final.name + DOWNLOAD_SUFFIX)
    shutil.rmtree(incoming, ignore_errors=True)
    try:
        manifest = json.loads(fs.cat_file(remote.join(MANIFEST).path))
        names = list(manifest["files"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{remote}/{MANIFEST} is unreadable: {exc}") from None
    count = ByteCount(sum(int(e.get("bytes", 0)) for e in manifest["files"].values()))
    pairs = [(remote.join(name).path, incoming / name) for name in [*names, MANIFEST]]
    errors: list[BaseException] = []
    with LiveLine(f"downloading {folder} from {url}", count, say, activity):
        ok = get_files(fs, pairs, count, on_error=errors.append)
    if not ok:
        shutil.rmtree(incoming, ignore_errors=True)
        raise CheckpointError(f"{remote} could not be downloaded: {errors[0] if errors else 'unknown error'}")
    try:
        verify_showing(incoming, say=say, activity=activity)
    except CheckpointError as exc:
        shutil.rmtree(incoming, ignore_errors=True)
        raise CheckpointError(str(exc).replace(str(incoming), str(remote))) from None
    checkpoints_root(local).mkdir(parents=True, exist_ok=True)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(incoming, final)
    return final
