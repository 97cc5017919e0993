"""Where a run's loss is heading, and what the next tokens buy: a saturating power law fitted to its
loss curve as it goes.

    L(tokens) = E + A * (tokens / tokens_0) ** -alpha      (tokens_0: the first fitted point)

E is the loss the curve flattens towards, A and alpha how fast it gets there. The fit is scipy's
`least_squares` with a soft-L1 loss, so a spike or a noisy window pulls it less than squares
would, over the stable part of the curve: after the warmup, before any decay (a decay bends the
curve down in a way the law does not describe, so forecasts are of the curve *without* the final
decay; the decay buys a further drop on top), and of that, the most recent `RECENT_SHARE` of the
steps so far: a young run's first steps are a transient (a plateau, then a faster fall) that no
power law describes, and fitting them made the forecast of a run's second half 2 to 10 times worse
(docs/benchmarks.md). The band is the fit's own uncertainty: the delta method on the parameters'
covariance, `BAND_SIGMAS` standard deviations each side.

Pure functions of metrics records, so the loop (a forecast at every log), `hf-pretrain report` (the
plot) and `hf-pretrain plan --run` (what going further would buy) agree.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from hf_pretrain.economics.cost import Phase, dollars

MIN_POINTS = 8  # fewer logged losses than this in the stable phase: no forecast yet
MIN_TOKEN_RATIO = 1.5  # nor before the fitted stretch spans this factor in tokens
MAX_POINTS = 512  # a long run's curve is thinned to this many points: the fit costs the same at step 90,000
BAND_SIGMAS = 2.0
RECENT_SHARE = 0.5  # the fit covers the later half of the stable steps logged so far


@dataclass(frozen=True)
class LossFit:
    irreducible: float  # E
    amplitude: float  # A
    exponent: float  # alpha
    tokens_0: float
    covariance: list[list[float]]  # of (E, A, alpha)
    points: int
    first_tokens: float
    last_tokens: float
    residual_sd: float

    def loss_at(self, tokens: float | np.ndarray) -> float | np.ndarray:
        return self.irreducible + self.amplitude * (np.asarray(tokens, dtype=float) / self.tokens_0) ** -self.exponent

    def sd_at(self, tokens: float | np.ndarray) -> float | np.ndarray:
        """Standard deviation of the fitted curve at `tokens` (how sure the fit is of it, not the noise)."""
        x = np.asarray(tokens, dtype=float) / self.tokens_0
        power = x**-self.exponent
        gradient = np.stack([np.ones_like(power), power, -self.amplitude * power * np.log(x)])
        variance = np.einsum("i...,ij,j...->...", gradient, np.asarray(self.covariance), gradient)
        return np.sqrt(np.maximum(variance, 0.0))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fit_loss_curve(tokens: list[float] | np.ndarray, losses: list[float] | np.ndarray) -> LossFit | None:
    """The power law through (tokens, loss) points; None when there are too few, or they span too
    few tokens, to say anything."""
    from scipy.optimize import least_squares  # scipy takes a moment to import; only the fit needs it

    t, y = np.asarray(tokens, dtype=float), np.asarray(losses, dtype=float)
    keep = np.isfinite(t) & np.isfinite(y) & (t > 0)
    t, y = t[keep], y[keep]
    if len(t) < MIN_POINTS or t.max() / t.min() < MIN_TOKEN_RATIO:
        return None
    if len(t) > MAX_POINTS:
        index = np.linspace(0, len(t) - 1, MAX_POINTS).round().astype(int)
        t, y = t[index], y[index]
    tokens_0 = float(t.min())
    x = t / tokens_0

    def residuals(theta: np.ndarray) -> np.ndarray:
        e, a, alpha = theta
        return e + a * x**-alpha - y

    def jacobian(theta: np.ndarray) -> np.ndarray:
        _, a, alpha = theta
        power = x**-alpha
        return np.stack([np.ones_like(x), power, -a * power * np.log(x)], axis=1)

    low = float(y.min())
    start = np.array([max(0.0, low - 0.5 * (y.max() - low)), 0.0, 0.3])
    start[1] = max(float(y[: max(1, len(y) // 10)].mean()) - start[0], 1e-3)
    bounds = ([0.0, 0.0, 1e-3], [low, np.inf, 3.0])
    first = least_squares(residuals, start, jac=jacobian, bounds=bounds)
    # the robust pass: residuals beyond ~1.5 median deviations count linearly, not squared
    scale = max(1.5 * float(np.median(np.abs(first.fun - np.median(first.fun)))), 1e-4)
    result = least_squares(residuals, first.x, jac=jacobian, bounds=bounds, loss="soft_l1", f_scale=scale)
    dof = max(1, len(y) - 3)
    residual_var = float(result.fun @ result.fun) / dof
    jac = jacobian(result.x)
    covariance = residual_var * np.linalg.pinv(jac.T @ jac)
    e, a, alpha = (float(v) for v in result.x)
    return LossFit(
        e, a, alpha, tokens_0, covariance.tolist(), len(y), float(t.min()), float(t.max()), math.sqrt(residual_var)
    )


def fit_run(records: list[dict[str, Any]], first_step: int, last_step: int) -> LossFit | None:
    """The fit over the train records of the stable phase (steps first_step..last_step), its most
    recent `RECENT_SHARE` so far."""
    stable = [r for r in records if r.get("kind", "train") == "train" and first_step <= r["step"] <= last_step]
    if not stable:
        return None
    start = stable[-1]["step"] - RECENT_SHARE * (stable[-1]["step"] - first_step)
    recent = [r for r in stable if r["step"] >= start]
    return fit_loss_curve([r["tokens"] for r in recent], [r["loss"] for r in recent])


def next_phase(phases: list[Phase], step: int, end: int) -> Phase | None:
    """The first named phase that has not begun by `step`, cut at `end`; else the rest of the run."""
    ahead = [p for p in phases if step <= p.start_step < end]
    if ahead:
        return Phase(ahead[0].name, ahead[0].start_step, min(ahead[0].end_step, end))
    return Phase("rest of the run", step, end) if end > step else None


def forecast_fields(
    records: list[dict[str, Any]], stable_steps: tuple[int, int], end: int, phases: list[Phase], price_per_hour: float
) -> dict[str, Any]:
    """The forecast fields of the newest train record (the last of `records`): the loss the fit
    projects at step `end`, the dollars left, and the marginal dollars per loss point of the next
    phase. Empty while there is nothing to fit."""
    now = records[-1]
    fit = fit_run(records, *stable_steps)
    if fit is None:
        return {}
    tokens_per_step = now["tokens"] / now["step"]
    fields: dict[str, Any] = {
        "forecast_loss": float(fit.loss_at(end * tokens_per_step)),
        "forecast_loss_sd": float(fit.sd_at(end * tokens_per_step)),
    }
    seconds_per_step = now["elapsed"] / now["step"]  # evaluations and checkpoints included: what the hours cost
    if price_per_hour:
        fields["usd_left"] = dollars((end - now["step"]) * seconds_per_step / 3600, price_per_hour)
    phase = next_phase(phases, now["step"], end)
    if phase is not None:
        start = max(phase.start_step, now["step"])
        drop = float(fit.loss_at(start * tokens_per_step) - fit.loss_at(phase.end_step * tokens_per_step))
        fields["next_phase"] = phase.name
        if price_per_hour and drop > 0:  # a curve that has stopped falling has no price per point: no field
            cost = dollars((phase.end_step - start) * seconds_per_step / 3600, price_per_hour)
            fields["next_phase_usd_per_loss_point"] = cost / drop
    return fields


@dataclass(frozen=True)
class GoingFurther:
    """What going from the run's tokens so far to `target_tokens` buys, on the fitted curve."""

    tokens_now: float
    target_tokens: float
    steps: int
    hours: float
    cost: float | None  # None without a price
    loss_now: float  # the fitted curve at tokens_now
    loss_now_sd: float
    loss_target: float
    loss_target_sd: float
    usd_per_loss_point: float | None
    fit: LossFit

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def going_further(
    records: list[dict[str, Any]], stable_steps: tuple[int, int], target_tokens: float, price_per_hour: float
) -> GoingFurther | None:
    """Time, money and loss of training on to `target_tokens` at the run's own pace; None without a fit."""
    train = [r for r in records if r.get("kind", "train") == "train"]
    fit = fit_run(train, *stable_steps) if train else None
    if fit is None:
        return None
    now = train[-1]
    tokens_per_step, seconds_per_step = now["tokens"] / now["step"], now["elapsed"] / now["step"]
    steps = max(0, math.ceil((target_tokens - now["tokens"]) / tokens_per_step))
    hours = steps * seconds_per_step / 3600
    cost = dollars(hours, price_per_hour) if price_per_hour else None
    loss_now, loss_target = float(fit.loss_at(now["tokens"])), float(fit.loss_at(target_tokens))
    drop = loss_now - loss_target
    return GoingFurther(
        now["tokens"],
        target_tokens,
        steps,
        hours,
        cost,
        loss_now,
        float(fit.sd_at(now["tokens"])),
        loss_target,
        float(fit.sd_at(target_tokens)),
        cost / drop if cost is not None and drop > 0 else None,
        fit,
    )
