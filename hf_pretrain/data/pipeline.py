"""One source's datatrove pipeline: a reader, then the tokenizer step that writes the `.ds` token files
of its train and validation parts; and the executor that runs it (local, Slurm or Ray).

A task is a unit of work datatrove can skip once done: a source's task count is fixed by the source
(one per file, one for a builtin corpus or a Hub dataset unless `tasks` says more), never by how
many run at once, so what a task writes is the same on 1 core or 64. Task `r` of `n` writes
`train/{r:05d}.ds` and `validation/{r:05d}.ds` (+ `.ds.index`, the document ends, uint64); a task
killed halfway is run again from its start, and its files are written again from the first byte.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.readers import HuggingFaceDatasetReader
from datatrove.pipeline.tokens.tokenizer import DocumentTokenizer, TokenizedFile

from hf_pretrain.config import DataConfig, SourceConfig
from hf_pretrain.data import sources
from hf_pretrain.data.sources import (
    BUILTIN_CORPORA,
    SourceError,
    expand_globs,
    file_documents,
    require_text,
)
from hf_pretrain.data.task_progress import TaskCounts
from hf_pretrain.data.tokenizer import EOS_TOKEN, PIECE_CHARS, split_long_text
from hf_pretrain.processes import ProcessIdentity, die_with, die_with_parent

SPLITS = ("train", "validation")
# Documents per call into Rust, and at most this many characters: large enough to amortise the
# call, small enough that one batch's text stays a few MB.
BATCH_DOCUMENTS = 1024
BATCH_CHARS = 8_000_000
# A document's number for the held-out choice (every val_every-th one goes to validation).
HOLDOUT_KEY = "holdout_index"
# The bytes of its task's input read up to a document (an estimate inside a file): the progress line's share.
INPUT_BYTES_KEY = "input_bytes"


def task_file(rank: int) -> str:
    """The token file task `rank` writes in each split folder."""
    return f"{rank:05d}.ds"


def task_share(total: int, rank: int, tasks: int) -> int:
    """Task `rank`'s part of a per-source `total` (documents, tokens) split over `tasks`; 0 = no limit."""
    if not total:
        return 0
    return max(1, total // tasks + (rank < total % tasks))


def task_input_bytes(source: SourceConfig, tasks: int) -> list[int] | None:
    """The bytes on disk each task of a files source reads (every `tasks`-th file); None: not known."""
    if source.kind != "files":
        return None
    sizes = [path.stat().st_size for path in expand_globs(source.paths)]
    return [sum(sizes[rank::tasks]) for rank in range(tasks)]


# ---------------------------------------------------------------------- readers
class SourceDocuments(PipelineStep):
    """A builtin corpus or local files (.txt, .jsonl, .parquet) as datatrove documents: task `rank`
    reads every `world_size`-th file of the sorted list, in order (a builtin corpus: task 0)."""

    name = "hf-pretrain source"
    type = "📖 - READER"

    def __init__(self, source: SourceConfig, max_documents: int = 0):
        super().__init__()
        self.source, self.max_documents = source, max_documents
        # files `prepare` already named for undecodable bytes while fitting the tokenizer: not again
        self.reported = frozenset(sources.reported_undecodable)

    def _texts(self, rank: int, world_size: int) -> Iterator[tuple[int, str, int]]:
        """(file number in the source, text, bytes of this task's input read so far) of this task's
        documents; inside an uncompressed file the bytes are estimated by the characters read."""
        if self.source.kind == "builtin":
            if rank == 0:
                yield from ((0, text, 0) for text in BUILTIN_CORPORA[self.source.name]())
            return
        files, before = list(enumerate(expand_globs(self.source.paths)))[rank::world_size], 0
        for number, path in files:
            size, chars = path.stat().st_size, 0
            estimate = path.suffix not in sources.COMPRESSED
            for text in file_documents([path], self.source.column):
                chars += len(text)
                yield number, text, before + (min(chars, size) if estimate else 0)
            before += size

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        sources.reported_undecodable.update(self.reported)
        limit = task_share(self.max_documents, rank, world_size)
        count, in_file, current = 0, 0, None
        for number, text, read in self._texts(rank, world_size):
            if limit and count >= limit:
                return
            if not text.strip():  # nothing to learn, and a bare end-of-text token in the data
                continue
            in_file = in_file + 1 if number == current else 0
            current = number
            self.stat_update("documents")
            # file number + position in it: which documents are held out does not depend on the
            # task count, and a source of one-document files still holds every val_every-th file out
            metadata = {HOLDOUT_KEY: number + in_file, INPUT_BYTES_KEY: read}
            yield Document(text=text, id=f"{number}/{in_file}", metadata=metadata)
            count += 1


class TextColumn:
    """A Hub row -> a document, refusing a row without the column (the reader's default skips it
    silently: a wrong `column` would prepare nothing)."""

    def __init__(self, dataset: str, column: str):
        self.dataset, self.column = dataset, column

    def __call__(self, reader: Any, data: dict, path: str, id_in_file: int | str) -> dict:
        if self.column not in data:
            raise SourceError(
                f"hub dataset `{self.dataset}` has no column `{self.column}`; available columns: "
                f"{', '.join(sorted(data))}. Some code corpora carry only blob ids that point to files "
                f"stored elsewhere, not the text itself: choose a dataset (or set `column`) that holds the text"
            )
        text = require_text(data[self.column], f"hub dataset `{self.dataset}` ({path}, row {id_in_file})", self.column)
        return {"text": text, "id": f"{path}/{id_in_file}", "metadata": {}}


def reader_for(source: SourceConfig, tasks: int) -> PipelineStep:
    if source.kind == "hub":
        options = {"split": source.split} | ({"name": source.config} if source.config else {})
        limit = -(-source.max_documents // tasks) if source.max_documents else -1
        return HuggingFaceDatasetReader(
            source.name,
            options,
            streaming=source.streaming,
            limit=limit,
            text_key=source.column,
            adapter=TextColumn(source.name, source.column),
        )
    return SourceDocuments(source, source.max_documents)


# ---------------------------------------------------------------------- the tokenizer step
class SplitTokenizer(DocumentTokenizer):
    """datatrove's DocumentTokenizer (its tokenizer loading, EOS post-processor, token files and
    stats), routing every `val_every`-th document to the validation folder, keeping the
    reading order (no shuffle: the training loader draws the order), and stopping a task's train
    part at `max_tokens`. Special-token strings inside a document are read as plain text, so a
    document quoting `<|endoftext|>` cannot forge a document boundary."""

    name = "hf-pretrain tokenizer"

    def __init__(
        self,
        folder: str,
        tokenizer_path: str,
        val_every: int,
        max_tokens: int = 0,
        eos_token: str = EOS_TOKEN,
        counts_dir: str = "",
        data_dir: str = "",
    ):
        # the tokenizer's own end-of-text: ours, or a base model's (`init_from`: Llama's `</s>`)
        super().__init__(
            f"{folder}/train",
            tokenizer_path,
            eos_token=eos_token,
            shuffle_documents=False,
            save_final_metadata=False,
            batch_size=BATCH_DOCUMENTS,
        )
        self.folder, self.val_every, self.max_tokens = folder, val_every, max_tokens
        self.eos_token = eos_token
        self.counts_dir = counts_dir  # where each task writes its running counts (task_progress.py); "": nowhere
        self.data_dir = data_dir  # whose workers lock a worker holds while it lives; "": none
        self.owner = ProcessIdentity.this()  # the `prepare` that built the pipeline; a task elsewhere is a worker

    @cached_property
    def tokenizer(self):  # datatrove's, plus special tokens as text
        tokenizer = super().tokenizer
        tokenizer.encode_special_tokens = True
        return tokenizer

    def _batches(self, data: DocumentsPipeline) -> Iterator[list[Document]]:
        batch, chars = [], 0
        for document in data:
            batch.append(document)
            chars += len(document.text)
            if len(batch) >= self.batch_size or chars >= BATCH_CHARS:
                yield batch
                batch, chars = [], 0
        if batch:
            yield batch

    @cached_property
    def eos_id(self) -> int:
        return self.tokenizer.token_to_id(self.eos_token)

    def _encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids (EOS included) of each text; one longer than PIECE_CHARS is encoded in pieces cut
        between words (the same tokens), so memory stays bounded whatever a document's length. The EOS
        is appended here, not by datatrove's post-processor: the same ids, and the post-processor costs
        a fifth more CPU per token than the encoding itself (benchmarks/bench_prepare.py)."""
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        out: list[list[int]] = [[] for _ in texts]
        short = [i for i, text in enumerate(texts) if len(text) <= PIECE_CHARS]
        encodings = encode([texts[i] for i in short], add_special_tokens=False)  # one call for all of them
        for i, encoding in zip(short, encodings, strict=True):
            out[i] = encoding.ids
            out[i].append(self.eos_id)
        for i in sorted(set(range(len(texts))) - set(short)):
            pieces = encode(split_long_text(texts[i]), add_special_tokens=False)
            out[i] = [token for piece in pieces for token in piece.ids] + [self.eos_id]
        return out

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> None:
        if os.getpid() != self.owner.pid:
            # A worker, forked by multiprocess's forkserver, which lives as long as its workers do: it
            # ends with `prepare` itself, and keeps the folder busy for a rerun until it has.
            if self.data_dir:
                from hf_pretrain.data.prepare_folder import hold_as_worker

                hold_as_worker(self.data_dir)
            die_with(self.owner)
        dtype = np.dtype("<u4" if self.token_size == 4 else "<u2")
        files = {
            split: TokenizedFile(f"{self.folder}/{split}", task_file(rank), token_size=dtype.itemsize)
            for split in SPLITS
        }
        counts = TaskCounts(self.counts_dir, rank) if self.counts_dir else None
        budget = task_share(self.max_tokens, rank, world_size)
        index, full = 0, False
        for batch in self._batches(data):
            with self.track_time(unit="batch"):
                encodings = self._encode([document.text for document in batch])
            batch_tokens = written = 0
            for document, ids in zip(batch, encodings, strict=True):
                number = document.metadata.get(HOLDOUT_KEY, index)  # a Hub row: its place in the task
                split = "validation" if number % self.val_every == self.val_every - 1 else "train"
                files[split].write_bytes(np.asarray(ids, dtype=dtype).tobytes())
                self.stat_update("tokens", value=len(ids))
                self.stat_update(f"{split}_documents")
                batch_tokens, written, index = batch_tokens + len(ids), written + 1, index + 1
                full = bool(budget) and len(files["train"]) >= budget
                if full:
                    break
            if counts:
                counts.add(written, batch_tokens, batch[written - 1].metadata.get(INPUT_BYTES_KEY, 0))
            if full:  # this task's share of max_tokens: the rest of its documents stay unread
                break
        for file in files.values():
            file.close()
        if counts:
            counts.write()


# ---------------------------------------------------------------------- executors
_forks_armed = False


def _children_die_with_this_process() -> None:
    """Every process forked from this one from now on (datatrove's `multiprocess.Manager`, which holds
    the folder's lock too) gets SIGKILL when this one ends, however it ends: a killed `prepare` leaves
    nothing running. (The pool's workers come from a forkserver: SplitTokenizer.run arms them.)"""
    global _forks_armed
    if not _forks_armed:
        os.register_at_fork(after_in_child=_die_with_parent)
        _forks_armed = True


def _die_with_parent() -> None:
    die_with_parent(signal.SIGKILL)


@dataclass
class ExecutorOptions:
    kind: str = "local"
    workers: int = 0  # 0: every core (local); no limit (slurm)
    slurm_partition: str = ""
    slurm_time: str = "12:00:00"
    slurm_cpus_per_task: int = 1
    ray_address: str = "auto"

    @classmethod
    def from_recipe(cls, data: DataConfig) -> ExecutorOptions:
        return cls(
            data.executor,
            data.workers,
            data.slurm_partition,
            data.slurm_time,
            data.slurm_cpus_per_task,
            data.ray_address,
        )


def build_executor(
    pipeline: list[PipelineStep], tasks: int, logging_dir: Path, options: ExecutorOptions, job_name: str
):
    """The datatrove executor of one source's pipeline; its `logging_dir` holds the completed tasks."""
    if options.kind == "local":
        from datatrove.executor import LocalPipelineExecutor

        _children_die_with_this_process()
        workers = min(tasks, options.workers or os.cpu_count() or 1)
        # each task tokenizes on its own core: no Rust thread pool per process fighting the others
        if workers > 1:
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        return LocalPipelineExecutor(pipeline, tasks=tasks, workers=workers, logging_dir=str(logging_dir))
    if options.kind == "slurm":
        from datatrove.executor import SlurmPipelineExecutor

        return SlurmPipelineExecutor(
            pipeline,
            tasks=tasks,
            time=options.slurm_time,
            partition=options.slurm_partition,
            cpus_per_task=options.slurm_cpus_per_task,
            workers=options.workers or -1,
            job_name=job_name,
            logging_dir=str(logging_dir),
            # the tasks run this Python: hf_pretrain's readers travel pickled and import from here
            env_command=f"source {Path(sys.prefix) / 'bin' / 'activate'}",
            mail_type="NONE",
            qos="",
        )
    try:
        import ray
        from datatrove.executor.ray import RayPipelineExecutor
    except ImportError as exc:
        raise SourceError(f"executor=ray needs Ray: `pip install -c constraints.txt -e '.[ray]'` ({exc})") from None
    ray.init(address=options.ray_address, ignore_reinit_error=True)
    return RayPipelineExecutor(pipeline, tasks=tasks, workers=options.workers or -1, logging_dir=str(logging_dir))
