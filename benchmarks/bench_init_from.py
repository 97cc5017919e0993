"""What `init_from` costs each training process: host memory and time to copy a 1.1B base model's
weights into the freshly built model (model_init.py), against the model alone (a run from scratch).

    python benchmarks/bench_init_from.py [--dtype fp32|bf16] [--layers 22] [--dir /tmp]

The base is the `1b-continue` recipe's shape (TinyLlama 1.1B) with random weights, saved as one
model.safetensors. Each measurement runs in a fresh process; a thread samples /proc/self/status every
20 ms for the anonymous memory (what the process owns) and the file-backed memory (pages of the mapped
weights file, shared with every process of the machine through the page cache).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

GIB = 1024**3


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class Peaks(threading.Thread):
    """Peak anonymous and file-backed resident memory while it runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.anon = self.file = 0
        self.running = True

    def run(self) -> None:
        while self.running:
            self.anon = max(self.anon, status_kib("RssAnon") * 1024)
            self.file = max(self.file, status_kib("RssFile") * 1024)
            time.sleep(0.02)

    def stop(self) -> tuple[int, int]:
        self.running = False
        self.join()
        return self.anon, self.file


def make_base(folder: Path, layers: int, dtype: torch.dtype) -> None:
    from hf_pretrain.config import load_recipe
    from hf_pretrain.model.llama import build_model, llama_config

    recipe = load_recipe("1b-continue", {"num_hidden_layers": layers, "expected_params": 0})
    config = llama_config(recipe.model, recipe.data.vocab_size)
    config.architectures = ["LlamaForCausalLM"]
    build_model(config).to(dtype).save_pretrained(folder)


def measure(folder: str, what: str) -> dict:
    """In this process: build the model as `setup` does, then (`what` = init_from) copy the weights in."""
    from hf_pretrain.config import load_recipe
    from hf_pretrain.model.initialisation import load_base_weights, model_config, open_base
    from hf_pretrain.model.llama import build_model

    config_json = json.loads((Path(folder) / "config.json").read_text())
    overrides = {"init_from": folder, "tokenizer": folder, "num_hidden_layers": config_json["num_hidden_layers"]}
    recipe = load_recipe("1b-continue", {**overrides, "expected_params": 0})
    peaks = Peaks()
    peaks.start()
    started = time.perf_counter()
    model = build_model(model_config(recipe.model, tokenizer=None))
    built = time.perf_counter()
    if what == "init_from":
        load_base_weights(model, open_base(folder, weights=True))
    loaded = time.perf_counter()
    anon, file = peaks.stop()
    parameters = sum(p.numel() for p in model.parameters())
    return {
        "parameters": parameters,
        "model_gib": parameters * 4 / GIB,
        "build_s": built - started,
        "load_s": loaded - built,
        "peak_anon_gib": anon / GIB,
        "peak_file_gib": file / GIB,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="dtype of the saved base")
    parser.add_argument("--layers", type=int, default=22, help="decoder layers (TinyLlama has 22)")
    parser.add_argument("--dir", default=None, help="where the base folder is written")
    parser.add_argument("--measure", nargs=2, metavar=("FOLDER", "WHAT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        folder = Path(scratch) / "base"
        make_base(folder, args.layers, torch.float32 if args.dtype == "fp32" else torch.bfloat16)
        size = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / GIB
        print(f"base: {args.layers} layers, {args.dtype} safetensors of {size:.2f} GiB in {folder}")
        for what in ("scratch", "init_from"):
            out = subprocess.run(
                [sys.executable, __file__, "--measure", str(folder), what], capture_output=True, text=True, check=True
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"{what:9s}: {r['parameters'] / 1e9:.2f}B parameters ({r['model_gib']:.2f} GiB fp32) | build "
                f"{r['build_s']:.1f}s, copy {r['load_s']:.1f}s | peak anonymous {r['peak_anon_gib']:.2f} GiB, "
                f"peak file-backed {r['peak_file_gib']:.2f} GiB"
            )


if __name__ == "__main__":
    main()
