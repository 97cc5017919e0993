"""Corpus sources: one iterator of document texts per `SourceConfig`, and a weighted mixture of them.

Every iterator here is deterministic (sorted file lists, sorted keys, seeded draws): the tokenizer is
fitted on the same sample every time, and datatrove's tasks (pipeline.py) read the same documents.
"""

from __future__ import annotations

import glob
import gzip
import json
import random
import re
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from hf_pretrain.config import SourceConfig
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


# Compressed files are read as what their name says without the suffix: `a.jsonl.gz` is a .jsonl.
COMPRESSED = (".gz", ".zst")
COMPRESSED_MAGIC = {b"\x1f\x8b": ("gzip", ".gz"), b"\x28\xb5\x2f\xfd": ("zstd", ".zst")}


class SourceError(ValueError):
    """A source that cannot be read as described by the recipe."""


reported_undecodable: set[Path] = set()


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
    if where not in reported_undecodable:  # `prepare` reads a file twice (tokenizer, token files): say it once
        reported_undecodable.add(where)
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


def source_tasks(source: SourceConfig) -> int:
    """How many tasks a source's pipeline has: `tasks`, else one per file (a builtin or Hub source: one)."""
    if source.tasks:
        return source.tasks
    if source.kind == "files":
        return len(expand_globs(source.paths))
    return 1


def open_binary(path: Path) -> BinaryIO:
    """`path` for reading, decompressed where its name ends in .gz or .zst."""
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    if path.suffix == ".zst":
        try:
            import zstandard
        except ImportError:
            raise SourceError(
                f"{path} is zstd-compressed: `pip install zstandard` to read it as it is, or decompress it "
                f"(`zstd -d {path}`) and list the result"
            ) from None
        return zstandard.open(path, "rb")
    f = path.open("rb")
    head = f.read(4)
    for magic, (kind, suffix) in COMPRESSED_MAGIC.items():
        if head.startswith(magic):  # a compressed file under another name: not an encoding problem
            f.close()
            raise SourceError(
                f"{path}: the file is {kind}-compressed, but its name does not end in {suffix}; rename it "
                f"(`mv {path} {path}{suffix}`): prepare reads {' and '.join(COMPRESSED)} files as they are"
            )
    f.seek(0)
    return f


def content_suffix(path: Path) -> str:
    """What the file holds: `a.jsonl.gz` -> `.jsonl`."""
    return Path(path.stem).suffix if path.suffix in COMPRESSED else path.suffix


JSON_TYPES = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def json_type(value: Any) -> str:
    return "null" if value is None else JSON_TYPES.get(type(value), type(value).__name__)


def require_text(value: Any, where: str, column: str) -> str:
    """A document's text, or a refusal naming where and what was found instead (a list of strings is
    not glued into one text: where its pieces should meet is the corpus author's decision)."""
    if isinstance(value, str):
        return value
    shown = json.dumps(value, ensure_ascii=False, default=str)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise SourceError(
        f"{where}: `{column}` holds {json_type(value)} ({shown}), not a string: every document must be one text; "
        f"write it as a string (e.g. join a list's pieces with the separator they need), or set `column`"
    )


def _jsonl_documents(path: Path, column: str) -> Iterator[str]:
    with open_binary(path) as raw_lines:
        for number, raw in enumerate(raw_lines, start=1):
            line = decode_utf8(raw, Path(f"{path}:{number}"))
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SourceError(f"{path}:{number} is not a JSON object: {exc}") from exc
            if not isinstance(row, dict):
                raise SourceError(
                    f"{path}:{number} is {json_type(row)}, not a JSON object with a `{column}` key: a .jsonl "
                    f"holds one object per line, e.g. {json.dumps({column: 'the text'})}"
                )
            if column not in row:
                raise SourceError(f"{path}:{number} has no key `{column}`; keys: {', '.join(sorted(row))}")
            yield require_text(row[column], f"{path}:{number}", column)


def _parquet_documents(path: Path, column: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    table = pq.ParquetFile(path)
    if column not in table.schema_arrow.names:
        raise SourceError(f"{path} has no column `{column}`; columns: {', '.join(table.schema_arrow.names)}")
    row = 0
    for batch in table.iter_batches(columns=[column]):
        for value in batch.column(0).to_pylist():
            row += 1
            yield require_text(value, f"{path} row {row}", column)


def _text_documents(path: Path) -> Iterator[str]:
    with open_binary(path) as f:
        text = decode_utf8(f.read(), path).removeprefix("\ufeff")  # a byte-order mark is no text
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as text mode reads
    if content_suffix(path) != ".txt":
        yield text
    elif EOS_TOKEN in text:
        yield from (piece.strip() for piece in text.split(EOS_TOKEN) if piece.strip())
    elif (path.stat().st_size if path.suffix not in COMPRESSED else len(text.encode())) > TXT_SPLIT_BYTES:
        yield from (paragraph for paragraph in _BLANK_LINES.split(text) if paragraph.strip())
    else:
        yield text


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
                yield require_text(row[source.column], f"hub dataset `{source.name}`", source.column), position
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
def file_documents(files: list[Path], column: str) -> Iterator[str]:
    """The documents of local files, in the order given: a .jsonl's or .parquet's `column`, a text file's text."""
    for path in files:
        if content_suffix(path) == ".jsonl":
            yield from _jsonl_documents(path, column)
        elif path.suffix == ".parquet":
            yield from _parquet_documents(path, column)
        else:
            yield from _text_documents(path)


def iter_source(source: SourceConfig) -> Iterator[str]:
    """The non-empty documents of one source, at most `max_documents` of them (0 = all).

    Opened here, not on the first document: an unknown kind or an empty glob fails at once (a Hub
    dataset is reached on its first document)."""
    if source.kind == "hub":
        texts: Iterable[str] = (text for text, _ in _hub_rows(source))
    elif source.kind == "builtin":
        texts = _builtin_documents(source.name)
    elif source.kind == "files":
        texts = file_documents(expand_globs(source.paths), source.column)
    else:
        raise SourceError(f"unknown source kind `{source.kind}`; valid kinds: builtin, files, hub")
    return _non_empty(source, texts)


def _non_empty(source: SourceConfig, texts: Iterable[str]) -> Iterator[str]:
    count = 0
    for text in texts:
        if source.max_documents and count >= source.max_documents:
            return
        # Empty documents (or blank ones) carry nothing to learn and would leave bare end-of-text tokens in the data.
        if text.strip():
            count += 1
            yield text
    if count == 0:
        where = ", ".join(source.paths) if source.kind == "files" else source.name
        raise SourceError(
            f"the {source.kind} source `{where}` holds no text: every document in it is empty; give it files with "
            f"text, or remove it from --sources"
        )


def normalised_weights(sources: list[SourceConfig]) -> list[float]:
    """The tokenizer's sample: each source by its weight (a decay-only source by its decay_weight, so
    that the tokenizer has seen its text too)."""
    weights = [s.weight or (s.decay_weight or 0.0) for s in sources]
    return [w / sum(weights) for w in weights]


class MixedStream:
    """(source index, text) pairs: each next document comes from a source drawn with probability
    proportional to its weight among the sources that still have documents. What the tokenizer is
    fitted on (a sample of every source); the training mixture is drawn by the loader (mixing.py)."""

    def __init__(self, streams: list[Iterable[str]], weights: list[float], seed: int) -> None:
        self.iterators = [iter(s) for s in streams]
        self.weights = weights
        self.rng = random.Random(seed)
        self.live = list(range(len(self.iterators)))

    def __iter__(self) -> MixedStream:
        return self

    def __next__(self) -> tuple[int, str]:
        while self.live:
            chosen = self.rng.choices(self.live, weights=[self.weights[i] for i in self.live])[0]
            text = next(self.iterators[chosen], None)
            if text is None:
                self.live.remove(chosen)
                continue
            return chosen, text
        raise StopIteration


def mixture(sources: list[SourceConfig], seed: int) -> MixedStream:
    """The sources' documents, mixed by weight, the same on every call (for a `seed`): the tokenizer's sample."""
    return MixedStream([iter_source(s) for s in sources], normalised_weights(sources), seed)


def is_validation(document_index: int, val_every: int) -> bool:
    """Every `val_every`-th document of the mixed stream is held out for validation."""
    return document_index % val_every == val_every - 1
