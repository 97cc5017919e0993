"""Upload and download of a checkpoint-sized state through the run's uploader, against plain s3fs.

    python benchmarks/bench_store.py --mb 200

Starts the tests' S3 server (moto, on localhost: `pip install -e '.[dev]'`), writes a fake checkpoint
(model.safetensors + optimizer.bin of --mb MB in all, the small files, a manifest), then times:
the uploader (store/run/uploader.py: parallel files, manifest last) against one `s3fs.put` of
the same folder, and the pull (store/run/pull.py: download + checksum verification) against one
`s3fs.get`. Prints a markdown table for docs/benchmarks.md. The ratio is plain time / ours (>= 0.9 wanted).

Then the step time of a tiny Llama (forward, backward, AdamW) with no upload, and with the same
checkpoint's upload in flight, the store a moto server in a process of its own (a store is not in
the trainer's interpreter): training waits only for the staging (`Uploader.submit`: hard links), so
the steps taken while the upload runs should cost no more in all than that staging would.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
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
    parser.add_argument("--steps", type=int, default=40, help="steps timed without an upload")
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
    print()
    work = Path(tempfile.mkdtemp(prefix="bench_store_steps_"))
    try:
        s = measure_steps(work, args.mb, args.steps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"| tiny Llama step, {args.mb} MB upload, moto in its own process | median step (ms) |")
    print("|---|---|")
    print(f"| no upload | {s['none_ms']:.1f} |")
    print(f"| upload in flight ({s['steps']} steps over {s['upload_s']:.1f} s) | {s['flight_ms']:.1f} |")
    print(f"| ratio in flight / none | {s['flight_ms'] / s['none_ms']:.2f} |")
    print(f"| the same upload by another process ({s['apart_steps']} steps) | {s['apart_ms']:.1f} |")
    print(
        f"\nstaging (submit: hard links) {s['staging_s'] * 1000:.1f} ms; the steps in flight took "
        f"{s['extra_s'] * 1000:.0f} ms more in all than as many steps without an upload"
    )


def measure(server, work: Path, megabytes: int) -> list[tuple[str, float, float]]:
    from hf_pretrain.store.run.pull import pull_run
    from hf_pretrain.store.run.uploader import Uploader
    from hf_pretrain.store.urls import StoreURL, filesystem

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


def tiny_training_step():
    """One step of a tiny Llama (2 layers, width 128, 8 x 128 tokens): forward, backward, AdamW."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
    )
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(0, 1024, (8, 128))

    def step() -> float:
        started = time.perf_counter()
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    return step


def measure_steps(work: Path, megabytes: int, steps: int) -> dict[str, float]:
    import statistics

    from hf_pretrain.store.run.uploader import Uploader
    from hf_pretrain.store.urls import StoreURL, filesystem
    from tests.object_store_server import running_authenticating_s3_server

    run = work / "run"
    folder = run / "checkpoints" / "step_00000001"
    fake_checkpoint(folder, megabytes)
    step = tiny_training_step()
    for _ in range(5):  # warm-up: allocator, kernels
        step()
    none = [step() for _ in range(steps)]
    with running_authenticating_s3_server(check_keys=False) as server:
        os.environ.update(server.env(server.writer))
        url = StoreURL.parse(f"{server.bucket}/run")
        uploader = Uploader(filesystem(url), url, run, keep=2, say=lambda _: None)
        started = time.perf_counter()
        uploader.submit(folder, 1)  # what training waits for
        staging = time.perf_counter() - started
        flight = []
        while not uploader.idle():
            flight.append(step())
        upload_s = time.perf_counter() - started
        assert uploader.progress.last_step == 1, uploader.progress.last_error
        uploader.close()
        # the same bytes sent by another process (plain s3fs): what the machine's cores alone cost the step
        code = (
            "import s3fs, sys; s3fs.S3FileSystem(skip_instance_cache=True)"
            ".put(sys.argv[1], sys.argv[2], recursive=True)"
        )
        target = url.join("other_process").path
        sender = subprocess.Popen([sys.executable, "-c", code, str(folder), target], env=os.environ.copy())
        apart = []
        while sender.poll() is None:
            apart.append(step())
        assert sender.returncode == 0
    none_ms, flight_ms = 1000 * statistics.median(none), 1000 * statistics.median(flight)
    extra = sum(flight) - len(flight) * statistics.median(none)
    return {
        "none_ms": none_ms,
        "flight_ms": flight_ms,
        "steps": len(flight),
        "upload_s": upload_s,
        "staging_s": staging,
        "extra_s": extra,
        "apart_ms": 1000 * statistics.median(apart) if apart else float("nan"),
        "apart_steps": len(apart),
    }


if __name__ == "__main__":
    main()
