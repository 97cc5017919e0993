"""When to stop paying: cost per loss point over a window, or validation loss that stopped improving."""

from __future__ import annotations

from typing import Any

from hf_pretrain.config import TrainConfig
from hf_pretrain.economics.cost import window_cost_per_loss_point


class EarlyStop:
    """Both rules are off unless the recipe sets them; `reason` says which fired, and why."""

    def __init__(self, train: TrainConfig):
        self.train = train
        self.reason: str | None = None
        self.best_val_loss = float("inf")
        self.evals_without_improvement = 0

    def observe_cost(self, history: list[dict[str, Any]]) -> None:
        limit = self.train.early_stop_cost_per_loss_point
        if not limit or self.reason:
            return
        cost = window_cost_per_loss_point(history, self.train.early_stop_window, self.train.price_per_hour)
        if cost is not None and cost > limit:
            self.reason = (f"the last {self.train.early_stop_window} steps cost ${cost:,.2f} per loss point, "
                           f"above early_stop_cost_per_loss_point=${limit:,.2f}")

    def observe_val_loss(self, val_loss: float) -> None:
        patience = self.train.early_stop_patience
        if not patience or self.reason:
            return
        if val_loss < self.best_val_loss - self.train.early_stop_min_delta:
            self.best_val_loss, self.evals_without_improvement = val_loss, 0
            return
        self.evals_without_improvement += 1
        if self.evals_without_improvement >= patience:
            self.reason = (f"validation loss has not improved by {self.train.early_stop_min_delta} for {patience} "
                           f"evaluations (best {self.best_val_loss:.4f}, now {val_loss:.4f})")
