"""A run in the store brought into a local folder: its records and its newest complete checkpoint.

A checkpoint is complete in the store once its manifest is there: the uploader sends the manifest
last. The newest complete one is downloaded beside where it goes (`step_N.download/`), checked
against its manifest's checksums, and only then renamed into place; a file that fails is named and
the previous complete checkpoint is tried. The run's small files (status.json, metrics, samples,
the resolved recipe, a stop request) come with it when the store is at least as far as the local copy;
the compile artifacts (training/compile_cache.py) whenever the local copy lacks them.
A wsd run asked to go further (another max_steps, past the start of its decay) goes on from its last
checkpoint before the decay: that one comes too. Then the local resume logic runs as for any folder.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hf_pretrain.checkpoints.layout import MANIFEST, PREFIX, TRAIN_STATE, checkpoint_path, checkpoints_root
from hf_pretrain.checkpoints.manifest import CheckpointError, verify_showing
from hf_pretrain.checkpoints.progress import ByteCount, LiveLine
from hf_pretrain.checkpoints.resume_rules import branch_step
from hf_pretrain.checkpoints.store import list_checkpoints
from hf_pretrain.redaction import redact
from hf_pretrain.store.run.transfer import get_files
from hf_pretrain.store.urls import StoreURL

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
    "sessions.jsonl",  # the run's ledger of sessions (run_folder/sessions.py); merged, not replaced, at a start
)
# torch's compile artifacts (training/compile_cache.py: FOLDER), one .bin and its .json per key. Megabytes
# each (tens on a GPU), written once per key: each goes up once (uploader.py), not at every heartbeat, and
# comes down whenever this copy lacks it, however far the store is (a key's bytes never change meaning).
COMPILE_CACHE = "compile_cache"
# status.json's words for what the store lacks (run_sync.py writes them, a start reads them back here)
STORE_SECTION = "store"  # status.json's key
NOT_IN_STORE = "not_in_store"  # the section's list of steps (and `final`) a rerun uploads first
FINAL = "final"


def compile_cache_files(local: Path) -> list[Path]:
    """The local copy's compile artifacts, each .bin before its .json."""
    folder = local / COMPILE_CACHE
    try:
        return sorted((p for p in folder.iterdir() if p.suffix in (".bin", ".json")), key=lambda p: (p.stem, p.suffix))
    except OSError:
        return []


def pull_compile_cache(fs: AbstractFileSystem, url: StoreURL, local: Path) -> None:
    """The store's compile artifacts this copy lacks (or holds other bytes of: another size), the .json of
    each key only with its .bin. One try each: the run compiles without them."""
    remote = url.join(COMPILE_CACHE).path
    try:
        listed = {
            p.rstrip("/").rsplit("/", 1)[-1]: info.get("size") for p, info in fs.find(remote, detail=True).items()
        }
    except (FileNotFoundError, OSError):
        return
    pairs = []
    for name in listed:
        if not name.endswith(".json") or name[: -len(".json")] + ".bin" not in listed:
            continue
        for each in (name[: -len(".json")] + ".bin", name):
            here = local / COMPILE_CACHE / each
            if not here.is_file() or here.stat().st_size != listed[each]:
                pairs.append((url.join(COMPILE_CACHE, each).path, here))
    get_files(fs, pairs)


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
    max_steps: int | None = None,
) -> int | None:
    """Bring `url` into `local`: its newest complete checkpoint that verifies (unless the local copy
    has it or a newer one), and its small files when the store is as far. `max_steps`: the recipe's, when
    it resumes `auto`; a run going further under it gets its branch point too (`pull_branch_point`).
    The step pulled or found."""
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
    pull_compile_cache(fs, url, local)
    if found is not None and max_steps is not None:
        pull_branch_point(fs, url, local, found, max_steps, say, activity)
    return found


def pull_branch_point(
    fs: AbstractFileSystem,
    url: StoreURL,
    local: Path,
    newest: int,
    max_steps: int,
    say: Callable[[str], None] = print,
    activity: Callable[[str | None], None] | None = None,
) -> None:
    """The checkpoint a run going further under `max_steps` starts from (checkpoints/resume_rules.py
    `branch_step`), downloaded when this copy lacks it. Only then: a plain resume needs the newest alone
    (a 1b checkpoint is 12.5 GB). One that cannot be pulled is said here; the resume decision refuses
    after it, naming it."""
    try:
        saved = json.loads((checkpoint_path(local, newest) / TRAIN_STATE).read_text())
    except (OSError, ValueError):
        return  # the resume decision says what is wrong with the newest one
    step = branch_step(saved, max_steps)
    if step is None or checkpoint_path(local, step).is_dir() or step not in complete_steps(fs, url):
        return
    try:
        download_checkpoint(fs, url, step, local, say, activity)
    except CheckpointError as exc:
        say(redact(f"store: {exc}"))
        return
    say(f"store: step {step} too: going further to max_steps {max_steps:,} starts from it, the last before the decay")


def final_in_store(fs: AbstractFileSystem, url: StoreURL) -> bool:
    """Whether final/ is whole in the store: there, and the run's status.json there says the run finished
    without naming final/ as missing. A session records `finished` only after final/'s upload ended, and
    names `final` in its store section when that upload failed; a machine killed while final/ went up left
    another state. A start that finds it whole has nothing to write again (a fresh machine has no local
    final/: it rebuilt and re-sent the 1b's 2 GB each time). Unreadable: not whole, final/ is made again."""
    try:
        status = json.loads(fs.cat_file(url.join("status.json").path))
        if not isinstance(status, dict) or status.get("state") != "finished":
            return False
        section = status.get(STORE_SECTION)
        missing = (section.get(NOT_IN_STORE) or []) if isinstance(section, dict) else []
        return FINAL not in missing and fs.exists(url.join(FINAL).path)
    except (OSError, ValueError):
        return False


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
