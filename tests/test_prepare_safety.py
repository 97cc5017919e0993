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
from hf_pretrain.data.prepare_run import prepare
from hf_pretrain.data.prepared import DataMismatchError, read_meta
from hf_pretrain.data.sources import SourceError
from hf_pretrain.data.tokenizer import save_tokenizer, train_tokenizer
from hf_pretrain.exit_codes import EXIT_CONFIG
from tests.helpers import OUTSIDE_CHECKOUT, cli
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
        [sys.executable, "-c", HOLD_LOCK, str(data_dir)], cwd=OUTSIDE_CHECKOUT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = tree(data_dir)
        args = ["--sources", json.dumps([{"kind": "files", "paths": [str(corpus)]}]), "--data_dir", str(data_dir)]
        args += [item for key, value in SETTINGS.items() for item in (f"--{key}", str(value))]
        second = cli("prepare", *args)
        assert second.returncode == 73, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {holder.pid} on " in lines[0] and "another `hf-pretrain prepare`" in lines[0]
        assert tree(data_dir) == before
    finally:
        holder.kill()
        holder.wait()


def test_a_token_file_that_disagrees_with_its_index_is_refused_by_the_doctor_and_the_loader(tmp_path) -> None:
    from tests.helpers import build_train_loader, prepared_row

    recipe = files_recipe(tmp_path / "dd", str(write_jsonl(tmp_path / "a.jsonl", documents=400)))
    prepare(recipe, log=quiet)
    meta = read_meta(recipe.data.data_dir)
    index = Path(recipe.data.data_dir) / (meta["sources"][0]["splits"]["train"]["files"][0]["file"] + ".index")
    index.write_bytes(index.read_bytes()[:-8])  # another run's index: its documents end elsewhere
    result = prepared_row(recipe)
    assert result.status == "fail" and "00000.ds.index: its last document ending at token" in result.reason
    with pytest.raises(DataMismatchError, match="token file and its index come from different runs"):
        build_train_loader(recipe, rank=0, world_size=1, grad_accum=1, start_step=0)


# ---------------------------------------------------------------------- 4. workers die with prepare
def completed_tasks(data_dir: Path) -> set[str]:
    return {p.name for p in data_dir.glob("logs/*/completions/*")}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM"])
def test_a_killed_prepare_with_a_pool_of_workers_leaves_no_process_behind(big_corpus, tmp_path, signal_name) -> None:  # noqa: F811
    """Its workers are the forkserver's children, and the forkserver lives as long as they do: they must
    follow `prepare` itself, at once (not finish their task first, writing into a folder nobody holds)."""
    import signal

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
    process.send_signal(getattr(signal, signal_name))
    # read after the signal: a task that completes between a read and the signal is no worker going on
    # after it (the read used to come first and raced the workers; issue 49)
    done = completed_tasks(data_dir)
    process.wait()
    assert left_running(process.pid, str(data_dir), grace_s=3) == [], "a worker of the killed prepare outlived it"
    assert completed_tasks(data_dir) == done, "a worker went on to finish its task after prepare was killed"


STRAGGLER = (
    "import sys, time\nfrom hf_pretrain.data.prepare_folder import hold_as_worker\n"
    "hold_as_worker(sys.argv[1])\nprint('holding', flush=True)\ntime.sleep(600)\n"
)


def test_a_prepare_is_refused_while_a_worker_of_an_earlier_one_still_lives_and_runs_once_it_is_gone(
    tmp_path,
) -> None:
    corpus = write_jsonl(tmp_path / "a.jsonl")
    data_dir = tmp_path / "dd"
    data_dir.mkdir()
    (data_dir / "prepare.lock").touch()  # as the killed prepare left it: nobody holds it
    straggler = subprocess.Popen(
        [sys.executable, "-c", STRAGGLER, str(data_dir)], cwd=OUTSIDE_CHECKOUT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert straggler.stdout.readline().strip() == "holding"
        before = tree(data_dir)
        refused = prepare_cli(data_dir, [{"kind": "files", "paths": [str(corpus)]}])
        assert refused.returncode == 73, refused.stderr
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and "workers of an earlier `hf-pretrain prepare`" in lines[0], refused.stderr
        assert f"kill {straggler.pid}`" in lines[0]
        assert tree(data_dir) == before, "a refused prepare touched the folder"
    finally:
        straggler.kill()
        straggler.wait()
    again = prepare_cli(data_dir, [{"kind": "files", "paths": [str(corpus)]}])
    assert again.returncode == 0, again.stderr
    assert read_meta(data_dir)["splits"]["train"]["tokens"] > 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_process_ends_with_one_that_is_not_its_parent() -> None:
    """processes.die_with: what a datatrove worker does to end with `prepare`, its grandparent."""
    followed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    follower = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom hf_pretrain.processes import ProcessIdentity, die_with, start_time\n"
            "die_with(ProcessIdentity(int(sys.argv[1]), start_time(int(sys.argv[1]))))\n"
            "print('armed', flush=True)\ntime.sleep(600)\n",
            str(followed.pid),
        ],
        cwd=OUTSIDE_CHECKOUT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout.readline().strip() == "armed"
        time.sleep(0.5)
        assert follower.poll() is None, "it ended while the process it follows lives"
        followed.kill()
        followed.wait()
        assert follower.wait(timeout=5) == -9
    finally:
        for process in (followed, follower):
            process.kill()
            process.wait()


# ---------------------------------------------------------------------- 3. text that is not a string
def prepare_cli(data_dir: Path, sources: list[dict], *extra: str) -> subprocess.CompletedProcess:
    args = ["--sources", json.dumps(sources), "--data_dir", str(data_dir)]
    args += [item for key, value in SETTINGS.items() for item in (f"--{key}", str(value))]
    return cli("prepare", *args, *extra)


NOT_TEXT = [
    ({"text": ["first half.", "second half."]}, r"`text` holds a list \(\[\"first half\.\", \"second half\.\"\]\)"),
    ({"text": 42}, r"`text` holds a number \(42\)"),
    ({"text": {"body": "x"}}, r"`text` holds an object"),
    ("a bare string line", r"is a string, not a JSON object with a `text` key"),
]


@pytest.mark.parametrize("tokenizer", ["train", "fixed"])
@pytest.mark.parametrize(("row", "said"), NOT_TEXT, ids=["list", "int", "dict", "bare-string"])
def test_a_text_that_is_not_a_string_is_refused_naming_file_line_and_type_on_every_path(
    tmp_path, row, said, tokenizer
) -> None:
    corpus = write_jsonl(tmp_path / "a.jsonl", documents=30)
    with corpus.open("a") as f:
        f.write(json.dumps(row) + "\n")
    extra: list[str] = []
    if tokenizer == "fixed":  # init_from's path: no fit, the documents meet datatrove first
        tokenizer_ = train_tokenizer([_document(random.Random(1)) for _ in range(200)], VOCAB, [])
        save_tokenizer(tokenizer_, tmp_path / "t")
        extra = ["--tokenizer", str(tmp_path / "t" / "tokenizer"), "--vocab_size", str(len(tokenizer_))]
    result = prepare_cli(tmp_path / "dd", [{"kind": "files", "paths": [str(corpus)]}], *extra)
    assert result.returncode == EXIT_CONFIG, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "a.jsonl:31" in result.stderr
    assert __import__("re").search(said, result.stderr), result.stderr


# ---------------------------------------------------------------------- 5. messages, not tracebacks
def test_a_gzipped_jsonl_is_read_as_its_plain_twin_and_a_zstd_one_is_named(tmp_path) -> None:
    import gzip

    plain = write_jsonl(tmp_path / "plain" / "a.jsonl", documents=200)
    packed = tmp_path / "packed" / "a.jsonl.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    prepare(files_recipe(tmp_path / "p1", str(plain)), log=quiet)
    prepare(files_recipe(tmp_path / "p2", str(packed)), log=quiet)
    one, two = read_meta(tmp_path / "p1"), read_meta(tmp_path / "p2")
    assert one["splits"] == two["splits"], "the gzipped file gave other tokens"
    misnamed = tmp_path / "misnamed" / "b.jsonl"
    misnamed.parent.mkdir()
    misnamed.write_bytes(packed.read_bytes())
    with pytest.raises(SourceError, match=r"b\.jsonl: the file is gzip-compressed.*b\.jsonl\.gz`") as e:
        prepare(files_recipe(tmp_path / "p3", str(misnamed)), log=quiet)
    assert "iconv" not in str(e.value)
    zst = tmp_path / "z" / "c.jsonl.zst"
    zst.parent.mkdir()
    zst.write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 16)
    try:
        import zstandard  # noqa: F401
    except ImportError:
        with pytest.raises(SourceError, match=r"c\.jsonl\.zst is zstd-compressed: `pip install zstandard`"):
            prepare(files_recipe(tmp_path / "p4", str(zst)), log=quiet)


def test_a_full_disk_while_tokenizing_is_one_line_with_the_free_space_and_the_rerun_goes_on(
    tmp_path, monkeypatch, capsys
) -> None:
    import errno

    from datatrove.pipeline.tokens.tokenizer import TokenizedFile

    from hf_pretrain.data.prepare_command import main

    corpus = write_jsonl(tmp_path / "a.jsonl", documents=300)
    data_dir = tmp_path / "dd"
    args = ["--sources", json.dumps([{"kind": "files", "paths": [str(corpus)]}]), "--data_dir", str(data_dir)]
    args += [item for key, value in SETTINGS.items() for item in (f"--{key}", str(value))]

    def disk_full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(data_dir / "sources"))

    with monkeypatch.context() as patch:
        patch.setattr(TokenizedFile, "write_bytes", disk_full)
        assert main(args) == 74
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the disk is full (" in err[0] and " free on " in err[0], err
    assert main(args) == 0
    assert read_meta(data_dir)["splits"]["train"]["tokens"] > 0


def test_a_decay_only_source_is_prepared_and_drawn_from_the_decay_on(tmp_path) -> None:
    from hf_pretrain.data.loader import build_mixture
    from tests.helpers import prepared_row

    main_corpus = write_jsonl(tmp_path / "main.jsonl", documents=300, seed=1)
    best = write_jsonl(tmp_path / "best.jsonl", documents=300, seed=2)
    sources = [
        {"kind": "files", "paths": [str(main_corpus)], "weight": 1.0},
        {"kind": "files", "paths": [str(best)], "weight": 0, "decay_weight": 1.0},
    ]
    result = prepare_cli(tmp_path / "dd", sources)
    assert result.returncode == 0, result.stderr
    recipe = build_recipe({"data": {"sources": sources}}, {**SETTINGS, "data_dir": str(tmp_path / "dd")})
    assert prepared_row(recipe).status in ("pass", "warn")
    meta = read_meta(tmp_path / "dd")
    assert [s["splits"]["train"]["tokens"] > 0 for s in meta["sources"]] == [True, True]
    mixture = build_mixture(recipe.data.sources, [100, 100], decay_position=64, seed=recipe.train.seed)
    drawn = [mixture(p)[0] for p in range(128)]
    assert set(drawn[:64]) == {0} and drawn[64:].count(1) == 32  # decay: 1 and 1


def test_a_source_of_weight_0_without_decay_weight_is_refused_saying_how_to_write_one(tmp_path) -> None:
    from hf_pretrain.config import RecipeError

    sources = [{"kind": "files", "paths": ["a.jsonl"]}, {"kind": "files", "paths": ["b.jsonl"], "weight": 0}]
    with pytest.raises(RecipeError, match=r"sources\[1\] has weight 0 and no decay_weight.*decay-only source"):
        build_recipe({"data": {"sources": sources}}, {**SETTINGS, "data_dir": str(tmp_path / "dd")})


def test_a_data_dir_that_cannot_be_made_says_why_with_a_fix_that_can_work(tmp_path, monkeypatch):
    """A dangling link was refused as "a file is in the way ... a writable disk", and a read-only disk got a
    folder next to it, on the same disk (issue 45)."""
    from hf_pretrain.data.prepare_folder import PrepareLock

    dangling = tmp_path / "dd"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(DataMismatchError) as refused:
        PrepareLock(dangling).acquire()
    assert f"is a symbolic link to {tmp_path / 'nowhere'}, which does not exist" in str(refused.value)
    assert f"`mkdir -p {tmp_path / 'nowhere'}`" in str(refused.value)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(DataMismatchError) as refused:
        PrepareLock(Path("/proc/no_such/dd")).acquire()  # a pseudo filesystem: nothing can be made there
    said = str(refused.value)
    assert (
        "read-only or not writable" in said and f"`--data_dir {tmp_path / 'home' / 'hf_pretrain_data' / 'dd'}`" in said
    )
