"""The progress of a run that a checkpoint carries in its `train_state.json` sidecar."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainState:
    """Step, tokens and wall time so far, for this run across all its resumed sessions.

    `recipe_fingerprint` and `hardware` describe the session that saved it; a resume keeps its
    own and only warns when the fingerprint differs. The data position is the step itself: the
    loader's order is a pure function of it.
    """

    recipe_fingerprint: str
    hardware: str
    step: int = 0
    tokens_seen: int = 0
    elapsed_seconds: float = 0.0  # wall time of the sessions before this one
    skipped_steps: int = 0
    _session_start: float | None = field(default=None, repr=False)

    def start_clock(self) -> None:
        self._session_start = time.perf_counter()

    def elapsed(self) -> float:
        """Wall time of the whole run: earlier sessions plus this one since `start_clock`."""
        session = time.perf_counter() - self._session_start if self._session_start is not None else 0.0
        return self.elapsed_seconds + session

    def advance(self, tokens: int, skipped: bool) -> None:
        self.step += 1
        self.tokens_seen += tokens
        self.skipped_steps += skipped

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tokens_seen": self.tokens_seen, "elapsed_seconds": self.elapsed(),
                "skipped_steps": self.skipped_steps, "recipe_fingerprint": self.recipe_fingerprint,
                "hardware": self.hardware}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Progress from a checkpoint; this session's fingerprint and hardware stay."""
        self.step = saved["step"]
        self.tokens_seen = saved["tokens_seen"]
        self.elapsed_seconds = saved.get("elapsed_seconds", 0.0)
        self.skipped_steps = saved.get("skipped_steps", 0)
