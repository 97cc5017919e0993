"""The recipe on each GPU of the table: how it fits (the memory estimate), its rate (a recorded measurement,
else the performance model), what the run costs; every GPU ranked by the run's dollars (`plan --gpu all`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hf_pretrain.config import DataConfig, ModelConfig, StepAsWritten, TrainConfig
from hf_pretrain.economics.cost import dollars_per_billion_tokens
from hf_pretrain.economics.measurements import configuration, recorded_measurement
from hf_pretrain.economics.memory import Fit, fit_in_memory
from hf_pretrain.economics.performance import modelled_tokens_per_s
from hf_pretrain.economics.prices import table_gpu_prices
from hf_pretrain.economics.workload import run_workload
from hf_pretrain.machine.gpus import GPU, gpu_table
from hf_pretrain.machine.run_profile import Step
from hf_pretrain.machine.what_if import profile_on
from hf_pretrain.model.llama import tokenizer_size_of


@dataclass(frozen=True)
class GpuRow:
    """The recipe on one GPU: how it fits, the modelled rate (an estimate), what the run costs."""

    gpu: str
    fits: bool
    micro_batch_size: int | None
    checkpointed_layers: int | None
    tokens_per_s: float | None  # the performance model's, for one GPU
    price_per_gpu_hour: float
    usd_per_billion_tokens: float | None
    hours: float | None  # the recipe's tokens on one GPU
    usd: float | None
    reason: str  # the fit, or why nothing fits
    measured: str | None = None  # where tokens/s is a recorded measurement: which (economics/measurements.py)


def quality_per_token(step: Step) -> float:
    """How much of a bf16 token one token of the step's precision is worth (FP8: measured on a proxy,
    precisions.py)."""
    return step.precision_facts.quality_per_token


def gpu_row(
    gpu: GPU,
    tokens: float,
    price: float,
    pinned: tuple[str, ...] = (),
    *,
    model: ModelConfig,
    data: DataConfig,
    train: TrainConfig,
    written: StepAsWritten,
) -> GpuRow:
    """Fit the recipe's `model`, `data`, `train` and step as `written` on `gpu` (keeping the `pinned` recipe
    keys as they are), model its rate for the step (compile, Liger, optimizer, precision), price the run.
    FP8 runs are charged for the tokens that match the bf16 run's (`quality_per_token`)."""
    profile = profile_on(written, gpu)  # a what-if: the recipe on this card of the table
    step = profile.step
    precision = step.precision_facts
    if profile.machine.refusal(precision):
        needs = f"{precision.name} needs {precision.compute_capability}+"
        reason = f"no {precision.name.upper()}: compute capability {gpu.compute_capability:.1f} ({needs})"
        return GpuRow(gpu.name, False, None, None, None, price, None, None, None, reason)
    layers = written.checkpointed_layers if {"gradient_checkpointing", "checkpointed_layers"} & set(pinned) else None
    size = written.micro_batch_size if "micro_batch_size" in pinned else None
    fit: Fit = fit_in_memory(
        model,
        train,
        step,
        seq_len=data.seq_len,
        tokenizer_size=tokenizer_size_of(data),
        memory_bytes=gpu.memory_bytes,
        micro_batch_size=size,
        checkpointed_layers=layers,
    )
    if not fit.fits:
        return GpuRow(gpu.name, False, None, None, None, price, None, None, None, fit.reason)
    fitted = profile_on(written, gpu, 1, fit.micro_batch_size, fit.checkpointed_layers).step
    batch = train.global_batch_tokens
    # what this configuration measured on this GPU wins
    measured = recorded_measurement(configuration(model, data, fitted, global_batch_tokens=batch), gpu.name)
    rate = measured.tokens_per_s if measured else modelled_tokens_per_s(run_workload(model, data, fitted, batch), gpu)
    hours = tokens / quality_per_token(step) / rate / 3600
    return GpuRow(
        gpu.name,
        True,
        fit.micro_batch_size,
        fit.checkpointed_layers,
        rate,
        price,
        dollars_per_billion_tokens(rate, price),
        hours,
        hours * price,
        fit.reason,
        measured.label() if measured else None,
    )


def gpu_prices(prices_file: str | None) -> dict[str, float]:
    """Each table GPU's $/h: the table's typical price, or the entry of `prices_file` naming that GPU."""
    prices = {name: gpu.usd_per_hour for name, gpu in gpu_table().items()}
    if prices_file:  # a name the table does not know is refused (PriceError), never dropped
        prices.update(table_gpu_prices(prices_file))
    return prices


def ranked_rows(
    tokens: float,
    prices: dict[str, float],
    pinned: tuple[str, ...] = (),
    *,
    model: ModelConfig,
    data: DataConfig,
    train: TrainConfig,
    written: StepAsWritten,
) -> list[GpuRow]:
    """Every GPU of the table, cheapest run first (the run's dollars, not the hourly price); those the
    recipe does not fit last. The recipe's sections as `gpu_row` reads them."""
    sections = {"model": model, "data": data, "train": train, "written": written}
    rows = [gpu_row(gpu, tokens, prices[gpu.name], pinned, **sections) for gpu in gpu_table().values()]
    return sorted(rows, key=lambda row: (not row.fits, row.usd if row.usd is not None else math.inf))
