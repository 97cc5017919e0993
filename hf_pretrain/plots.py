"""Plots of a run's metrics records, as PNG files: the loss curve the report and the model card show.

matplotlib is imported inside the functions (it is optional: `pip install matplotlib`), and only
its `Figure`, never pyplot: no global state, no display needed, safe beside a training run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def new_axes(width: float = 7.0, height: float = 4.0, rows: int = 1):
    """A figure and its `rows` axes, stacked and sharing the x axis. Raises ImportError without matplotlib."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height * rows), layout="constrained")
    return figure, figure.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]


def token_unit(largest: float) -> tuple[float, str]:
    """Divisor and axis label that keep token counts readable: billions for real runs, less for smoke."""
    for size, name in ((1e9, "billions"), (1e6, "millions")):
        if largest >= size:
            return size, f"tokens ({name})"
    return 1e3, "tokens (thousands)"


def value_at_steps(train: list[dict[str, Any]], key: str, steps: Sequence[float]) -> np.ndarray:
    """`key` of the train records (tokens, elapsed seconds) at any steps: linear between logged records, 0 at step 0."""
    known_steps = [0] + [r["step"] for r in train]
    known_values = [0.0] + [float(r[key]) for r in train]
    return np.interp(steps, known_steps, known_values)


def tokens_axis(train: list[dict[str, Any]]) -> tuple[Callable[[Sequence[float]], np.ndarray], str]:
    """(steps -> tokens in a readable unit, the axis label)."""
    unit, label = token_unit(train[-1]["tokens"])
    return (lambda steps: value_at_steps(train, "tokens", steps) / unit), label


def plot_loss(
    path: Path,
    train: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    to_x: Callable[[Sequence[float]], Any] | None = None,
    xlabel: str | None = None,
    background: Callable[[Any], None] | None = None,
) -> Path:
    """Train loss (a line) and validation loss (points) of metrics records against `to_x(steps)`
    (default: tokens seen); `background(axes)` draws first, under the curves."""
    if to_x is None:
        to_x, xlabel = tokens_axis(train)
    figure, (axes,) = new_axes()
    if background is not None:
        background(axes)
    axes.plot(to_x([r["step"] for r in train]), [r["loss"] for r in train], label="train loss", lw=1.2)
    if evals:
        axes.plot(
            to_x([r["step"] for r in evals]),
            [r["val_loss"] for r in evals],
            "o-",
            label="validation loss",
            lw=1.2,
            ms=4,
        )
    axes.set_xlabel(xlabel or "")
    axes.set_ylabel("loss (nats/token)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.savefig(path, dpi=110)
    return path
