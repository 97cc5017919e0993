"""`prepare` into a store: the data is prepared in a local working copy exactly as into a local folder
(lock, resume of a half-done prepare, datatrove), then uploaded.

Order of the upload: the shards (each with its `.ds.index` and block sidecar), each source's
source.json, the tokenizer, blocks.json, and meta.json LAST: as in a local folder, its presence in the
store means "complete", so a reader never takes a half-uploaded dataset for data. An upload cut short is
finished by running the same command again: what the store already holds at its full size is skipped
(a store shows an object only once its upload completed). A store whose meta.json exists is complete
unless an object went missing after (a sync cut short, a deletion): `store_lacks` finds it in one listing,
and the same command sends it again from this machine's copy when that copy is the same preparation.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_pretrain.store.cache import check_cache_root
from hf_pretrain.store.data.data_blocks import BLOCKS_FILE, SIDECAR_SUFFIX, blocks_manifest, shard_files
from hf_pretrain.store.reach import StoreRefused, open_checked
from hf_pretrain.store.store_calls import StoreError, store_call
from hf_pretrain.store.urls import StoreURL, filesystem

if TYPE_CHECKING:
    from hf_pretrain.store.location import Location

META_FILE = "meta.json"  # prepared.py's name; not imported from there, which imports this room lazily
UPLOAD_THREADS = 8


class UploadIncomplete(StoreError):
    """The data is prepared locally, but the store does not hold all of it yet: run the same command again."""


def store_meta(url: StoreURL, fs: Any = None) -> dict[str, Any] | None:
    """meta.json of the data at `url`, None while the store has none (not prepared, or still uploading)."""
    fs = fs or filesystem(url)
    where = url.join(META_FILE)
    try:
        text = store_call("reading", str(where), lambda: fs.cat_file(where.path))
    except FileNotFoundError:
        return None
    return json.loads(text)


def prepare_into_store(
    data: Location,
    fingerprint: str,
    prepare_local: Callable[[Path], Path],
    log: Callable[[str], None],
    elsewhere: str = "prepare the data again under a new prefix",
) -> Path:
    """Prepare the data at `data` (a URL, the door's location) in its local copy with `prepare_local` (handed
    that folder), then upload it; the copy. `fingerprint`: the recipe's data settings' (prepared.data_fingerprint),
    which a prepared store must carry.
    `elsewhere`: the fix when the store lacks objects this machine cannot give back (the exact `prepare`)."""
    url = data.url
    check_cache_root(data.cache)  # before the probe and the hour of tokenizing
    try:  # one probe first: an unreachable endpoint was three retried reads, ~30 s in silence, before its line
        _, fs = open_checked(str(url), write=False, what="the data")
    except StoreRefused as exc:
        raise StoreError(str(exc)) from None
    local = data.local  # in the cache folder the door named
    meta = store_meta(url, fs)  # before any work: an unreachable store or a missing bucket says so now
    if meta is not None:
        if meta.get("data_fingerprint") != fingerprint:
            raise StoreError(
                f"{url.join(META_FILE)}: data_fingerprint expected {fingerprint} (this recipe's data "
                f"settings), found {meta.get('data_fingerprint')}: the store holds data prepared with other settings; "
                f"give --data_dir another prefix"
            )
        _mend_prepared(local, url, fs, meta, log, elsewhere)
        return local
    log(f"preparing {url} in its local copy {local}, then uploading it")
    local.mkdir(parents=True, exist_ok=True)
    prepare_local(local)
    if not (local / META_FILE).is_file():  # a dry run, or a cluster's job still running: nothing to upload yet
        return local
    upload_prepared(local, url, fs, log)
    return local


def upload_prepared(local: Path, url: StoreURL, fs: Any, log: Callable[[str], None]) -> None:
    """Every file a reader needs, meta.json last; what the store holds at its size already is skipped."""
    started = time.perf_counter()
    meta = json.loads((local / META_FILE).read_text())
    manifest, sidecars = blocks_manifest(local, meta)  # one read of each shard, here, not at training time
    for name, digests in sidecars.items():
        (local / f"{name}{SIDECAR_SUFFIX}").write_bytes(digests)
    (local / BLOCKS_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    shards = [n for name in shard_files(meta) for n in (name, f"{name}.index", f"{name}{SIDECAR_SUFFIX}")]
    shards = [n for n in shards if (local / n).is_file()]  # an empty split may have no index
    records = [f"{s['folder']}/source.json" for s in meta["sources"]]
    tokenizer = sorted(str(p.relative_to(local)) for p in (local / "tokenizer").rglob("*") if p.is_file())
    try:
        present = _store_sizes(url, fs)
    except StoreError as exc:
        raise _incomplete(exc, local) from None
    sent = 0
    for group in (shards, records, tokenizer, [BLOCKS_FILE], [META_FILE]):  # in this order: meta.json last
        todo = [n for n in group if present.get(n) != (local / n).stat().st_size or n in (BLOCKS_FILE, META_FILE)]
        with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
            list(pool.map(lambda name: _put(local, url, fs, name), todo))
        sent += sum((local / n).stat().st_size for n in todo)
    log(
        f"uploaded {sent / 1e6:,.1f} MB to {url} in {time.perf_counter() - started:.1f} s "
        f"({len(present)} object(s) were there already); meta.json last: the data is complete in the store"
    )


def _mend_prepared(
    local: Path, url: StoreURL, fs: Any, meta: dict[str, Any], log: Callable[[str], None], elsewhere: str
) -> None:
    """The data at `url` is prepared (its meta.json there): nothing to do, unless an object went missing
    since (`store_lacks`): then what this machine holds goes up again (`upload_lacking`). It used to say
    "already prepared ... nothing was uploaded" and leave the hole, which training then fell into."""
    manifest = _blocks_manifest_of(url, fs, local)
    lacking = store_lacks(url, fs, manifest)
    if lacking:
        upload_lacking(local, url, fs, (meta, manifest or {}), lacking, log, elsewhere)
        return
    log(f"{url} is already prepared (meta.json is in the store); nothing was prepared or uploaded")


def in_words(lacking: list[str]) -> str:
    """`a, b, c and 4 more`: the objects `store_lacks` found, said in a line."""
    return ", ".join(lacking[:3]) + (f" and {len(lacking) - 3} more" if len(lacking) > 3 else "")


def store_lacks(url: StoreURL, fs: Any, manifest: dict[str, Any] | None) -> list[str]:
    """What a reader of the data at `url` needs and the store does not hold whole, in one listing: a shard
    blocks.json lists (`manifest`: the store's, else this machine's), missing or of another size (a sync
    cut short, a deletion), its block sidecar, and blocks.json itself. Names under the prefix."""
    present = _store_sizes(url, fs)
    lacking = [] if BLOCKS_FILE in present else [BLOCKS_FILE]
    for shard, entry in (manifest or {}).get("files", {}).items():
        if present.get(shard) != entry["bytes"]:
            lacking.append(shard)
        if f"{shard}{SIDECAR_SUFFIX}" not in present:
            lacking.append(f"{shard}{SIDECAR_SUFFIX}")
    return lacking


def _blocks_manifest_of(url: StoreURL, fs: Any, local: Path) -> dict[str, Any] | None:
    """blocks.json of the data at `url`: the store's, else this machine's copy's (None: neither has one)."""
    where = url.join(BLOCKS_FILE)
    try:
        return json.loads(store_call("reading", str(where), lambda: fs.cat_file(where.path)))
    except FileNotFoundError:
        mine = local / BLOCKS_FILE
        return json.loads(mine.read_text()) if mine.is_file() else None


def upload_lacking(
    local: Path,
    url: StoreURL,
    fs: Any,
    records: tuple[dict[str, Any], dict[str, Any]],
    lacking: list[str],
    log: Callable[[str], None],
    elsewhere: str,
) -> None:
    """Send `lacking` (`store_lacks`) again from this machine's copy, when that copy is the preparation the
    store holds (`records`: the store's meta.json and blocks.json; the copy's meta.json the same) and
    holds each object as it was prepared; else `StoreError` naming what is missing and where it can come
    from. A shard of another preparation beside the store's others would be wrong data no size could tell."""
    meta, manifest = records
    names = in_words(lacking)
    recorded = _recorded_digests(meta, manifest)
    usable = _same_preparation(local, meta) and all(_as_prepared(local / name, recorded.get(name)) for name in lacking)
    if not usable:
        raise StoreError(
            f"{url} lacks {names} (a sync cut short, or deleted there), and this machine holds no copy of "
            f"them as prepared; run this same command on the machine that prepared the data (its copy holds "
            f"them), or {elsewhere}"
        )
    log(f"{url} is prepared but lacks {names} (a sync cut short, or deleted there): uploading them again")
    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        list(pool.map(lambda name: _put(local, url, fs, name), lacking))
    sent = sum((local / name).stat().st_size for name in lacking)
    log(f"uploaded {sent / 1e6:,.1f} MB to {url}: the data is complete in the store again")


def _recorded_digests(meta: dict[str, Any], manifest: dict[str, Any]) -> dict[str, str]:
    """{name: SHA-256} of what the preparation wrote: each shard's (meta.json), each sidecar's (blocks.json)."""
    shards = {e["file"]: e["sha256"] for s in meta["sources"] for split in s["splits"].values() for e in split["files"]}
    sidecars = {f"{k}{SIDECAR_SUFFIX}": v["sidecar_sha256"] for k, v in manifest.get("files", {}).items()}
    return {**shards, **sidecars}


def _same_preparation(local: Path, meta: dict[str, Any]) -> bool:
    try:
        return json.loads((local / META_FILE).read_text()) == meta
    except (OSError, ValueError):
        return False


def _as_prepared(path: Path, sha256: str | None) -> bool:
    """Whether this copy's file is what was prepared: its SHA-256 the recorded one (only the missing files
    are read), or present where none is recorded (blocks.json)."""
    if not path.is_file():
        return False
    if sha256 is None:
        return True
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest() == sha256


def _store_sizes(url: StoreURL, fs: Any) -> dict[str, int]:
    """{path under the prefix: size} of what the store holds (an earlier upload cut short)."""
    try:
        found = store_call("listing", str(url), lambda: fs.find(url.path, detail=True))
    except FileNotFoundError:
        return {}
    prefix = url.path + "/"
    return {k.removeprefix(prefix): v["size"] for k, v in found.items() if k.startswith(prefix)}


def _put(local: Path, url: StoreURL, fs: Any, name: str) -> None:
    target = url.join(name)
    try:
        store_call("uploading to", str(target), lambda: fs.put_file(str(local / name), target.path))
    except StoreError as exc:
        raise _incomplete(exc, local) from None


def _incomplete(exc: StoreError, local: Path) -> UploadIncomplete:
    return UploadIncomplete(f"{exc} (the data is prepared in {local}: the same command uploads what the store lacks)")
