"""Checkpoint cost of a 1b-shaped training state (fp32 weights + AdamW moments, ~12.5 GB) on this
machine, in seconds per GB: writing (Accelerate's `save_state`, and the product's one-pass writer that
checksums and flushes as it writes: checkpoints/tensor_files.py), checksumming by reading back
(SHA-256, as seals did before; XXH3-128, what a `save_state` under FSDP still needs), flushing (fsync),
and verifying a checkpoint (what a resume reads). Then what the training thread waits for: the save
inline; sealed in the background (checkpoints/saving.py); staged (checkpoints/async_save.py: the loop
stalls for the copy); and a stop (the last save) while the previous periodic save is still writing.

    python benchmarks/bench_checkpoint.py [--layers 16] [--dir /tmp]    # --layers 8 halves the state

The state is random (not zeros, which the kernel would not even copy), built on the meta device and
filled in place, so the peak memory is the state itself plus what the writers buffer.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from accelerate import Accelerator
from transformers import LlamaConfig, LlamaForCausalLM

from hf_pretrain.checkpoints.async_save import HostStage
from hf_pretrain.checkpoints.checksum import file_checksum
from hf_pretrain.checkpoints.layout import checkpoint_path
from hf_pretrain.checkpoints.manifest import verify_checkpoint
from hf_pretrain.checkpoints.saving import save_checkpoint
from hf_pretrain.config import load_recipe


def one_b_state(layers: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, LlamaConfig]:
    m = load_recipe("1b").model
    config = LlamaConfig(
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_key_value_heads,
        vocab_size=32064,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.to_empty(device="cpu")
    model.tie_weights()  # the output head shares the embedding, as in the recipe (to_empty untied it)
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        with torch.no_grad():
            p.normal_(0, 0.02, generator=generator)
        optimizer.state[p] = {
            "step": torch.tensor(1.0),
            "exp_avg": torch.randn(p.shape, generator=generator),
            "exp_avg_sq": torch.rand(p.shape, generator=generator),
        }
    return model, optimizer, config


def hash_and_flush(folder: Path) -> tuple[float, float, float]:
    """Seconds to checksum every file by reading it back, SHA-256 and XXH3-128, then to fsync them."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    timings = []
    for algorithm in ("sha256", "xxh3_128"):
        start = time.perf_counter()
        for p in files:
            file_checksum(p, algorithm)
        timings.append(time.perf_counter() - start)
    start = time.perf_counter()
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return timings[0], timings[1], time.perf_counter() - start


def longest_gap(done: Callable[[], bool]) -> float:
    """The longest time between two iterations of a loop of small tensor ops, until `done()`."""
    x, gap, last = torch.ones(64), 0.0, time.perf_counter()
    while not done():
        x.add_(1)
        now = time.perf_counter()
        gap, last = max(gap, now - last), now
    return gap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=16, help="decoder layers (the 1b recipe has 16)")
    parser.add_argument("--dir", default=None, help="where to write (default: the temp folder)")
    parser.add_argument(
        "--step_seconds",
        type=float,
        default=2.2,
        help="seconds per optimizer step of the 1b recipe (the published run: ~2.2 s for 131,072 tokens on an A100)",
    )
    parser.add_argument("--save_interval", type=int, default=load_recipe("1b").checkpoints.save_interval)
    parser.add_argument("--repeats", type=int, default=2, help="saves of each kind")
    args = parser.parse_args()
    model, optimizer, config = one_b_state(args.layers)
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    state_gb = sum(p.numel() for p in model.parameters()) * 4 * 3 / 1e9
    results = {"layers": args.layers, "state_gb": round(state_gb, 2)}
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        folder = Path(scratch) / "state"
        start = time.perf_counter()
        accelerator.save_state(str(folder), safe_serialization=True)
        results["write_s"] = time.perf_counter() - start
        results["hash_sha256_s"], results["hash_xxh3_s"], results["fsync_s"] = hash_and_flush(folder)
        written = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e9
        results["written_gb"] = round(written, 2)
        shutil.rmtree(folder)
        # the product's writer: every byte checksummed and flushed on its way (no read-back, no fsync after)
        folder.mkdir()
        start = time.perf_counter()
        HostStage().stage(accelerator, folder, in_buffers=False).write()
        results["write_checksummed_flushed_s"] = time.perf_counter() - start
        shutil.rmtree(folder)
        # the real save, inline, with the seal in the background, and staged (the write in the
        # background too), alternately (the page cache's writeback of one save slows the next): what the
        # training thread waits for, and when the checkpoint is sealed, median of the repeats
        stage = HostStage()  # the host buffers a run keeps: allocated by its first save
        kinds = {"inline": (False, None), "background": (True, None), "staged": (True, stage)}
        timings: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            for kind, (background, staging) in kinds.items():
                run = Path(scratch) / f"run_{kind}"
                start = time.perf_counter()
                pending = save_checkpoint(
                    accelerator,
                    run,
                    {"step": 1},
                    keep=1,
                    model_config=config,
                    tokenizer=_StandInTokenizer(),
                    background=background,
                    stage=staging,
                )
                timings.setdefault(f"training_thread_s_{kind}", []).append(time.perf_counter() - start)
                pending.wait()
                timings.setdefault(f"sealed_after_s_{kind}", []).append(time.perf_counter() - start)
                shutil.rmtree(run)
        results |= {name: statistics.median(values) for name, values in timings.items()}
        # a stop while the previous periodic save is still being written: the last save, complete
        run = Path(scratch) / "run_stop"
        start = time.perf_counter()
        periodic = save_checkpoint(
            accelerator, run, {"step": 1}, 2, config, _StandInTokenizer(), background=True, stage=stage
        )
        save_checkpoint(accelerator, run, {"step": 2}, 2, config, _StandInTokenizer(), previous=periodic)
        results["stop_with_a_save_in_flight_s"] = time.perf_counter() - start
        # what a resume reads: every file of a checkpoint checked against its manifest
        start = time.perf_counter()
        verify_checkpoint(checkpoint_path(run, 2))
        results["verify_s"] = time.perf_counter() - start
        shutil.rmtree(run)
        results["first_staged_s"] = timings["training_thread_s_staged"][0]  # the buffers allocated
        # the writing thread must not hold the GIL: the longest pause of a loop of small tensor ops
        # (a training loop's Python) while a staged save is written, against the same loop idle
        idle_until = time.perf_counter() + 2.0
        results["loop_gap_s_idle"] = longest_gap(lambda: time.perf_counter() > idle_until)
        pending = save_checkpoint(
            accelerator,
            Path(scratch) / "run_gap",
            {"step": 1},
            keep=1,
            model_config=config,
            tokenizer=_StandInTokenizer(),
            background=True,
            stage=stage,
        )
        results["loop_gap_s_while_writing"] = longest_gap(pending.done)
        pending.wait()
        results["repeats"] = args.repeats
    for key in ("write_s", "write_checksummed_flushed_s", "hash_sha256_s", "hash_xxh3_s", "fsync_s", "verify_s"):
        results[key[:-2] + "_s_per_gb"] = results[key] / written
    interval_s = args.save_interval * args.step_seconds
    for key in ("training_thread_s_inline", "training_thread_s_background", "training_thread_s_staged"):
        results[key.replace("training_thread_s", "share_of_step_time")] = results[key] / interval_s
    results["save_interval"], results["interval_s"] = args.save_interval, interval_s
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in results.items()}, indent=1))


class _StandInTokenizer:
    """The checkpoint's tokenizer files are a few MB at most: not what this measures."""

    def save_pretrained(self, folder: Path) -> None:
        (Path(folder) / "tokenizer.json").write_text("{}")


if __name__ == "__main__":
    main()
