"""Corpus sources: one iterator of document texts per `SourceConfig`, and their weighted mixture.

Every iterator here is deterministic (sorted file lists, sorted keys, seeded draws), because a
resumed `prepare` must see the same stream again: from a saved `MixturePosition` (the draws' random
state, each source's count and a streamed Hub source's own position), or from the start.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import random
import re
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from hf_pretrain.config import Recipe, SourceConfig
from hf_pretrain.data.tokenizer import EOS_TOKEN

# How a plain-text file becomes documents:
# - a .txt file that contains the end-of-text marker (the GPT-2 / TinyStories convention) is split
#   on it, since its author already marked where documents end;
# - otherwise a .txt file above TXT_SPLIT_BYTES is a book or a dump rather than one document, so it
#   is split into documents on blank lines;
# - any other text file (.md, .py, small .txt ...) is one document.
TXT_SPLIT_BYTES = 1_000_000
# (Text is read with universal newlines, so CRLF files arrive with plain \n.)
_BLANK_LINES = re.compile(r"\n(?:[ \t\f\v]*\n)+")


# A file with more undecodable bytes than this share is not UTF-8 text (another encoding, a binary):
# refused. Below it, each bad byte becomes U+FFFD and the file is named once on stderr.
MAX_UNDECODABLE_SHARE = 0.001


class SourceError(ValueError):
    """A source that cannot be read as described by the recipe."""


_reported_undecodable: set[Path] = set()


def decode_utf8(data: bytes, where: Path) -> str:
    """`data` as text; undecodable bytes become U+FFFD, are counted, and refused above the threshold."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    bad = len(data) - len(data.decode("utf-8", errors="ignore").encode("utf-8"))
    if bad > MAX_UNDECODABLE_SHARE * len(data):
        raise SourceError(
            f"{where}: {bad:,} of {len(data):,} bytes are not valid UTF-8 ({bad / len(data):.1%}); it is "
            f"not UTF-8 text: convert it (e.g. `iconv -f latin1 -t utf-8`) or leave it out of `paths`"
        )
    if where not in _reported_undecodable:  # `prepare` reads the mixture twice (tokenizer, shards): say it once
        _reported_undecodable.add(where)
        print(f"warning: {where}: {bad:,} undecodable bytes replaced by U+FFFD", file=sys.stderr)
    return data.decode("utf-8", errors="replace")


# ---------------------------------------------------------------------- builtin corpora
def _python_docs() -> Iterator[str]:
    from pydoc_data.topics import topics

    for key in sorted(topics):
        yield topics[key]


def _python_stdlib() -> Iterator[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py")):
        yield path.read_text(encoding="utf-8", errors="replace")


BUILTIN_CORPORA: dict[str, Callable[[], Iterator[str]]] = {
    "python-docs": _python_docs,
    "python-stdlib": _python_stdlib,
}


def _builtin_documents(name: str) -> Iterator[str]:
    if name not in BUILTIN_CORPORA:
        raise SourceError(f"unknown builtin corpus `{name}`; valid names: {', '.join(sorted(BUILTIN_CORPORA))}")
    return BUILTIN_CORPORA[name]()


# ---------------------------------------------------------------------- local files
def expand_globs(patterns: list[str]) -> list[Path]:
    """Every file matched by `patterns`, sorted per pattern, each once even where patterns overlap;
    a pattern matching nothing is an error."""
    files: dict[Path, None] = {}
    for pattern in patterns:
        matches = sorted(p for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
        if not matches:
            raise SourceError(f"files source: the glob `{pattern}` matches no file")
        files.update((Path(p), None) for p in matches)
    return list(files)


def _jsonl_documents(path: Path, column: str) -> Iterator[str]:
    with path.open("rb") as raw_lines:
        for number, raw in enumerate(raw_lines, start=1):
            line = decode_utf8(raw, Path(f"{path}:{number}"))
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SourceError(f"{path}:{number} is not a JSON object: {exc}") from exc
            if column not in row:
                raise SourceError(f"{path}:{number} has no key `{column}`; keys: {', '.join(sorted(row))}")
            yield row[column]


def _parquet_documents(path: Path, column: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    table = pq.ParquetFile(path)
    if column not in table.schema_arrow.names:
        raise SourceError(f"{path} has no column `{column}`; columns: {', '.join(table.schema_arrow.names)}")
    for batch in table.iter_batches(columns=[column]):
        yield from batch.column(0).to_pylist()


def _text_documents(path: Path) -> Iterator[str]:
    text = decode_utf8(path.read_bytes(), path).removeprefix("\ufeff")  # a byte-order mark is no text
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as text mode reads
    if path.suffix != ".txt":
        yield text
    elif EOS_TOKEN in text:
        yield from (piece.strip() for piece in text.split(EOS_TOKEN) if piece.strip())
    elif path.stat().st_size > TXT_SPLIT_BYTES:
        yield from (paragraph for paragraph in _BLANK_LINES.split(text) if paragraph.strip())
    else:
        yield text


def _file_documents(files: list[Path], column: str) -> Iterator[str]:
    for path in files:
        if path.suffix == ".jsonl":
            yield from _jsonl_documents(path, column)
        elif path.suffix == ".parquet":
            yield from _parquet_documents(path, column)
        else:
            yield from _text_documents(path)


# ---------------------------------------------------------------------- Hugging Face Hub
# A streamed Hub source survives this many network failures in a row, waiting 2, 4, 8 ... seconds.
HUB_RETRIES = 5
HUB_BACKOFF_SECONDS = 2.0


def _is_transient(exc: BaseException) -> bool:
    """A network failure worth retrying (a dropped connection, a timeout, a 5xx), not a bad request."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    name = type(exc).__name__
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return name in ("ConnectError", "ReadTimeout", "RemoteProtocolError", "ChunkedEncodingError", "ReadError") or (
        isinstance(status, int) and status >= 500
    )


def _hub_rows(source: SourceConfig, start: dict[str, Any] | None = None) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """(text, position) per row; the position (`IterableDataset.state_dict()` after the row) is kept
    for a streamed source only, and `start` is one such position to begin after. A streamed source
    that loses its connection resumes from the last position, after a growing wait, instead of
    failing the whole prepare."""
    import datasets

    def load():
        return datasets.load_dataset(source.name, source.config, split=source.split, streaming=source.streaming)

    rows, position, failures = load(), start, 0
    if position is not None:
        rows.load_state_dict(position)
    while True:
        try:
            for row in rows:
                if source.column not in row:
                    raise SourceError(
                        f"hub dataset `{source.name}` has no column `{source.column}`; available columns: "
                        f"{', '.join(sorted(row))}. Some code corpora carry only blob ids that point to files "
                        f"stored elsewhere, not the text itself: choose a dataset (or set `column`) that holds the text"
                    )
                failures = 0
                if source.streaming and hasattr(rows, "state_dict"):  # datasets' IterableDataset
                    position = rows.state_dict()
                yield row[source.column], position
            return
        except Exception as exc:
            if not (source.streaming and _is_transient(exc)) or failures >= HUB_RETRIES:
                if _is_transient(exc):
                    raise SourceError(
                        f"hub dataset `{source.name}`: the network failed {failures + 1} times in a "
                        f"row ({type(exc).__name__}: {exc}); rerun `prepare` later: it resumes"
                    ) from exc
                raise
            wait = HUB_BACKOFF_SECONDS * 2**failures
            failures += 1
            print(
                f"warning: hub dataset `{source.name}`: {type(exc).__name__}: {exc}; retrying in {wait:.0f}s "
                f"({failures}/{HUB_RETRIES})",
                file=sys.stderr,
            )
            time.sleep(wait)
            rows = load()
            if position is not None:
                rows.load_state_dict(position)


# ---------------------------------------------------------------------- one source, the mixture
class SourceReader:
    """The non-empty documents of one source, at most `max_documents` of them (0 = all), and where
    it is: how many it has yielded and, for a streamed Hub source, the stream's own position after
    the last one. `start` (a `position()`) goes on from there: a streamed source from its position,
    any other by skipping the documents it had yielded (local, cheap; a Hub source without a
    position downloads them again).

    Opened here, not on the first draw: an unknown kind or an empty glob fails when the mixture is
    built (a Hub dataset is reached on its first draw).
    `live=False` is a source the mixture had already drained: it is not opened again.
    """

    def __init__(self, source: SourceConfig, start: dict[str, Any] | None = None, live: bool = True) -> None:
        self.source = source
        self.documents: int = start["documents"] if start else 0
        self.stream_position: dict[str, Any] | None = start["stream"] if start else None
        self._rows: Iterator[tuple[str, dict[str, Any] | None]] = iter(()) if not live else self._open()
        if live and self.documents and self.stream_position is None:
            skipped = 0
            while skipped < self.documents and self._next_text() is not None:
                skipped += 1

    def _open(self) -> Iterator[tuple[str, dict[str, Any] | None]]:
        source = self.source
        if source.kind == "hub":
            return _hub_rows(source, self.stream_position)
        if source.kind == "builtin":
            texts = _builtin_documents(source.name)
        elif source.kind == "files":
            texts = _file_documents(expand_globs(source.paths), source.column)
        else:
            raise SourceError(f"unknown source kind `{source.kind}`; valid kinds: builtin, files, hub")
        return ((text, None) for text in texts)

    def _next_text(self) -> str | None:
        for text, stream_position in self._rows:
            # Empty documents carry nothing to learn and would leave bare end-of-text tokens in the data.
            if text:
                self.stream_position = stream_position
                return text
        return None

    def __iter__(self) -> SourceReader:
        return self

    def __next__(self) -> str:
        if self.source.max_documents and self.documents >= self.source.max_documents:
            raise StopIteration
        text = self._next_text()
        if text is None:
            if self.documents == 0:
                where = ", ".join(self.source.paths) if self.source.kind == "files" else self.source.name
                raise SourceError(
                    f"the {self.source.kind} source `{where}` holds no text: every document in it is empty"
                )
            raise StopIteration
        self.documents += 1
        return text

    def position(self) -> dict[str, Any]:
        return {"documents": self.documents, "stream": self.stream_position}


def iter_source(source: SourceConfig) -> SourceReader:
    """The non-empty documents of one source, at most `max_documents` of them (0 = all)."""
    return SourceReader(source)


def normalised_weights(sources: list[SourceConfig]) -> list[float]:
    total = sum(s.weight for s in sources)
    return [s.weight / total for s in sources]


@dataclasses.dataclass(frozen=True)
class MixturePosition:
    """Where a mixed stream is between two documents, enough to go on from there exactly."""

    next_document: int  # index in the mixed stream of the next document
    rng_state: tuple[Any, ...]  # random.Random.getstate() of the draws
    live: tuple[int, ...]  # sources not yet drained
    sources: tuple[dict[str, Any], ...]  # per source: SourceReader.position()

    def to_json(self) -> dict[str, Any]:
        """As plain JSON. A stream position that JSON cannot carry unchanged is left out: that
        source is then resumed by reading its documents again."""
        version, internal, gauss = self.rng_state
        return {
            "next_document": self.next_document,
            "rng_state": [version, list(internal), gauss],
            "live": list(self.live),
            "sources": [
                {"documents": s["documents"], "stream": _plain_json_or_none(s["stream"])} for s in self.sources
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MixturePosition:
        version, internal, gauss = data["rng_state"]
        return cls(
            data["next_document"], (version, tuple(internal), gauss), tuple(data["live"]), tuple(data["sources"])
        )


def _plain_json_or_none(value: Any) -> Any:
    try:
        return value if json.loads(json.dumps(value)) == value else None
    except (TypeError, ValueError):
        return None


class MixedStream:
    """(source index, text) pairs: each next document comes from a source drawn with probability
    proportional to its weight among the sources that still have documents. Over `SourceReader`s,
    `position()` says where it is; built with `start=` that position, it goes on from there."""

    def __init__(
        self, streams: list[Iterable[str]], weights: list[float], seed: int, start: MixturePosition | None = None
    ) -> None:
        self.iterators = [iter(s) for s in streams]
        self.weights = weights
        self.rng = random.Random(seed)
        self.live = list(range(len(self.iterators)))
        self.next_document = 0
        if start is not None:
            self.rng.setstate(start.rng_state)
            self.live = list(start.live)
            self.next_document = start.next_document

    def __iter__(self) -> MixedStream:
        return self

    def __next__(self) -> tuple[int, str]:
        while self.live:
            chosen = self.rng.choices(self.live, weights=[self.weights[i] for i in self.live])[0]
            text = next(self.iterators[chosen], None)
            if text is None:
                self.live.remove(chosen)
                continue
            self.next_document += 1
            return chosen, text
        raise StopIteration

    def position(self) -> MixturePosition:
        """Where it is now; only for a stream over `SourceReader`s, as `mixture` builds it."""
        return MixturePosition(
            self.next_document,
            self.rng.getstate(),
            tuple(self.live),
            tuple(reader.position() for reader in self.iterators),
        )


def mixture(recipe: Recipe, start: MixturePosition | None = None) -> MixedStream:
    """The recipe's document stream, the same on every call; from `start` on when given. The token
    budget is applied by the shard writer, which is the one that counts tokens."""
    sources = recipe.data.sources
    if start is None:
        readers = [SourceReader(s) for s in sources]
    else:
        readers = [SourceReader(s, start.sources[i], live=i in start.live) for i, s in enumerate(sources)]
    return MixedStream(readers, normalised_weights(sources), recipe.train.seed, start)


def is_validation(document_index: int, val_every: int) -> bool:
    """Every `val_every`-th document of the mixed stream is held out for validation."""
    return document_index % val_every == val_every - 1
