"""`prepare` on datatrove: a kill then a rerun, the Slurm path (a stand-in `sbatch`), the folder
refusals, and the training mixture drawn over the sources. Tiny and CPU-only."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

from hf_pretrain.config import build_recipe
from hf_pretrain.data.loader import StepBatchSampler, build_mixture
from hf_pretrain.data.mixing import Mixture, block_counts
from hf_pretrain.data.prepare_run import prepare
from hf_pretrain.data.prepared import DataMismatchError, check_prepared_data, read_meta
from hf_pretrain.data.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer
from hf_pretrain.data.verify import VERIFIED_FILE
from tests.helpers import OUTSIDE_CHECKOUT, data_of, offline_env, placed
from tests.stacks import communicate_or_diagnose

VOCAB = 300
WORDS = "the of and to in is was for on that with as by at from data model token python loss batch".split()


def _document(rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(5, 60))).capitalize() + "."


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four jsonl files (four tasks for one source) and a txt file (another source)."""
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(3)
    for i in range(4):
        (root / f"part{i}.jsonl").write_text("".join(json.dumps({"text": _document(rng)}) + "\n" for _ in range(400)))
    (root / "notes.txt").write_text("\n\n".join(_document(rng) for _ in range(50)))
    return root


def raw_recipe(corpus: Path) -> dict:
    return {
        "data": {
            "sources": [
                {"kind": "files", "paths": [str(corpus / "*.jsonl")], "weight": 3.0},
                {"kind": "files", "paths": [str(corpus / "notes.txt")], "weight": 1.0},
            ]
        }
    }


SETTINGS = {
    "vocab_size": VOCAB,
    "val_every": 10,
    "seq_len": 16,
    "micro_batch_size": 2,
    "global_batch_tokens": 64,
    "num_workers": 0,
    "max_steps": 10,
    "warmup_steps": 1,
    "eval_tokens": 64,
    "workers": 1,
}


def recipe_for(corpus: Path, data_dir: Path, **overrides):
    return build_recipe(raw_recipe(corpus), {**SETTINGS, "data_dir": str(data_dir), **overrides})


def folder_bytes(data_dir: Path) -> dict[str, bytes]:
    """The token files and records of a prepared folder (not datatrove's logs, not times)."""
    files = {
        str(p.relative_to(data_dir)): p.read_bytes() for p in sorted((data_dir / "sources").rglob("*")) if p.is_file()
    }
    files |= {str(p.relative_to(data_dir)): p.read_bytes() for p in sorted((data_dir / "tokenizer").rglob("*"))}
    meta = read_meta(data_dir)
    meta["created_at"] = None
    files["meta.json"] = json.dumps(meta).encode()
    return files


@pytest.fixture(scope="module")
def prepared(corpus: Path, tmp_path_factory: pytest.TempPathFactory):
    recipe = recipe_for(corpus, tmp_path_factory.mktemp("prepared") / "data")
    prepare(recipe, log=lambda _: None)
    return recipe


def run_prepare(args: list[str], env: dict | None = None, **kwargs) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hf_pretrain.cli", "prepare", *args]
    return subprocess.Popen(
        cmd,
        cwd=OUTSIDE_CHECKOUT,
        env={**offline_env(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **kwargs,
    )


def cli_args(corpus: Path, data_dir: Path) -> list[str]:
    args = ["--sources", json.dumps(raw_recipe(corpus)["data"]["sources"]), "--data_dir", str(data_dir)]
    for key, value in SETTINGS.items():
        args += [f"--{key}", str(value)]
    return args


# ---------------------------------------------------------------------- the folder
def test_each_source_gets_its_own_folder_of_datatrove_files_with_ids_as_the_tokenizer_alone(corpus, prepared) -> None:
    data_dir = Path(prepared.data.data_dir)
    meta = read_meta(data_dir)
    assert [s["name"] for s in meta["sources"]] == [f"00-{corpus.name}", "01-notes"]
    jsonl, txt = meta["sources"]
    assert [Path(f["file"]).name for f in jsonl["splits"]["train"]["files"]] == [f"0000{r}.ds" for r in range(4)]
    # every 10th document of each task is held out: 40 of each file's 400
    assert jsonl["splits"]["validation"]["documents"] == 160 and jsonl["splits"]["train"]["documents"] == 1440
    tokenizer = load_tokenizer(data_dir)
    tokenizer.backend_tokenizer.encode_special_tokens = True
    documents = [
        json.loads(line)["text"] for line in (Path(prepared.data.sources[0].paths[0]).parent / "part0.jsonl").open()
    ]
    tokens = np.fromfile(data_dir / jsonl["splits"]["train"]["files"][0]["file"], dtype=meta["dtype"])
    ends = np.fromfile(data_dir / (jsonl["splits"]["train"]["files"][0]["file"] + ".index"), dtype="<u8")
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    train_documents = [d for i, d in enumerate(documents) if i % 10 != 9]
    for document, start, end in zip(train_documents, starts, ends, strict=True):
        alone = tokenizer(document, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert tokens[start:end].tolist() == alone


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three jsonl files of ~0.6M tokens each: a task takes long enough to be killed halfway."""
    root = tmp_path_factory.mktemp("big")
    rng = random.Random(4)
    for i in range(3):
        (root / f"part{i}.jsonl").write_text(
            "".join(json.dumps({"text": _document(rng)}) + "\n" for _ in range(20_000))
        )
    (root / "notes.txt").write_text("\n\n".join(_document(rng) for _ in range(50)))
    return root


def left_running(session: int, text: str, grace_s: float = 10.0) -> list[str]:
    """The processes still alive (not zombies) in process group `session` or whose command line holds
    `text`, after up to `grace_s` for the kernel to end them."""
    deadline, found = time.time() + grace_s, []
    while True:
        found = []
        for stat_file in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat_file.read_text().rsplit(")", 1)[1].split()
                cmdline = (stat_file.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            state, pgid = fields[0], int(fields[2])
            if state != "Z" and int(stat_file.parent.name) != os.getpid() and (pgid == session or text in cmdline):
                found.append(f"{stat_file.parent.name} {cmdline[:200]}")
        if not found or time.time() > deadline:
            return found
        time.sleep(0.2)


def test_a_kill_during_prepare_then_the_same_command_ends_with_identical_files(big_corpus, tmp_path) -> None:
    args = ["--tokenizer_train_documents", "2000"]
    uninterrupted = tmp_path / "uninterrupted"
    first = run_prepare(cli_args(big_corpus, uninterrupted) + args)
    assert first.wait(timeout=300) == 0, first.stdout.read().decode()
    data_dir = tmp_path / "data"
    process = run_prepare(cli_args(big_corpus, data_dir) + args, start_new_session=True)
    completions = data_dir / "logs" / f"00-{big_corpus.name}" / "completions"
    deadline = time.time() + 120
    while not (completions.is_dir() and any(completions.iterdir())) and process.poll() is None:
        assert time.time() < deadline, "prepare made no progress"
        time.sleep(0.01)
    # in the second task: the first one is complete. Certain by margin (issue 49): the two tasks left,
    # 0.6M tokens each, take seconds, the poll 10 ms
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (data_dir / "meta.json").exists(), "killed too late: the run had finished"
    assert left_running(process.pid, str(data_dir)) == [], "a process of the killed prepare outlived it"
    done_before = len(list(completions.iterdir()))
    assert 1 <= done_before < 3
    rerun = run_prepare(cli_args(big_corpus, data_dir) + args)
    out = communicate_or_diagnose(rerun, 300)[0].decode()
    assert rerun.returncode == 0, out
    assert f"{3 - done_before} of 3 task(s) to run" in out and "resuming" in out
    assert folder_bytes(data_dir) == folder_bytes(uninterrupted)


def test_prepare_prints_a_line_per_source_and_reruns_as_already_done(prepared) -> None:
    logs: list[str] = []
    prepare(prepared, log=logs.append)
    assert any("already prepared" in line for line in logs)


# ---------------------------------------------------------------------- Slurm
STANDIN_SBATCH = """#!/bin/bash
# A stand-in for Slurm's sbatch: runs the real script datatrove wrote, once per array index, here.
for arg in "$@"; do case "$arg" in --export=*) for kv in ${arg#--export=}; do :; done;
  IFS=',' read -ra pairs <<< "${arg#--export=}"; for kv in "${pairs[@]}"; do [[ "$kv" == *=* ]] && export "$kv"; done;; esac; done
script="${@: -1}"
cp "$script" "$STANDIN_DIR/submitted_$(date +%s%N).slurm"
range=$(sed -n 's/^#SBATCH --array=\\([0-9]*-[0-9]*\\).*/\\1/p' "$script"); range=${range:-0-0}
for i in $(seq "${range%-*}" "${range#*-}"); do
  SLURM_ARRAY_TASK_ID=$i SLURM_JOB_ID=4242 SLURM_NODELIST=localhost bash "$script" >> "$STANDIN_DIR/jobs.log" 2>&1 || exit 1
done
echo "Submitted batch job 4242"
"""
STANDIN_SRUN = """#!/bin/bash
while [[ "$1" == -* ]]; do case "$1" in -n|-N) shift 2;; *) shift;; esac; done
exec "$@"
"""
STANDIN_SCONTROL = """#!/bin/bash
echo localhost
"""


def standin_slurm(folder: Path) -> dict[str, str]:
    folder.mkdir()
    for name, text in (("sbatch", STANDIN_SBATCH), ("srun", STANDIN_SRUN), ("scontrol", STANDIN_SCONTROL)):
        (folder / name).write_text(text)
        (folder / name).chmod((folder / name).stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "STANDIN_DIR": str(folder)}


def test_slurm_writes_and_submits_the_array_job_whose_tasks_prepare_the_same_folder(corpus, prepared, tmp_path) -> None:
    env = standin_slurm(tmp_path / "bin")
    data_dir = tmp_path / "data"
    args = cli_args(corpus, data_dir) + ["--executor", "slurm", "--slurm_partition", "cpu", "--workers", "0"]
    dry = run_prepare(args + ["--dry_run"], env=env)
    out = communicate_or_diagnose(dry, 300)[0].decode()
    assert dry.returncode == 0, out
    assert "#SBATCH --partition=cpu" in out and "#SBATCH --array=0-3" in out and "launch_pickled_pipeline" in out
    assert not list((tmp_path / "bin").glob("submitted_*")), "a dry run submits nothing"
    run = run_prepare(args, env=env)
    out = communicate_or_diagnose(run, 300)[0].decode()
    assert run.returncode == 0, out + (tmp_path / "bin" / "jobs.log").read_text()
    scripts = sorted((tmp_path / "bin").glob("submitted_*"))
    assert any("--array=0-3" in s.read_text() for s in scripts)  # the real script, four tasks of the jsonl source
    assert folder_bytes(data_dir) == folder_bytes(Path(prepared.data.data_dir))


# ---------------------------------------------------------------------- refusals
def test_a_folder_of_the_old_format_is_refused_with_the_command_that_prepares_it_again(prepared, tmp_path) -> None:
    data_dir = tmp_path / "data"
    shutil.copytree(prepared.data.data_dir, data_dir)
    meta = read_meta(data_dir)
    (data_dir / "meta.json").write_text(json.dumps(meta | {"format_version": 1}))
    recipe = build_recipe(
        raw_recipe(Path(prepared.data.sources[0].paths[0]).parent), {**SETTINGS, "data_dir": str(data_dir)}
    )
    with pytest.raises(
        DataMismatchError, match=r"format_version expected 2, found 1.*hf-pretrain prepare --recipe smoke .*--data_dir"
    ):
        check_prepared_data(recipe, data_of(recipe))


def test_a_source_folder_from_another_tokenizer_is_refused_by_name(corpus, prepared, tmp_path) -> None:
    data_dir = tmp_path / "data"
    shutil.copytree(prepared.data.data_dir, data_dir)
    other = tmp_path / "other"
    save_tokenizer(train_tokenizer(["something else entirely " * 50], VOCAB, []), other)
    record = data_dir / "sources" / "01-notes" / "source.json"
    record.write_text(json.dumps(json.loads(record.read_text()) | {"tokenizer_hash": "f" * 64}))
    with pytest.raises(DataMismatchError, match=r"sources/01-notes: tokenized with another tokenizer"):
        check_prepared_data(*placed(recipe_for(corpus, data_dir)))


def test_a_token_past_the_vocabulary_is_refused_with_file_and_offset(corpus, prepared, tmp_path) -> None:
    data_dir = tmp_path / "data"
    shutil.copytree(prepared.data.data_dir, data_dir)
    (data_dir / VERIFIED_FILE).unlink(missing_ok=True)
    meta = read_meta(data_dir)
    entry = meta["sources"][0]["splits"]["train"]["files"][1]
    path = data_dir / entry["file"]
    tokens = np.fromfile(path, dtype=meta["dtype"])
    tokens[7] = VOCAB + 5
    tokens.tofile(path)
    with pytest.raises(DataMismatchError, match=rf"{path}: token id {VOCAB + 5} at token 7 \(byte offset 14\)"):
        check_prepared_data(*placed(recipe_for(corpus, data_dir)), verify="full")


def test_the_recipe_must_name_the_prepared_sources(corpus, prepared) -> None:
    recipe = recipe_for(corpus, Path(prepared.data.data_dir))
    recipe.data.sources = recipe.data.sources[:1]
    with pytest.raises(
        DataMismatchError, match=r"sources expected \['00-corpus\d*'\].*found \['00-corpus\d*', '01-notes'\]"
    ):
        check_prepared_data(recipe, data_of(recipe))


# ---------------------------------------------------------------------- the mixture
def test_block_counts_follow_the_weights_and_keep_every_source() -> None:
    assert block_counts([3.0, 1.0], 8) == [6, 2]
    assert block_counts([1.0, 1.0, 1.0], 10) == [4, 3, 3]
    assert block_counts([1.0, 1e-9], 16) == [15, 1]


def test_one_source_reads_exactly_the_single_stream_order() -> None:
    sampler = StepBatchSampler(10, 3, 2, 1, 0, seed=7)
    import torch

    positions = [i for batch in islice(sampler, 10) for i in batch]
    expected = [
        int(torch.randperm(10, generator=torch.Generator().manual_seed(7 + p // 10))[p % 10]) for p in range(30)
    ]
    assert positions == expected


def test_the_batches_follow_the_weights_then_the_decay_weights_from_the_decay_on() -> None:
    samples = [5000, 300, 800]  # the small source repeats: each epoch a fresh permutation
    mixture = Mixture(samples, seed=1, segments=[(0, [0.7, 0.2, 0.1]), (4096, [0.2, 0.2, 0.6])])
    before = [mixture.source_and_draw(p)[0] for p in range(4096)]
    after = [mixture.source_and_draw(p)[0] for p in range(4096, 8192)]
    for drawn, weights in ((before, [0.7, 0.2, 0.1]), (after, [0.2, 0.2, 0.6])):
        shares = np.bincount(drawn, minlength=3) / len(drawn)
        assert shares == pytest.approx(weights, abs=0.002)
    # any window of one global batch (32 samples) is within 2 samples of its share per source
    for start in range(0, 4096 - 32, 32):
        counts = np.bincount(before[start : start + 32], minlength=3)
        assert all(abs(c - 32 * w) <= 2 for c, w in zip(counts, [0.7, 0.2, 0.1], strict=True))
    # each source reads its samples in order of its own permutation, across the switch and epochs
    draws: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for p in range(8192):
        source, sample = mixture(p)
        draws[source].append(sample)
    for source, got in draws.items():
        n = samples[source]
        for epoch in range(len(got) // n):
            assert sorted(got[epoch * n : (epoch + 1) * n]) == list(range(n))
    assert mixture.draws_before(8192) == [len(draws[s]) for s in range(3)]


def test_the_mixture_is_a_pure_function_of_seed_step_and_world_size(prepared) -> None:
    """A resume at any step, inside the decay too, and two ranks, read exactly what one run reads."""
    mixture = build_mixture(prepared.data.sources, [900, 100], decay_position=64, seed=prepared.train.seed)
    one = StepBatchSampler(mixture, 2, 2, 1, 0, seed=5)
    stream = [i for batch in islice(one, 80) for i in batch]  # 40 steps x 4 samples
    for start in (0, 7, 16, 33):  # the decay starts at position 64 = step 16
        resumed = StepBatchSampler(
            build_mixture(prepared.data.sources, [900, 100], 64, seed=prepared.train.seed),
            2,
            2,
            1,
            0,
            seed=5,
            start_step=start,
        )
        assert [i for batch in islice(resumed, 10) for i in batch] == stream[start * 4 : start * 4 + 20]
    ranks = [
        StepBatchSampler(
            build_mixture(prepared.data.sources, [900, 100], 64, seed=prepared.train.seed), 2, 1, 2, r, seed=5
        )
        for r in (0, 1)
    ]
    two = [i for step in zip(*(islice(s, 40) for s in ranks), strict=True) for batch in step for i in batch]
    assert two == stream


# ---------------------------------------------------------------------- a real run
DECAYING = json.dumps(
    [
        {"kind": "builtin", "name": "python-docs", "weight": 0.1, "decay_weight": 0.9},
        {"kind": "builtin", "name": "python-stdlib", "weight": 0.9, "decay_weight": 0.1},
    ]
)
DECAY_RUN = {"sources": DECAYING, "lr_schedule": "wsd", "decay_fraction": 0.5, "log_interval": 1, "eval_interval": 0}


def source_tokens(run_dir: Path) -> list[tuple[int, float, dict]]:
    from hf_pretrain.run_folder.run_dir import read_jsonl

    return [
        (r["step"], r["loss"], r["source_tokens"])
        for r in read_jsonl(run_dir / "metrics.jsonl")
        if r["kind"] == "train"
    ]


@pytest.mark.slow
def test_a_run_draws_the_weights_then_the_decay_weights_also_resumed_inside_the_decay(smoke_data, tmp_path) -> None:
    """12 steps of 16 samples, the decay from step 7: 10% python-docs, then 90% (to within a sample or
    two per step); a run stopped at step 9 and resumed reads and computes exactly the same."""
    from tests.helpers import launch_training

    launch_training(smoke_data, tmp_path / "whole", **DECAY_RUN)
    whole = source_tokens(tmp_path / "whole")
    docs = [tokens["00-python-docs"] for _, _, tokens in whole]
    total = [sum(tokens.values()) for _, _, tokens in whole]
    assert docs[5] / total[5] == pytest.approx(0.1, abs=0.03)  # steps 1-6: the main weights
    assert (docs[11] - docs[5]) / (total[11] - total[5]) == pytest.approx(0.9, abs=0.03)  # 7-12: the decay's
    launch_training(smoke_data, tmp_path / "resumed", stop_at_step=9, save_interval=3, **DECAY_RUN)
    launch_training(smoke_data, tmp_path / "resumed", save_interval=3, **DECAY_RUN)
    assert source_tokens(tmp_path / "resumed") == whole


@pytest.mark.slow
def test_a_stop_request_cooldown_switches_to_the_decay_weights(smoke_data, tmp_path) -> None:
    """`hf-pretrain stop --cooldown_steps 4` read at step 1: steps 2-5 decay, on the decay mixture."""
    from hf_pretrain.run_folder.stop_request import request_stop
    from tests.helpers import launch_training

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    request_stop(run_dir, cooldown_steps=4)
    launch_training(smoke_data, run_dir, **DECAY_RUN)
    records = source_tokens(run_dir)
    assert [step for step, _, _ in records][-1] == 5
    docs = [tokens["00-python-docs"] for _, _, tokens in records]
    total = [sum(tokens.values()) for _, _, tokens in records]
    assert (docs[4] - docs[0]) / (total[4] - total[0]) == pytest.approx(0.9, abs=0.05)
