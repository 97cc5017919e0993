"""Upload and download of a checkpoint-sized state through the run's uploader, against plain s3fs.

    python benchmarks/bench_store.py --mb 200

Starts the tests' S3 server (moto, on localhost: `pip install -e '.[dev]'`), writes a fake checkpoint
(model.safetensors + optimizer.bin of --mb MB in all, the small files, a manifest), then times:
the uploader (object_store/uploader.py: parallel files, manifest last) against one `s3fs.put` of
the same folder, and the pull (object_store/pull.py: download + checksum verification) against one
`s3fs.get`. Prints a markdown table for docs/benchmarks.md. The ratio is plain time / ours (>= 0.9 wanted).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def fake_checkpoint(folder: Path, megabytes: int) -> None:
    from hf_pretrain.checkpoints.manifest import write_manifest

    folder.mkdir(parents=True)
    third = megabytes * 1_000_000 // 3
    (folder / "model.safetensors").write_bytes(os.urandom(third))
    (folder / "optimizer.bin").write_bytes(os.urandom(2 * third))
    (folder / "random_states_0.pkl").write_bytes(os.urandom(15_000))
    (folder / "config.json").write_text("{}")
    (folder / "train_state.json").write_text('{"step": 1}')
    write_manifest(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=200, help="checkpoint size in MB")
    args = parser.parse_args()
    from tests.object_store_server import running_s3_server

    work = Path(tempfile.mkdtemp(prefix="bench_store_"))
    try:
        with running_s3_server() as server:
            os.environ.update(server.env)
            import logging

            logging.getLogger("werkzeug").setLevel(logging.ERROR)
            rows = measure(server, work, args.mb)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"| {args.mb} MB checkpoint, moto on localhost | hf-pretrain (s) | plain s3fs (s) | plain / ours |")
    print("|---|---|---|---|")
    for what, ours, plain in rows:
        print(f"| {what} | {ours:.2f} | {plain:.2f} | {plain / ours:.2f} |")


def measure(server, work: Path, megabytes: int) -> list[tuple[str, float, float]]:
    from hf_pretrain.object_store.pull import pull_run
    from hf_pretrain.object_store.uploader import Uploader
    from hf_pretrain.object_store.urls import StoreURL, filesystem

    run = work / "run"
    step = run / "checkpoints" / "step_00000001"
    fake_checkpoint(step, megabytes)
    url = StoreURL.parse(server.make_bucket("bench") + "/run")
    fs = filesystem(url)

    t = time.perf_counter()
    uploader = Uploader(fs, url, run, keep=2, say=lambda _: None)
    uploader.submit(step, 1)
    assert uploader.wait(600)
    ours_up = time.perf_counter() - t
    uploader.close()
    t = time.perf_counter()
    fs.put(str(step), url.join("plain", step.name).path, recursive=True)
    plain_up = time.perf_counter() - t

    t = time.perf_counter()
    assert pull_run(fs, url, work / "pulled", say=lambda _: None) == 1
    ours_down = time.perf_counter() - t
    t = time.perf_counter()
    fs.get(url.join("plain", step.name).path, str(work / "plain_get"), recursive=True)
    plain_down = time.perf_counter() - t
    return [
        ("upload (ours: parallel files, manifest last)", ours_up, plain_up),
        ("download (ours: + XXH3 verification)", ours_down, plain_down),
    ]


if __name__ == "__main__":
    main()
