"""What `prepare` must never do (issue 29): remove what it did not write, let two runs mix one folder,
glue a list where text belongs, leave its workers alive after a kill, or answer bad input with a
traceback. Tiny corpora, CPU, offline."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hf_pretrain.config import build_recipe
from hf_pretrain.data import DataMismatchError, prepare, read_meta
from hf_pretrain.data.sources import SourceError
from hf_pretrain.data.tokenizer import save_tokenizer, train_tokenizer
from tests.helpers import ROOT
from tests.test_prepare import SETTINGS, VOCAB, _document, big_corpus  # noqa: F401, F811 (a fixture)


def write_jsonl(path: Path, documents: int = 60, seed: int = 5) -> Path:
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": _document(rng)}) + "\n" for _ in range(documents)))
    return path


def files_recipe(data_dir: Path, *patterns: str, **overrides):
    sources = [{"kind": "files", "paths": [p]} for p in patterns]
    return build_recipe({"data": {"sources": sources}}, {**SETTINGS, "data_dir": str(data_dir), **overrides})


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------------- 1. never removes what it did not write
def test_a_corpus_inside_data_dir_sources_is_refused_untouched_and_the_printed_data_dir_works(tmp_path) -> None:
    corpus = tmp_path / "corpus"
    write_jsonl(corpus / "sources" / "a.jsonl")
    before = tree(corpus)
    recipe = files_recipe(corpus, str(corpus / "sources" / "*.jsonl"))
    with pytest.raises(SourceError, match=r"sources\[0\]: .*a\.jsonl lies in .*corpus/sources, where `prepare`") as e:
        prepare(recipe, log=quiet)
    assert tree(corpus) == before, "the corpus was touched"
    fix = str(e.value).split("--data_dir ")[1].rstrip("`")
    assert fix == str((tmp_path / "corpus-prepared").resolve())
    prepare(files_recipe(Path(fix), str(corpus / "sources" / "*.jsonl")), log=quiet)
    assert read_meta(fix)["splits"]["train"]["tokens"] > 0 and tree(corpus) == before


def test_the_tokenizer_it_was_told_to_use_inside_data_dir_is_refused_and_kept(tmp_path) -> None:
    corpus = write_jsonl(tmp_path / "a.jsonl")
    data_dir = tmp_path / "dd"
    save_tokenizer(train_tokenizer([_document(random.Random(1)) for _ in range(200)], VOCAB, []), data_dir)
    before = tree(data_dir)
    recipe = files_recipe(data_dir, str(corpus), tokenizer=str(data_dir / "tokenizer"))
    with pytest.raises(SourceError, match=r"tokenizer: .*dd/tokenizer lies in .*dd/tokenizer, where `prepare`"):
        prepare(recipe, log=quiet)
    assert tree(data_dir) == before


def test_a_folder_holding_files_prepare_did_not_write_where_it_writes_is_refused_untouched(tmp_path) -> None:
    corpus = write_jsonl(tmp_path / "a.jsonl")
    data_dir = tmp_path / "dd"
    (data_dir / "logs").mkdir(parents=True)
    (data_dir / "logs" / "mine.log").write_text("a user's own log\n")
    (data_dir / "notes.md").write_text("not prepare's\n")
    before = tree(data_dir)
    with pytest.raises(
        DataMismatchError, match=r"dd already holds logs, where `prepare` writes.*--data_dir .*dd-prepared"
    ):
        prepare(files_recipe(data_dir, str(corpus)), log=quiet)
    assert tree(data_dir) == before


def test_an_interrupted_prepare_rerun_with_other_settings_says_what_it_discards_and_why(tmp_path) -> None:
    good = write_jsonl(tmp_path / "good.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\nnot json\n")
    data_dir = tmp_path / "dd"
    data_dir.mkdir()
    (data_dir / "notes.md").write_text("the user's, beside the data\n")
    with pytest.raises(SourceError, match="bad.jsonl:2"):  # the tokenizer's fit stops on the second source
        prepare(files_recipe(data_dir, str(good), str(bad), tokenizer_train_documents=0), log=quiet)
    assert (data_dir / "prepare_progress.json").is_file()
    logs: list[str] = []
    prepare(files_recipe(data_dir, str(good), vocab_size=VOCAB + 20), log=logs.append)
    said = next(line for line in logs if line.startswith("discarding"))
    assert "other data settings" in said and "sources" in said and "vocab_size" in said, said
    assert (data_dir / "notes.md").read_text() == "the user's, beside the data\n"
    assert read_meta(data_dir)["vocab_size"] == VOCAB + 20


def test_the_same_file_in_two_sources_is_refused_before_anything_is_written(tmp_path) -> None:
    corpus = write_jsonl(tmp_path / "c" / "a.jsonl")
    data_dir = tmp_path / "dd"
    with pytest.raises(SourceError, match=r"sources\[0\] and sources\[1\] both read the file .*a\.jsonl"):
        prepare(files_recipe(data_dir, str(corpus), str(tmp_path / "c" / "*.jsonl")), log=quiet)
    assert not data_dir.exists()


# ---------------------------------------------------------------------- 2. one prepare at a time; files agree
HOLD_LOCK = (
    "import sys, time\nfrom pathlib import Path\nfrom hf_pretrain.data.prepare_folder import PrepareLock\n"
    "PrepareLock(Path(sys.argv[1])).acquire()\nprint('locked', flush=True)\ntime.sleep(600)\n"
)


def test_a_second_prepare_into_a_held_folder_is_refused_by_name_and_touches_nothing(tmp_path) -> None:
    corpus = write_jsonl(tmp_path / "a.jsonl")
    data_dir = tmp_path / "dd"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(data_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = tree(data_dir)
        args = ["--sources", json.dumps([{"kind": "files", "paths": [str(corpus)]}]), "--data_dir", str(data_dir)]
        args += [item for key, value in SETTINGS.items() for item in (f"--{key}", str(value))]
        second = subprocess.run(
            [sys.executable, "-m", "hf_pretrain.cli", "prepare", *args], cwd=ROOT, capture_output=True, text=True
        )
        assert second.returncode == 73, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {holder.pid} on " in lines[0] and "another `hf-pretrain prepare`" in lines[0]
        assert tree(data_dir) == before
    finally:
        holder.kill()
        holder.wait()


def test_a_token_file_that_disagrees_with_its_index_is_refused_by_the_doctor_and_the_loader(tmp_path) -> None:
    from hf_pretrain.data import build_train_loader
    from hf_pretrain.preflight.data import check_prepared

    recipe = files_recipe(tmp_path / "dd", str(write_jsonl(tmp_path / "a.jsonl", documents=400)))
    prepare(recipe, log=quiet)
    meta = read_meta(recipe.data.data_dir)
    index = Path(recipe.data.data_dir) / (meta["sources"][0]["splits"]["train"]["files"][0]["file"] + ".index")
    index.write_bytes(index.read_bytes()[:-8])  # another run's index: its documents end elsewhere
    result = check_prepared(recipe)
    assert result.status == "fail" and "00000.ds.index: its last document ending at token" in result.reason
    with pytest.raises(DataMismatchError, match="token file and its index come from different runs"):
        build_train_loader(recipe, rank=0, world_size=1, grad_accum=1, start_step=0)


# ---------------------------------------------------------------------- 4. workers die with prepare
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_prepare_with_a_pool_of_workers_leaves_no_process_behind(big_corpus, tmp_path) -> None:  # noqa: F811
    from tests.test_prepare import cli_args, left_running, run_prepare

    data_dir = tmp_path / "data"
    process = run_prepare(
        cli_args(big_corpus, data_dir) + ["--tokenizer_train_documents", "500", "--workers", "2"],
        start_new_session=True,
    )
    task_logs = data_dir / "logs" / f"00-{big_corpus.name}" / "logs"
    deadline = time.time() + 120
    while not (task_logs.is_dir() and len(list(task_logs.iterdir())) >= 2) and process.poll() is None:
        assert time.time() < deadline, "prepare made no progress"
        time.sleep(0.01)
    assert process.poll() is None, process.stdout.read().decode()
    process.kill()
    process.wait()
    assert left_running(process.pid, str(data_dir)) == [], "a worker of the killed prepare outlived it"
