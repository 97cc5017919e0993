"""Time to the first step on a fresh machine, the store's part: what a start from a run URL and a data URL
waits for before its first step, against a plain copy of the same bytes from the same server.

    python benchmarks/bench_first_step.py --gb 12.5   # the 1b's checkpoint (weights + AdamW state, fp32)

Starts the tests' S3 server (moto, on localhost: `pip install -e '.[dev]'`), puts there a run whose newest
checkpoint is --gb GB (model.safetensors a third, optimizer.bin two thirds, the small files, a manifest;
the bytes generated) and a prepared data folder of random tokens (--data_mb), then times, with an empty
cache, what `train.py --output_dir s3://... --data_dir s3://...` does before its first step:
  - the pull (store/run/pull.py): the newest complete checkpoint, every file verified against its
    XXH3 in the manifest, then the run's small records;
  - the data's first micro-batch of the 1b's shape (seq_len 2048, 8 samples), its metadata and blocks
    fetched on demand (store/data/data_cache.py);
and against them one `s3fs.get` of the checkpoint folder, and of the data's metadata and first shards
followed by the same loader's first batch from that copy (its start-up is paid either way).
Prints a markdown table for docs/benchmarks.md; the goal is ours within 1.3x of the plain copy.
The model's build and the load of the pulled state into it come after and are not the store's.

    python benchmarks/bench_first_step.py --compile_cache [--data_dir data/smoke]   # issue 59

The compiler's part instead: the smoke recipe with `--compile true`, two sessions of one run, each in an
empty inductor cache of its own (a fresh machine): the first compiles from scratch and saves torch's compile
artifacts in the run folder (training/compile_cache.py), the second resumes and loads them. Their time to the
first step, as sessions.jsonl records it (from the process's start), and the first step's own part
(compiling included); the ratio without / with. The data: a prepared smoke folder (`hf-pretrain prepare
--recipe smoke`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/object_store_server.py, benchmarks/

CHUNK = 64 * 2**20


def generated_checkpoint(folder: Path, gigabytes: float) -> int:
    """A checkpoint of `gigabytes` in the layout the trainer writes; the bytes one random chunk repeated
    (fast to make; hashing and copying cost the same for any bytes). Its size in bytes."""
    from hf_pretrain.checkpoints.manifest import write_manifest

    folder.mkdir(parents=True)
    chunk, total = os.urandom(CHUNK), int(gigabytes * 1e9)
    for name, share in (("model.safetensors", 1 / 3), ("optimizer.bin", 2 / 3)):
        left = int(total * share)
        with (folder / name).open("wb") as f:
            while left > 0:
                left -= f.write(chunk[: min(CHUNK, left)])
    (folder / "random_states_0.pkl").write_bytes(os.urandom(15_000))
    (folder / "config.json").write_text("{}")
    (folder / "train_state.json").write_text('{"step": 1000}')
    write_manifest(folder)
    return sum(f.stat().st_size for f in folder.iterdir())


def first_batch_seconds(data_url: str) -> float:
    """Seconds from nothing to the first 1b-shaped micro-batch of `data_url`, the cache empty."""
    from benchmarks.bench_data_store import tokens_per_second
    from hf_pretrain.config import load_recipe

    shape = {"seq_len": 2048, "micro_batch_size": 8, "global_batch_tokens": 2048 * 8, "max_position_embeddings": 2048}
    _, first_at, _ = tokens_per_second(load_recipe("smoke", {"data_dir": data_url, **shape}), 1)
    return first_at


def measure(server, work: Path, gigabytes: float, data_mb: float) -> dict[str, float]:
    from benchmarks.bench_data_store import synthetic_data
    from hf_pretrain.store.data.data_upload import upload_prepared
    from hf_pretrain.store.run.pull import pull_run
    from hf_pretrain.store.urls import StoreURL, filesystem

    bucket = server.make_bucket("first-step")
    run_url, data_url = StoreURL.parse(f"{bucket}/run"), StoreURL.parse(f"{bucket}/data")
    fs = filesystem(run_url)
    step = work / "run" / "checkpoints" / "step_00001000"
    size = generated_checkpoint(step, gigabytes)
    fs.put(str(step), run_url.join("checkpoints", step.name).path, recursive=True)
    shutil.rmtree(work / "run")  # the disk holds one copy at a time: 12.5 GB is a quarter of a small VM's
    synthetic_data(work / "data", data_mb)
    upload_prepared(work / "data", data_url, fs, log=lambda _: None)

    os.environ["HF_PRETRAIN_HOME"] = str(work / "ours_home")  # an empty cache: a fresh machine
    t = time.perf_counter()
    assert pull_run(fs, run_url, work / "ours", say=lambda _: None) == 1000
    pull_s = time.perf_counter() - t
    shutil.rmtree(work / "ours")
    data_s = first_batch_seconds(str(data_url))

    t = time.perf_counter()
    fs.get(run_url.join("checkpoints", step.name).path, str(work / "plain"), recursive=True)
    plain_pull_s = time.perf_counter() - t
    shutil.rmtree(work / "plain")
    # the plain way to the same first batch: the data's metadata and the first shard of each source
    # copied whole, then the same loader reading the copy (its start-up is paid either way)
    t = time.perf_counter()
    names = ["meta.json", "tokenizer/tokenizer.json"]
    for source in ("00-python-docs", "01-python-stdlib"):
        names += [f"sources/{source}/{name}" for name in ("source.json", "train/00000.ds", "train/00000.ds.index")]
    fs.get([data_url.join(n).path for n in names], [str(work / "plain_data" / n) for n in names])
    plain_data_s = time.perf_counter() - t + first_batch_seconds(str(work / "data"))
    return {"bytes": size, "pull": pull_s, "data": data_s, "plain_pull": plain_pull_s, "plain_data": plain_data_s}


def compiled_session(data_dir: Path, work: Path, n: int, stop_at: int) -> dict:
    """One session of the compiled smoke run in `work/run`, in an empty inductor cache of its own: its
    sessions.jsonl `first_step` record, and its log's compile cache line."""
    import subprocess

    from hf_pretrain.run_folder.sessions import sessions

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env.update(TORCHINDUCTOR_CACHE_DIR=str(work / f"inductor{n}"), TRITON_CACHE_DIR=str(work / f"triton{n}"))
    command = [sys.executable, str(root / "hf_pretrain" / "train.py"), "--recipe", "smoke", "--compile", "true"]
    command += ["--data_dir", str(data_dir), "--output_dir", str(work / "run"), "--stop_at_step", str(stop_at)]
    command += ["--report_to", "none", "--log_interval", "1"]
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"session {n} failed ({done.returncode}):\n{log[-3000:]}")
    said = next(
        (line.split("compile cache: ", 1)[1][:60] for line in log.splitlines() if "compile cache: " in line), ""
    )
    return {**sessions(work / "run")[-1].first_step, "said": said}


def compile_cache_rows(data_dir: Path) -> None:
    """The compiler's part of a relaunch, without and with the saved artifacts (issue 59)."""
    import platform

    import torch

    work = Path(tempfile.mkdtemp(prefix="bench_compile_cache_"))
    try:
        without = compiled_session(data_dir, work, 1, stop_at=1)
        size = sum(p.stat().st_size for p in (work / "run" / "compile_cache").glob("*.bin"))
        with_ = compiled_session(data_dir, work, 2, stop_at=2)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"smoke, --compile true, empty inductor cache; {os.cpu_count()} cores, {platform.processor() or 'cpu'}, ")
    print(f"torch {torch.__version__}; {time.strftime('%Y-%m-%d')}; artifacts {size / 1e6:.1f} MB\n")
    print("| smoke --compile true, empty inductor cache | without artifacts (s) | with (s) | without / with |")
    print("|---|---:|---:|---:|")
    a, b = without["to_first_step_s"], with_["to_first_step_s"]
    print(f"| to the first step, from the process's start | {a:.1f} | {b:.1f} | **{a / b:.2f}** |")
    a, b = without["went_to"]["first_step"], with_["went_to"]["first_step"]
    print(f"| the first step itself (compiling included) | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    print(f"| loading the artifacts | - | {with_['went_to'].get('compile_cache', 0):.2f} | |")
    print(f"\nsession 1: {without['said']}...\nsession 2: {with_['said']}...")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=12.5, help="the checkpoint's size in GB (the 1b's: 12.5)")
    parser.add_argument("--data_mb", type=float, default=64, help="the prepared data's size in MB (random tokens)")
    parser.add_argument(
        "--compile_cache", action="store_true", help="time the first compiled step without and with saved artifacts"
    )
    parser.add_argument("--data_dir", default="data/smoke", help="--compile_cache: a prepared smoke data folder")
    args = parser.parse_args()
    if args.compile_cache:
        if not (Path(args.data_dir) / "meta.json").is_file():
            raise SystemExit(f"{args.data_dir} holds no prepared data: `hf-pretrain prepare --recipe smoke` first")
        compile_cache_rows(Path(args.data_dir).resolve())
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging

    from tests.object_store_server import running_s3_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    work = Path(tempfile.mkdtemp(prefix="bench_first_step_"))
    try:
        with running_s3_server() as server:
            os.environ.update(server.env)
            m = measure(server, work, args.gb, args.data_mb)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ours, plain = m["pull"] + m["data"], m["plain_pull"] + m["plain_data"]
    print(
        f"| {m['bytes'] / 1e9:.1f} GB checkpoint + {args.data_mb:g} MB data, moto on localhost | hf-pretrain (s) "
        "| plain s3fs.get (s) | ours / plain |"
    )
    print("|---|---:|---:|---:|")
    print(
        f"| newest checkpoint (ours: + XXH3 of every file, records) | {m['pull']:.1f} | {m['plain_pull']:.1f} "
        f"| {m['pull'] / m['plain_pull']:.2f} |"
    )
    print(
        f"| data's first micro-batch, 8 x 2048 (ours: blocks on demand) | {m['data']:.2f} | {m['plain_data']:.2f} "
        f"| {m['data'] / m['plain_data']:.2f} |"
    )
    print(f"| to the first step, the store's part | {ours:.1f} | {plain:.1f} | {ours / plain:.2f} |")
    print(f"\npull rate {m['bytes'] / m['pull'] / 1e6:,.0f} MB/s; plain {m['bytes'] / m['plain_pull'] / 1e6:,.0f} MB/s")


if __name__ == "__main__":
    main()
