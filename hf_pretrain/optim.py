"""AdamW with decay only where it belongs, and the warmup + cosine schedule in optimizer steps."""

from __future__ import annotations

import math

import torch

from hf_pretrain.config import TrainConfig


def build_optimizer(model: torch.nn.Module, train: TrainConfig, fused: bool) -> torch.optim.AdamW:
    """AdamW where matrices decay and norms and biases (1-D tensors) do not."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": train.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=train.learning_rate, betas=(train.adam_beta1, train.adam_beta2),
                             eps=train.adam_eps, fused=fused)


def learning_rate_at(step: int, train: TrainConfig) -> float:
    """Linear warmup to the peak, then cosine decay to `min_lr_ratio` of it at `max_steps`.

    Counted in optimizer steps, so the schedule is the same on 1 process or 64.
    """
    peak = train.learning_rate
    if step < train.warmup_steps:
        return peak * (step + 1) / train.warmup_steps
    progress = min(1.0, (step - train.warmup_steps) / max(1, train.max_steps - train.warmup_steps))
    floor = peak * train.min_lr_ratio
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
