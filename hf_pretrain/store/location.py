"""Where a run and its data live, decided once at a command's door (issue 46).

"Is this a URL?" is a question about the string the user typed, and it has one answer. A command asks
it at its door (`Location.of`, `Where.of`) and hands the answer down, as it hands down the run profile:
code below the door reads `in_store` and never looks at the path's spelling again. A URL's local working
copy is derived here too (`Location.local`, by store/cache.py's rule, in the cache folder the door named):
the loop, the preflight and the checkpointer read it, never work it out themselves.
`tests/test_architecture.py` lists the modules allowed to ask.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hf_pretrain.store.cache import local_copy
from hf_pretrain.store.urls import StoreURL, is_url

if TYPE_CHECKING:
    from hf_pretrain.config import Recipe


@dataclass(frozen=True)
class Location:
    """A run or a data folder as the user named it: a local folder, or a prefix in an object store."""

    given: str  # as the user wrote it: what every message quotes
    in_store: bool  # `s3://`, `gs://`, `hf://` ...; else a local folder
    cache: str | None = None  # the cache folder the door was given (`store.cache_dir`; None: the user's cache)
    kind: str = "runs"  # "runs" or "data": a run and its data may share a prefix in the store, never a copy

    @classmethod
    def of(cls, location: str | Path, *, cache: str | None = None, kind: str = "runs") -> Location:
        return cls(str(location), is_url(location), cache, kind)

    @property
    def url(self) -> StoreURL:
        """The store URL (parsed here, so a malformed one is refused where it is first used, as before)."""
        return StoreURL.parse(self.given)

    @property
    def folder(self) -> Path:
        """The local folder; a store URL has none (its working copy is the cache's: store/run/, store/data/)."""
        if self.in_store:
            raise ValueError(f"{self.given} is a store URL, not a local folder")
        return Path(self.given)

    @property
    def local(self) -> Path:
        """Where this location is read and written on this machine: the local folder itself, or a store
        URL's working copy, `<cache>/<kind>/<scheme>/<bucket>/<prefix>` (the same on every process)."""
        return local_copy(self.url, self.kind, self.cache) if self.in_store else Path(self.given)

    def __str__(self) -> str:
        return self.given


@dataclass(frozen=True)
class Where:
    """Where a command's run (`output_dir`) and its data (`data_dir`) live."""

    run: Location
    data: Location

    @classmethod
    def of(cls, recipe: Recipe) -> Where:
        cache = recipe.store.cache_dir  # the one reading of the cache folder: every local copy is derived from it
        return cls(
            Location.of(recipe.train.output_dir, cache=cache, kind="runs"),
            Location.of(recipe.data.data_dir, cache=cache, kind="data"),
        )

    @property
    def any_in_store(self) -> bool:
        return self.run.in_store or self.data.in_store
