"""Every command that reads a run reads a URL: one function gives it a local folder to read.

`readable(location)` is the location's own folder when it is local (nothing imported, nothing copied);
for a URL it is a read-only copy in the user's cache (`<cache>/views/...`, apart from a trainer's
working copy on the same machine), pulled with store/run/pull.py: the run's records, and its
newest complete checkpoint (verified) when the command reads one. A URL naming one checkpoint
(`s3://bucket/run/checkpoints/step_00001000`) pulls that one. A store that cannot be used is
`StoreRefused`: one line, redacted. Each command decides at its door whether what it reads is local
(`store/location.py`) and hands the `Location` down.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hf_pretrain.checkpoints.layout import PREFIX
from hf_pretrain.store.cache import local_copy
from hf_pretrain.store.location import Location
from hf_pretrain.store.urls import StoreURL


def readable(
    location: Location, checkpoint: bool = True, say: Callable[[str], None] = print, cache_dir: str | None = None
) -> Path:
    """A local folder holding what `location` names (see the module's docstring)."""
    if not location.in_store:
        return location.folder
    from hf_pretrain.checkpoints.manifest import CheckpointError
    from hf_pretrain.redaction import redact
    from hf_pretrain.store.reach import StoreRefused, describe_failure, open_checked
    from hf_pretrain.store.run.pull import download_checkpoint, pull_run, pull_small_files

    url, fs = open_checked(str(location), write=False)
    name = url.path.rsplit("/", 1)[-1]
    if name.startswith(PREFIX) and name[len(PREFIX) :].isdigit():  # one checkpoint
        run = StoreURL(url.scheme, url.path.rsplit("/", 2)[0])
        view = local_copy(run, "views", cache_dir)
        try:
            return download_checkpoint(fs, run, int(name[len(PREFIX) :]), view, say)
        except CheckpointError as exc:
            raise StoreRefused(redact(str(exc))) from None
    view = local_copy(url, "views", cache_dir)
    try:
        if checkpoint:
            step = pull_run(fs, url, view, say=lambda line: say(redact(line)))
            prune_view(view, keep=step)
        else:
            view.mkdir(parents=True, exist_ok=True)
            pull_small_files(fs, url, view)
    except StoreRefused:
        raise
    except Exception as exc:
        raise StoreRefused(describe_failure(url, exc, "reading the run")) from None
    return view


def prune_view(view: Path, keep: int | None) -> None:
    """A view holds one checkpoint: the one just read. Every other is an older pull of this cache's own
    (`views/` is written by `readable` alone), removed: a view kept every checkpoint ever pulled, optimizer
    state included, tens of GB each for the `1b`."""
    import shutil

    from hf_pretrain.checkpoints.layout import checkpoint_path, checkpoints_root

    root = checkpoints_root(view)
    if keep is None or not root.is_dir():
        return
    kept = checkpoint_path(view, keep).name
    for folder in root.iterdir():
        if folder.is_dir() and folder.name.startswith(PREFIX) and folder.name != kept:
            shutil.rmtree(folder, ignore_errors=True)


def stop_facts(location: Location, say: Callable[[str], None] = print) -> tuple[Path, dict | None, dict | None]:
    """What `hf-pretrain stop URL` reads: the run's records in a local view, who trains it (the lease's
    holder while its heartbeat is fresh, as `holder_of` names a local one) and the newest complete
    checkpoint's train state, read from the store without its weights."""
    import json

    from hf_pretrain.store.reach import open_checked
    from hf_pretrain.store.run.lease import Lease
    from hf_pretrain.store.run.pull import complete_steps

    view = readable(location, checkpoint=False, say=say)
    url, fs = open_checked(str(location), write=False)
    current, _ = Lease(fs, url, heartbeat_s=1).read()
    holder = None
    if current is not None and not current.is_stale():
        holder = {"host": current.host, "pid": current.pid, "started": current.since}
    saved = None
    for step in complete_steps(fs, url):  # the newest whose train state reads (one without it: the one before)
        state = url.join("checkpoints", f"{PREFIX}{step:08d}", "train_state.json")
        try:
            saved = json.loads(fs.cat_file(state.path))
            break
        except (FileNotFoundError, ValueError):
            say(f"{url}/checkpoints/{PREFIX}{step:08d} has no readable train_state.json; the one before is read")
    return view, holder, saved


def send_back(location: str, view: Path, name: str) -> None:
    """The view's file `name` written into the store (a stop request, which the trainer polls for)."""
    from hf_pretrain.store.reach import open_checked

    url, fs = open_checked(location)
    fs.put_file(str(view / name), url.join(name).path)
