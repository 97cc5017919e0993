"""One variant of a recipe: a short run of the real training loop (`hf_pretrain.train.run_training`) in its
own process, and what it measured.

A child process per run: Accelerate's state is a process singleton, and a fresh process also gives
each variant a clean peak-memory count. The child is `python -m hf_pretrain.bench --worker_result
FILE`, which trains here (`run_in_this_process`) and writes a `RunResult`.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from hf_pretrain.config import Recipe, RecipeError, build_recipe, save_recipe
from hf_pretrain.economics.measurements import RECORD_ENV, timed_throughput
from hf_pretrain.formatting import formatted
from hf_pretrain.machine.hardware import peak_memory_gib
from hf_pretrain.machine.run_profile import device_kind
from hf_pretrain.model.llama import model_flops_per_token
from hf_pretrain.preflight.checks import MEMORY_PROBE_ENV
from hf_pretrain.run_folder.run_dir import RunDir, read_jsonl


def process_peak_memory_gib(device: torch.device) -> float:
    """This process's peak: CUDA memory allocated by torch, or resident set size on the CPU (where
    nothing runs out of memory, so the RSS is what a budget is held against)."""
    cuda_peak = peak_memory_gib(device)
    if cuda_peak is not None:
        return cuda_peak
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / 2**30 if sys.platform == "darwin" else rss / 2**20


@dataclass
class RunResult:
    """What a worker process reports about one short training run."""

    status: str  # ok | oom (ran out of memory on the device) | preflight | failed
    message: str = ""
    peak_memory_gib: float | None = None  # CUDA max allocated (at the error, for oom), or the peak RSS on CPU


@dataclass
class VariantResult:
    name: str
    overrides: dict[str, Any]  # recipe keys this variant changes
    status: str
    message: str = ""
    flops_per_token: float | None = None
    tokens_per_s: float | None = None
    step_seconds: float | None = None
    mfu: float | None = None  # against the datasheet bf16 peak (GPUs in machine/gpus.yaml)
    mfu_measured_peak: float | None = None  # against the matmul rate measured in this run
    peak_memory_gib: float | None = None
    data_wait_share: float | None = None  # None when the run's metrics do not log it
    usd_per_billion_tokens: dict[str, float] = field(default_factory=dict)  # measured: this GPU's price entry only
    # the table's other GPUs: the performance model's figure scaled by this card's measured / modelled
    usd_per_billion_tokens_estimated: dict[str, float] = field(default_factory=dict)
    measured_to_modelled: float | None = None
    speedup_vs_recipe: float | None = None


# ---------------------------------------------------------------------- naming the variants
def variant_grid(specs: list[str]) -> list[dict[str, str]]:
    """`["compile=true,false", "micro_batch_size=4,8"]` -> every combination, as override dicts."""
    axes: list[tuple[str, list[str]]] = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or not key or not values:
            raise RecipeError(f"--variants {spec!r} must look like KEY=VALUE[,VALUE...], e.g. compile=true,false")
        # a recipe key in either spelling, as its flag reads (`micro-batch-size` is `micro_batch_size`)
        axes.append((key.replace("-", "_"), [v.strip() for v in values.split(",") if v.strip()]))
    keys = [key for key, _ in axes]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(values for _, values in axes))]


def recipe_value(value: Any) -> str:
    """A value the way a recipe or the command line spells it (`true`, not `True`)."""
    return json.dumps(value) if isinstance(value, bool) else str(value)


def variant_name(overrides: dict[str, Any]) -> str:
    return " ".join(f"{k}={recipe_value(v)}" for k, v in overrides.items()) or "recipe as written"


def short_run_overrides(steps: int, warmup_steps: int, output_dir: Path) -> dict[str, Any]:
    """A short timed run: no evaluation, one checkpoint at the end, a metrics line per step."""
    return {
        "max_steps": steps,
        "warmup_steps": warmup_steps,
        "eval_interval": 0,
        "save_interval": steps,
        "log_interval": 1,
        "resume": "none",
        "report_to": "none",
        "output_dir": str(output_dir),
        "stop_at_step": 0,
        "milestone_interval": 0,
        "keep_checkpoints": 1,
        "phases": {},
        "early_stop_cost_per_loss_point": 0.0,
        "early_stop_patience": 0,
    }


# ---------------------------------------------------------------------- running one
class DeviceMemory:
    """The device's allocator as a short run sees it: the peak so far, and handing memory back."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def peak_gib(self) -> float | None:
        return process_peak_memory_gib(self.device)

    def release(self) -> None:
        """Free what a failed run left (its model and optimizer went with the error's frames), empty the
        allocator's cache and reset the peak, so what runs next is measured on an empty device."""
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)


def is_out_of_memory(error: BaseException) -> bool:
    """torch's OutOfMemoryError, or an error that carries one (compiled graphs and some kernels wrap it,
    or report it as a plain RuntimeError)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, torch.OutOfMemoryError) or "out of memory" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def try_on_device(train: Callable[[], Any], memory: DeviceMemory) -> RunResult:
    """Run `train()` (a `run_training` of one recipe); running out of memory is an answer, "oom" with the
    memory in use when it happened, and the memory is handed back after it."""
    from hf_pretrain.preflight.result import PreflightError

    try:
        outcome = train()
        result = RunResult("ok" if outcome.exit_code == 0 else "failed", outcome.message)
    except PreflightError as exc:
        result = RunResult("preflight", str(exc))
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        result = RunResult("oom", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    result.peak_memory_gib = memory.peak_gib()
    if result.status == "oom":
        memory.release()
    return result


def run_in_this_process(recipe: Recipe, result_path: Path) -> int:
    """Train `recipe` here and write a RunResult; what `--worker_result` runs in each child."""
    from hf_pretrain.train import run_training

    device = torch.device("cuda" if device_kind() == "cuda" else "cpu")
    result = try_on_device(lambda: run_training(recipe), DeviceMemory(device))
    result_path.write_text(json.dumps(asdict(result)))
    return 0


def run_in_child(recipe: Recipe, folder: Path, keep_weights: bool = False) -> RunResult:
    """Run `recipe` in a fresh process; its log, recipe and result stay in `folder`; its checkpoints
    too with `keep_weights` (a run that goes further from them)."""
    folder.mkdir(parents=True, exist_ok=True)
    recipe_file, result_file, log_file = folder / "recipe.yaml", folder / "result.json", folder / "log.txt"
    save_recipe(recipe, recipe_file)
    result_file.unlink(missing_ok=True)
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding hf_pretrain/
    env = dict(
        os.environ,
        TOKENIZERS_PARALLELISM="false",
        # the device answers whether it fits, not the memory estimate; the bench records what it measured
        **{MEMORY_PROBE_ENV: "1", RECORD_ENV: "0"},
        PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
    )
    command = [
        sys.executable,
        "-m",
        "hf_pretrain.bench",
        "--recipe",
        str(recipe_file),
        "--worker_result",
        str(result_file),
    ]
    with log_file.open("w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    # A checkpoint of a 1B model is 12 GB: keep the metrics, drop the weights.
    run = RunDir(recipe.train.output_dir)
    for heavy in () if keep_weights else (run.checkpoints, run.final):
        shutil.rmtree(heavy, ignore_errors=True)
    if result_file.exists():
        return RunResult(**json.loads(result_file.read_text()))
    tail = log_file.read_text()[-2000:]
    if code in (-9, 137):  # SIGKILL: on Linux, most often the kernel's out-of-memory killer
        return RunResult("oom", f"killed (exit {code}), probably out of memory; see {log_file}")
    return RunResult("failed", f"exit {code}; see {log_file}:\n{tail}")


def variant_result(overrides: dict[str, Any], run: RunResult, metrics: Path, warmup: int) -> VariantResult:
    """What the short run of the variant `overrides` measured: how it ended (`run_in_child`), and its
    throughput from its `metrics` (metrics.jsonl), the first `warmup` steps left out."""
    # the memory of a variant that never trained (refused by preflight, failed) is the child's setup, no
    # figure of the variant; an out-of-memory one's is what it held when it ran out
    trained = run.status in ("ok", "oom")
    result = VariantResult(
        variant_name(overrides),
        overrides,
        run.status,
        run.message,
        peak_memory_gib=run.peak_memory_gib if trained else None,
    )
    timed = timed_throughput(read_jsonl(metrics), warmup)
    if run.status == "ok" and timed:
        result.tokens_per_s, result.step_seconds, result.data_wait_share = timed
        result.message = ""
    elif run.status == "ok":
        result.status, result.message = "failed", "no train records after the warm-up steps"
    return result


class VariantRunner:
    """Runs variants of one recipe with the same short-run settings, numbering their folders in `out`."""

    def __init__(self, recipe: Recipe, out: Path, steps: int, warmup: int, say: Callable[[str], None]) -> None:
        self.recipe, self.out, self.warmup, self.say = recipe, out, warmup, say
        self.short_run = short_run_overrides(steps, min(recipe.optim.warmup_steps, steps - 1), out)
        self.results: list[VariantResult] = []
        self._settings: list[dict[str, Any]] = []  # micro-batch and checkpointing of each one run

    def run(self, overrides: dict[str, Any]) -> VariantResult:
        index = len(self.results)
        folder = self.out / "variants" / f"{index:02d}"
        try:
            variant = build_recipe(
                self.recipe.to_dict(), {**self.short_run, "output_dir": str(folder / "run"), **overrides}
            )
        except RecipeError as exc:
            result = VariantResult(variant_name(overrides), overrides, "invalid", str(exc))
        else:
            self.say(f"variant {index}: {variant_name(overrides)}")
            run = run_in_child(variant, folder)
            result = variant_result(overrides, run, RunDir(variant.train.output_dir).metrics, self.warmup)
            result.flops_per_token = model_flops_per_token(variant.model, variant.data)[1]
            if result.status in ("ok", "oom"):
                self.say(
                    f"  {result.status}: {formatted(result.tokens_per_s, ',.0f')} tokens/s, "
                    f"peak memory {formatted(result.peak_memory_gib, '.2f')} GiB"
                )
            else:  # why it did not train, on the screen (not only in bench.json)
                self.say(f"  did not train ({result.status}): " + "\n    ".join(result.message.splitlines()))
            # compared by what runs: the micro-batch and how many layers recompute, however spelled
            self._settings.append(
                {
                    "micro_batch_size": variant.train.micro_batch_size,
                    "checkpointed_layers": variant.checkpointed_layer_count,
                }
            )
        self.results.append(result)
        return result

    def is_the_recipe(self, overrides: dict[str, Any]) -> bool:
        """Whether the variant `overrides` changes nothing (it is the baseline, run first); an invalid one
        changes something (it is run, and refused with its reason)."""
        try:
            changed = build_recipe(self.recipe.to_dict(), overrides)
        except RecipeError:
            return False
        return all(changed.value(key) == self.recipe.value(key) for key in overrides)

    def has_run(self, settings: dict[str, Any]) -> bool:
        return settings in self._settings
