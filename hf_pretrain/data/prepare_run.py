"""`prepare`: fit (or load) the tokenizer, run each source's datatrove pipeline, then record the
folder in meta.json once every task of every source is done.

A rerun of the same command skips what is done: the tokenizer (its hash is recorded before any
source starts), every finished task (datatrove's `logs/<source>/completions`), a finished folder.
A Slurm or Ray job that is still running when `prepare` returns is finished by running `prepare`
again once it is done: that run finds every task complete and writes meta.json.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np
from transformers import PreTrainedTokenizerFast

from hf_pretrain.config import DataConfig, Recipe, SourceConfig
from hf_pretrain.data.prepare_folder import (
    CREATED_NAMES,
    PROGRESS_FILE,
    PrepareLock,
    check_inputs_outside_outputs,
    check_no_duplicate_sources,
    discard_or_refuse,
    read_progress,
    record_jobs,
    refuse_foreign,
    refuse_while_jobs_run,
    write_progress,
)
from hf_pretrain.data.prepared import (
    EOS_POLICY,
    FORMAT_VERSION,
    LOGS_DIR,
    META_FILE,
    SOURCE_FILE,
    SOURCES_DIR,
    SPLITS,
    DataMismatchError,
    check_index,
    check_prepared_data,
    data_fingerprint,
    data_settings,
    read_meta,
    reprepare_hint,
    source_folder_name,
    token_dtype,
)
from hf_pretrain.data.sources import TXT_SPLIT_BYTES, SourceError, expand_globs, mixture, source_tasks
from hf_pretrain.data.task_progress import CountsReader, SourceProgress
from hf_pretrain.data.tokenizer import (
    EOS_TOKEN,
    PIECE_CHARS,
    TOKENIZER_DIR,
    TokenizerError,
    load_pretrained_tokenizer,
    load_tokenizer,
    save_tokenizer,
    split_long_text,
    tokenizer_hash,
    train_tokenizer,
)
from hf_pretrain.run_folder.json_files import write_json_atomically
from hf_pretrain.store.location import Location

if TYPE_CHECKING:  # pipeline.py imports datatrove: only a prepare that runs pays for it (`_prepare_locked`)
    from hf_pretrain.data.pipeline import ExecutorOptions

HASH_CHUNK_BYTES = 16 * 2**20


@dataclass
class SourceResult:
    name: str
    documents: int
    tokens: int
    seconds: float  # this invocation's time on its tasks
    tasks_run: int  # tasks this invocation ran (the others were done already)

    def line(self) -> str:
        rate = f"{self.tokens / self.seconds:,.0f} tokens/s" if self.tasks_run and self.seconds > 0 else "already done"
        return f"{self.name}: {self.documents:,} documents, {self.tokens:,} tokens, {rate}"


def _package_version() -> str:
    try:
        return metadata.version("hf-pretrain")
    except metadata.PackageNotFoundError:
        return "0.1.0"


def prepare(
    recipe: Recipe,
    log: Callable[[str], None] = print,
    dry_run: bool = False,
    verbose: bool = False,
    *,
    data: Location | None = None,
) -> Path:
    """Tokenizer, one token folder per source and meta.json in `recipe.data.data_dir`; returns it. `data`:
    where that is, as the command's door decided (a store URL is prepared in its local copy, then uploaded);
    None: a local folder (bench's slice of a corpus, the tests).

    A finished folder for the same data settings is left alone; an interrupted one goes on with
    the tasks not yet done, and ends with the same bytes as an uninterrupted run. With a Slurm
    executor the job is submitted and `prepare` returns; running it again when the job is done
    writes meta.json (`dry_run`: print the job script instead of submitting it). datatrove's own log
    goes to `logs/<source>/` only, unless `verbose`.
    """
    d = recipe.data
    if data is not None and data.in_store:  # prepared in a local copy as below, then uploaded (store/data/)
        from hf_pretrain.store.data.data_upload import prepare_into_store

        fingerprint = data_fingerprint(recipe.data, recipe.train.seed)
        # when the store lacks what no copy here holds
        elsewhere = reprepare_hint(recipe, data, then="the training command")
        return prepare_into_store(
            data,
            fingerprint,
            lambda local: prepare(recipe.replace(data_dir=str(local)), log, dry_run, verbose),
            log,
            elsewhere=elsewhere,
        )
    data_dir = Path(d.data_dir)
    if recipe.model.init_from and d.tokenizer == "train" and not (data_dir / META_FILE).is_file():
        raise DataMismatchError(
            f"init_from={recipe.model.init_from} needs the data tokenized with its own tokenizer, not a newly "
            f"fitted BPE: set tokenizer to {recipe.model.init_from} (or data_dir to the data its own run was "
            f"prepared into, already carrying its tokenizer)"
        )
    # Inputs first, before anything in data_dir is touched.
    _check_sources_exist(recipe.data.sources)
    check_inputs_outside_outputs(recipe.data)
    check_no_duplicate_sources(recipe.data.sources)
    settings = data_settings(recipe.data, recipe.train.seed)
    fingerprint = data_fingerprint(recipe.data, recipe.train.seed)
    if (data_dir / META_FILE).is_file():
        _require_same_data_settings(data_dir, fingerprint)
        log(f"{data_dir} is already prepared (delete it to prepare again)")
        return data_dir
    refuse_foreign(data_dir)
    lock = PrepareLock(data_dir)
    lock.acquire()
    try:
        # the recipe's batch shape, once the data is written
        fits = functools.partial(check_prepared_data, recipe, Location(str(data_dir), in_store=False, kind="data"))
        return _prepare_locked(d, recipe.train.seed, data_dir, settings, fingerprint, log, dry_run, verbose, fits=fits)
    finally:
        lock.release()


def _prepare_locked(
    d: DataConfig,
    seed: int,
    data_dir: Path,
    settings: dict[str, Any],
    fingerprint: str,
    log: Callable[[str], None],
    dry_run: bool,
    verbose: bool,
    *,
    fits: Callable[[], Any],
) -> Path:
    """`prepare` of the data section `d` (`seed`: the train section's) into `data_dir`, its lock held; `fits`
    checks the written data against the whole recipe (`check_prepared_data`)."""
    from hf_pretrain.data.pipeline import ExecutorOptions, build_executor, task_input_bytes

    if (data_dir / META_FILE).is_file():  # another prepare finished it while this one waited to start
        _require_same_data_settings(data_dir, fingerprint)
        log(f"{data_dir} is already prepared (delete it to prepare again)")
        return data_dir
    refuse_while_jobs_run(data_dir, lambda source: _done_so_far(data_dir / LOGS_DIR / source))
    tokenizer = _tokenizer(d, seed, data_dir, settings, fingerprint, log)
    options = ExecutorOptions.from_recipe(d)
    shares = _token_shares(d)
    results, pending, jobs = [], [], []
    for index, source in enumerate(d.sources):
        name = source_folder_name(index, source)
        folder, logs = (data_dir / SOURCES_DIR / name).resolve(), (data_dir / LOGS_DIR / name).resolve()
        tasks = source_tasks(source)
        pipeline = _source_pipeline(
            d.val_every, data_dir, source, tasks, folder, logs, tokenizer, shares[index], options
        )
        executor = build_executor(pipeline, tasks, logs, options, job_name=f"prepare-{name}")
        todo = executor.get_incomplete_ranks()
        if dry_run:
            _print_job_script(executor, log)
            continue
        started = time.perf_counter()
        if todo:
            log(f"{name}: {len(todo)} of {tasks} task(s) to run ({options.kind})")
            with datatrove_output(logs / OUTPUT_LOG, verbose, log) as screen:
                if options.kind == "local":  # a cluster's job is followed by its own tools
                    cap = round(shares[index] * d.val_every / max(d.val_every - 1, 1)) if shares[index] else 0
                    with SourceProgress(name, logs, tasks, screen, task_input_bytes(source, tasks), cap):
                        executor.run()
                else:
                    executor.run()
        seconds = time.perf_counter() - started
        if executor.get_incomplete_ranks():  # submitted to a cluster, or failed there
            pending.append(name)
            if options.kind == "slurm" and getattr(executor, "job_id", None) not in (None, -1):
                jobs.append({"source": name, "job_id": str(executor.job_id), "tasks": len(todo)})
            continue
        documents, tokens = _count(folder)
        results.append(SourceResult(name, documents, tokens, seconds, len(todo)))
    if dry_run:
        return data_dir
    if pending:
        _record_submitted_jobs(data_dir, pending, jobs, log)
        return data_dir
    meta = _finish(d, seed, tokenizer, fingerprint, data_dir, log)
    _report_prepared(data_dir, meta, results, log, fits)
    return data_dir


def _source_pipeline(
    val_every: int,
    data_dir: Path,
    source: SourceConfig,
    tasks: int,
    folder: Path,
    logs: Path,
    tokenizer: PreTrainedTokenizerFast,
    share: int,
    options: ExecutorOptions,
) -> list[Any]:
    """One source's datatrove pipeline: its reader, then the tokenizer writing its train and validation files."""
    from hf_pretrain.data.pipeline import SplitTokenizer, reader_for

    tokenizer_file = str((data_dir / TOKENIZER_DIR / "tokenizer.json").resolve())
    return [
        reader_for(source, tasks),
        SplitTokenizer(
            str(folder),
            tokenizer_file,
            val_every,
            share,
            eos_token=tokenizer.eos_token,
            counts_dir=str(logs),
            data_dir=str(data_dir.resolve()) if options.kind == "local" else "",
        ),
    ]


def _record_submitted_jobs(
    data_dir: Path, pending: list[str], jobs: list[dict[str, Any]], log: Callable[[str], None]
) -> None:
    """Sources left to a cluster: record their Slurm jobs and say how to finish once they are done."""
    if jobs:  # the lock goes when this returns: the record keeps a second prepare out while they run
        record_jobs(data_dir, jobs)
    submitted = ", ".join(f"Slurm job {job['job_id']} ({job['source']}, {job['tasks']} tasks)" for job in jobs)
    log(
        f"submitted {submitted or ', '.join(pending)}: when the job is done (`squeue -j "
        f"{','.join(job['job_id'] for job in jobs) or 'ID'}`), run the same `hf-pretrain prepare` again to check "
        f"the files and write {data_dir / META_FILE}; until then a prepare into {data_dir} is refused"
    )


def _report_prepared(
    data_dir: Path,
    meta: dict[str, Any],
    results: list[SourceResult],
    log: Callable[[str], None],
    fits: Callable[[], Any],
) -> None:
    """Each source's counts and the totals; a recipe whose batch shape does not fit the data (`fits` raises)
    is warned here."""
    for result in results:
        log(result.line())
    log(
        f"prepared {data_dir}: {meta['splits']['train']['tokens']:,} train and "
        f"{meta['splits']['validation']['tokens']:,} validation tokens in {len(results)} source(s)"
    )
    try:
        fits()
    except DataMismatchError as exc:
        # The data is still valid; the recipe's batch shape is what does not fit. Training says so again.
        log(f"warning: {exc}")


OUTPUT_LOG = "output.log"  # in logs/<source>/: what datatrove printed (its INFO lines, stats, tracebacks)
FAILURE_TAIL_LINES = 30  # of it, shown when the tokenizing fails


@contextmanager
def datatrove_output(path: Path, verbose: bool, log: Callable[[str], None]) -> Iterator[TextIO]:
    """datatrove's screen output (loguru's INFO lines, each task's stats, tracebacks), from this process
    and the workers it starts, into `path` rather than onto the screen, unless `verbose`; yields the
    screen (for the progress line). A failure that is not a message of ours shows the end of the file."""
    if verbose:
        yield sys.stderr
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    screen_fd, stderr = os.dup(2), sys.stderr
    screen = os.fdopen(os.dup(screen_fd), "w", buffering=1)
    try:
        with path.open("a") as out:
            # both: the descriptor for the workers and native code, the object for loguru's sink here
            os.dup2(out.fileno(), 2)
            sys.stderr = out
            try:
                yield screen
            finally:
                out.flush()
                sys.stderr = stderr
                os.dup2(screen_fd, 2)
    except (SourceError, DataMismatchError, TokenizerError):
        raise  # one line that says what and where
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise  # the command says it in one line, with the free space
        tail = path.read_text(errors="replace").splitlines()[-FAILURE_TAIL_LINES:]
        print("\n".join(tail), file=sys.stderr)
        log(f"the tokenizing failed; above, the end of datatrove's log: {path}")
        raise
    finally:
        screen.close()
        os.close(screen_fd)


def _print_job_script(executor: Any, log: Callable[[str], None]) -> None:
    """What a Slurm executor would submit (the real script datatrove writes), without submitting it."""
    if not hasattr(executor, "get_launch_file_contents"):
        log(f"dry run: {type(executor).__name__} would run {executor.world_size} task(s)")
        return
    command = f"srun -l -n {executor.nodes_per_task} launch_pickled_pipeline {executor.logging_dir.resolve_paths('executor.pik')}"
    log(executor.get_launch_file_contents(executor.get_sbatch_args(executor.world_size), command))


def _token_shares(d: DataConfig) -> list[int]:
    """Each source's train-token cap: its largest share (main or decay mixture) of max_tokens, since the
    loader draws that share from it; 0 = no cap."""
    if not d.max_tokens:
        return [0] * len(d.sources)
    main = [s.weight for s in d.sources]
    decay = [s.decay_weight if s.decay_weight is not None else s.weight for s in d.sources]
    return [math.ceil(d.max_tokens * max(m / sum(main), w / sum(decay))) for m, w in zip(main, decay, strict=True)]


def _done_so_far(logs: Path) -> str:
    """What a source's tasks on a cluster have written so far (their counts files, on the shared disk)."""
    totals = CountsReader(logs, None).totals()
    return (
        f"{totals.tasks_done} task(s) done, {totals.documents:,} documents and {totals.tokens:,} tokens written so far"
    )


def _count(folder: Path) -> tuple[int, int]:
    """(documents, tokens) of a source folder's finished token files, both splits."""
    documents = tokens = 0
    for index in folder.glob("*/*.ds.index"):
        ends = np.fromfile(index, dtype="<u8")
        documents += ends.size
        tokens += int(ends[-1]) if ends.size else 0
    return documents, tokens


# ---------------------------------------------------------------------- the tokenizer
def _tokenizer(
    d: DataConfig, seed: int, data_dir: Path, settings: dict[str, Any], fingerprint: str, log: Callable[[str], None]
) -> PreTrainedTokenizerFast:
    """The tokenizer of an interrupted run with the same settings, or a fresh one, after removing what an
    interrupted run with other settings created (and only that: prepare_folder.py)."""
    progress = read_progress(data_dir)
    if progress and progress.get("data_fingerprint") == fingerprint and progress.get("tokenizer_hash"):
        try:
            tokenizer = load_tokenizer(data_dir)
        except (OSError, ValueError):
            tokenizer = None
        if tokenizer is not None and tokenizer_hash(tokenizer) == progress["tokenizer_hash"]:
            log(f"resuming {data_dir}: the tokenizer is fitted; datatrove skips the finished tasks")
            return tokenizer
    discard_or_refuse(data_dir, progress, settings, fingerprint, log)
    # Recorded before anything is created: a kill at any later moment leaves a record of what is ours.
    record = {"data_fingerprint": fingerprint, "settings": settings, "created": list(CREATED_NAMES)}
    write_progress(data_dir, record | {"tokenizer_hash": None})
    tokenizer = _fresh_tokenizer(d, seed, data_dir, log)
    write_progress(data_dir, record | {"tokenizer_hash": tokenizer_hash(tokenizer)})
    return tokenizer


def _check_sources_exist(sources: list[SourceConfig]) -> None:
    """Fail before any work on what can be checked here: a glob matching nothing, an unknown builtin."""
    from hf_pretrain.data.sources import BUILTIN_CORPORA

    for source in sources:
        if source.kind == "files":
            expand_globs(source.paths)
        elif source.kind == "builtin" and source.name not in BUILTIN_CORPORA:
            raise SourceError(
                f"unknown builtin corpus `{source.name}`; valid names: {', '.join(sorted(BUILTIN_CORPORA))}"
            )


def _fresh_tokenizer(d: DataConfig, seed: int, data_dir: Path, log: Callable[[str], None]) -> PreTrainedTokenizerFast:
    """Trained on the first `tokenizer_train_documents` of the mixture (drawn with the run's `seed`), or loaded."""
    if d.tokenizer == "train":
        limit = d.tokenizer_train_documents
        log(f"training a {d.vocab_size}-token byte-level BPE on {limit or 'all'} documents of the mixture")
        texts: Iterable[str] = (text for _, text in mixture(d.sources, seed))
        if limit:
            texts = islice(texts, limit)
        # long documents in pieces: the pre-tokenizer would otherwise hold ~110 bytes per character
        pieces = (piece for text in texts for piece in (split_long_text(text) if len(text) > PIECE_CHARS else [text]))
        tokenizer = train_tokenizer(pieces, d.vocab_size, d.special_tokens)
    else:
        log(f"using the tokenizer at {d.tokenizer}")
        tokenizer = load_pretrained_tokenizer(d.tokenizer)
    save_tokenizer(tokenizer, data_dir)
    # From here on, use exactly what every later reader of data_dir will load.
    tokenizer = load_tokenizer(data_dir)
    expected = d.vocab_size + len(d.special_tokens)
    if len(tokenizer) != expected:
        fix = (
            "the corpus is too small to learn that many tokens: lower vocab_size or add documents"
            if d.tokenizer == "train"
            else f"set vocab_size to {len(tokenizer) - len(d.special_tokens)}"
        )
        raise DataMismatchError(
            f"vocab_size: the recipe expects {expected} tokens (vocab_size {d.vocab_size} + "
            f"{len(d.special_tokens)} special tokens), found {len(tokenizer)} in {data_dir / TOKENIZER_DIR}; {fix}"
        )
    return tokenizer


def _require_same_data_settings(data_dir: Path, fingerprint: str) -> None:
    found = read_meta(data_dir).get("data_fingerprint")
    if found != fingerprint:
        raise DataMismatchError(
            f"{data_dir / META_FILE}: data_fingerprint expected {fingerprint} (this recipe's data settings), "
            f"found {found}: the folder holds data prepared with other settings; delete it or set data_dir "
            f"to a new folder"
        )


# ---------------------------------------------------------------------- meta.json
def _file_entry(data_dir: Path, path: Path, dtype: np.dtype, vocab_size: int) -> dict[str, Any]:
    """A token file's record in meta.json, after checking what this run wrote: its index agrees with it
    and every id is inside the vocabulary (read once, with the hash)."""
    digest, largest = hashlib.sha256(), -1
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
            ids = np.frombuffer(chunk, dtype=dtype, count=len(chunk) // dtype.itemsize)
            largest = max(largest, int(ids.max())) if ids.size else largest
    if largest >= vocab_size:
        raise DataMismatchError(
            f"{path}: token id {largest} is past the vocabulary of {vocab_size:,}: it was written with another "
            f"tokenizer than {data_dir / TOKENIZER_DIR}; prepare again into a new data_dir"
        )
    check_index(path, path.stat().st_size // dtype.itemsize)
    index = path.with_name(path.name + ".index")
    documents = index.stat().st_size // 8 if index.is_file() else 0
    return {
        "file": str(path.relative_to(data_dir)),
        "tokens": path.stat().st_size // dtype.itemsize,
        "documents": documents,
        "sha256": digest.hexdigest(),
    }


def _finish(
    d: DataConfig,
    seed: int,
    tokenizer: PreTrainedTokenizerFast,
    fingerprint: str,
    data_dir: Path,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Every source's files with sizes and checksums (source.json, meta.json); meta.json last (`seed`: the
    train section's, which drew the tokenizer's sample)."""
    dtype = token_dtype(len(tokenizer))
    saved_hash = tokenizer_hash(tokenizer)
    sources, totals = [], {split: {"tokens": 0, "documents": 0, "shards": []} for split in SPLITS}
    for index, source in enumerate(d.sources):
        name = source_folder_name(index, source)
        folder = data_dir / SOURCES_DIR / name
        splits = {}
        for split in SPLITS:
            files = [_file_entry(data_dir, p, dtype, len(tokenizer)) for p in sorted((folder / split).glob("*.ds"))]
            splits[split] = {
                "tokens": sum(f["tokens"] for f in files),
                "documents": sum(f["documents"] for f in files),
                "files": files,
            }
            totals[split]["tokens"] += splits[split]["tokens"]
            totals[split]["documents"] += splits[split]["documents"]
            totals[split]["shards"] += [f | {"source": name} for f in files]
        if not any(splits[split]["documents"] for split in SPLITS):  # before the hold-out's hint, which cannot help
            where = ", ".join(source.paths) if source.kind == "files" else source.name
            raise SourceError(
                f"sources[{index}]: the {source.kind} source `{where}` holds no text (0 documents): give it files "
                f"with text, or remove it from --sources"
            )
        record = {"name": name, "folder": f"{SOURCES_DIR}/{name}", "tokenizer_hash": saved_hash, "splits": splits}
        write_json_atomically(folder / SOURCE_FILE, record, indent=2)
        sources.append(record | {"config": dataclasses.asdict(source)})
    read = totals["train"]["documents"]
    if totals["validation"]["tokens"] == 0 and read < 2:
        raise DataMismatchError(
            f"{data_dir}: {read} document(s) in all: none to hold out for validation. A plain-text file is one "
            f"document unless it is larger than {TXT_SPLIT_BYTES // 10**6} MB (then split at blank lines) or "
            f"separated by {EOS_TOKEN}; a .jsonl holds one a line: add documents"
        )
    if totals["validation"]["tokens"] == 0:
        raise DataMismatchError(
            f"{data_dir}: no validation tokens: every val_every={d.val_every}th document of each task is held out and "
            f"the {totals['train']['documents']:,} documents read"
            + (f" (max_tokens={d.max_tokens:,} stopped the reading)" if d.max_tokens else "")
            + " include none; lower val_every"
            + (" or raise max_tokens" if d.max_tokens else "")
        )
    meta = {
        "format_version": FORMAT_VERSION,
        "created_by": f"hf-pretrain {_package_version()} (datatrove)",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "data_fingerprint": fingerprint,
        "tokenizer_hash": saved_hash,
        "vocab_size": len(tokenizer),
        "dtype": dtype.name,
        "eos_id": tokenizer.eos_token_id,
        "eos": EOS_POLICY,
        "seed": seed,
        "val_every": d.val_every,
        "max_tokens": d.max_tokens,
        "splits": totals,
        "sources": sources,
    }
    write_json_atomically(data_dir / META_FILE, meta, indent=2)
    (data_dir / PROGRESS_FILE).unlink(missing_ok=True)
    return meta
