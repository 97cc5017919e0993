"""The compute of a run: one optimizer step over its micro-batches, the validation loss, greedy samples."""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from accelerate import Accelerator
from torch.distributed.tensor import DTensor

from hf_pretrain.config import EvaluationConfig, OptimConfig
from hf_pretrain.faults import fault_active
from hf_pretrain.optim.build import set_learning_rate

if TYPE_CHECKING:
    from hf_pretrain.training.state import TrainState


@dataclass
class StepResult:
    loss: float  # this process's mean over the micro-batches
    grad_norm: float  # before clipping; the same on every process
    lr: float
    data_wait: float  # seconds spent waiting for batches

    @property
    def finite(self) -> bool:
        return math.isfinite(self.grad_norm) and math.isfinite(self.loss)


class TrainStep:
    """`step(n)` runs optimizer step n (1-based) on `global_batch_tokens` tokens: the learning rate
    `lr_of(n)` (the run's schedule, cooldown included), `grad_accum` micro-batches, clipping, and the
    update, which a non-finite step skips."""

    def __init__(
        self,
        accelerator: Accelerator,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        train_loader,
        optim: OptimConfig,
        grad_accum: int,
        lr_of: Callable[[int], float],
    ):
        self.accelerator, self.model, self.optimizer = accelerator, model, optimizer
        self.optim, self.grad_accum, self.lr_of = optim, grad_accum, lr_of
        self.batches = iter(train_loader)
        model.train()

    def __call__(self, step: int) -> StepResult:
        if fault_active("crash", step):
            raise RuntimeError(f"injected fault: crash at step {step}")
        if fault_active("hang", step, self.accelerator.process_index):
            os.kill(os.getpid(), signal.SIGSTOP)  # frozen until SIGCONT or SIGKILL: the other processes wait
        lr = self.lr_of(step)
        set_learning_rate(self.optimizer, lr)
        loss, waited = forward_backward(
            self.accelerator, self.model, self.batches, self.grad_accum, poison=fault_active("nan-loss", step)
        )
        # After the last micro-batch the gradients are synchronised, so every process sees the
        # same norm and takes the same decision: a non-finite step is skipped, weights untouched.
        grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.optim.grad_clip or float("inf"))
        # The step's one host read: the loss and the norm in one transfer (the guards read both every
        # step, and the skip needs them before the update). The micro-batches read nothing (docs/gpu.md).
        if isinstance(grad_norm, DTensor):  # FSDP2's norm: replicated, the same value on every process
            grad_norm = grad_norm.full_tensor()
        loss, grad_norm = torch.stack([loss, grad_norm.detach().float()]).tolist()
        result = StepResult(loss, grad_norm, lr, waited)
        if result.finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return result


def forward_backward(
    accelerator: Accelerator, model: torch.nn.Module, batches, grad_accum: int, poison: bool = False
) -> tuple[torch.Tensor, float]:
    """Accumulate gradients over `grad_accum` micro-batches.

    Returns this process's mean loss, still on the device (reading it would make the host wait for
    the GPU), and the seconds spent waiting for batches.
    """
    total = torch.zeros((), device=accelerator.device)
    waited = 0.0
    for _ in range(grad_accum):
        before = time.perf_counter()
        tokens = next(batches)
        waited += time.perf_counter() - before
        tokens = tokens.to(accelerator.device, non_blocking=True)
        inputs, targets = tokens[:, :-1], tokens[:, 1:].contiguous()
        with accelerator.accumulate(model):  # no gradient all-reduce until the last micro-batch
            # the targets are already shifted; `shift_labels` tells the loss not to shift again
            loss = model(input_ids=inputs, labels=targets, shift_labels=targets).loss
            if poison:  # fault injection for the numerical-guard tests
                loss = loss * float("nan")
            accelerator.backward(loss)
        total += loss.detach()
    return total / grad_accum, waited


class Evaluation:
    """The validation loss and greedy samples of the fixed prompts, every `eval_interval` steps and
    at the last step."""

    def __init__(
        self, accelerator: Accelerator, model: torch.nn.Module, val_loader, tokenizer, evaluation: EvaluationConfig
    ):
        self.accelerator, self.model, self.val_loader, self.tokenizer = accelerator, model, val_loader, tokenizer
        self.evaluation = evaluation

    def due(self, state: TrainState) -> bool:
        return bool(self.evaluation.eval_interval) and (
            state.step % self.evaluation.eval_interval == 0 or state.step == state.end
        )

    def __call__(self) -> tuple[float, list[tuple[str, str]]]:
        val_loss = evaluate(self.accelerator, self.model, self.val_loader)
        samples = generate_samples(
            self.accelerator, self.model, self.tokenizer, self.evaluation.prompts, self.evaluation.sample_max_new_tokens
        )
        return val_loss, samples


@torch.no_grad()
def evaluate(accelerator: Accelerator, model: torch.nn.Module, val_loader) -> float:
    """Mean loss per token over the validation samples of all processes together: every sample has
    seq_len targets, so each batch's mean loss weighs as many samples as it counts for (a filler
    batch, none). The samples are the same whatever the world size (data/loader.py)."""
    model.eval()
    sums = torch.zeros(2, device=accelerator.device)  # loss x samples, samples
    for tokens, counted in val_loader:
        tokens = tokens.to(accelerator.device)
        targets = tokens[:, 1:].contiguous()
        loss = model(input_ids=tokens[:, :-1], labels=targets, shift_labels=targets).loss.float()
        sums += torch.stack([loss * counted, torch.tensor(float(counted), device=sums.device)])
    model.train()
    total, samples = accelerator.reduce(sums, "sum").tolist()
    return total / max(samples, 1.0)


@torch.no_grad()
def generate_samples(
    accelerator: Accelerator, model: torch.nn.Module, tokenizer, prompts: list[str], max_new_tokens: int
) -> list[tuple[str, str]]:
    """Greedy completions of the fixed prompts. Every process generates (FSDP needs them all)."""
    # uncompiled: decoding's growing shapes would make compiled layers (compile_regions) recompile
    net = accelerator.unwrap_model(model, keep_torch_compile=False)
    net.eval()
    completions = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids.to(accelerator.device)
        with accelerator.autocast():
            out = net.generate(
                ids,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                use_cache=True,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        completions.append((prompt, tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)))
    net.train()
    return completions
