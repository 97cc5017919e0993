"""The progress of a run that a checkpoint carries in its `train_state.json` sidecar."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_pretrain.checkpoints.resume_plan import Continuation
from hf_pretrain.data.prepared import data_identity
from hf_pretrain.optim.build import Cooldown, Schedule

if TYPE_CHECKING:
    from hf_pretrain.store.location import Location


@dataclass
class TrainState:
    """Step, tokens and wall time so far, for this run across all its resumed sessions, and where
    the run stands on its schedule.

    `recipe_fingerprint`, `math_keys` and `hardware` describe the session that saved it; a resume
    keeps its own (checkpoints/resume_rules.py compares them). The data position is a pure function of the
    step: sample `data_origin[1] + (step - data_origin[0]) * samples_per_step`, where the origin
    moves only when a resume changes the batch (`allow_recipe_change`).
    """

    recipe_fingerprint: str
    hardware: str
    schedule: Schedule = field(repr=False)
    math_keys: dict[str, Any] = field(repr=False)
    samples_per_step: int = 1
    step: int = 0
    tokens_seen: int = 0
    elapsed_seconds: float = 0.0  # wall time of the sessions before this one
    skipped_steps: int = 0
    cooldown: Cooldown | None = None  # a decay begun by a stop request or early stopping
    lineage: list[dict[str, Any]] = field(default_factory=list)  # each time the run went further from a branch
    data_origin: tuple[int, int] = (0, 0)  # (step, sample position) the data stream counts from
    data: dict[str, Any] | None = None  # this session's data (data.data_identity): tokenizer and shards
    data_changes: list[dict[str, Any]] = field(default_factory=list)  # steps where a resume changed the data
    _session_start: float | None = field(default=None, repr=False)

    @classmethod
    def at_start(
        cls,
        hardware: str,
        *,
        fingerprint: str,
        math: dict[str, Any],
        schedule: Schedule,
        samples_per_step: int,
        data: Location | str | Path,
    ) -> TrainState:
        """A run's state at step 0: the recipe's `fingerprint` and `math` keys (what a resume compares), its
        `schedule` and sequences per step. `data`: where its data lives (the door's `Location`, or a local
        folder)."""
        return cls(fingerprint, hardware, schedule, math, samples_per_step, data=data_identity(data))

    # ------------------------------------------------------------------ the schedule, where the run stands
    @property
    def end(self) -> int:
        """The run's last step: max_steps, or the end of its cooldown."""
        return self.schedule.end(self.cooldown)

    @property
    def decay_start(self) -> int | None:
        """The last step before the final decay; its checkpoint is kept, for going further."""
        return self.schedule.decay_start(self.cooldown)

    def lr(self, step: int) -> float:
        return self.schedule.lr(step, self.cooldown)

    def data_position(self, step: int) -> int:
        """The first training sample of the step after `step` (samples before it have been read)."""
        origin_step, origin_position = self.data_origin
        return origin_position + (step - origin_step) * self.samples_per_step

    # ------------------------------------------------------------------ progress
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
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "elapsed_seconds": self.elapsed(),
            "skipped_steps": self.skipped_steps,
            "recipe_fingerprint": self.recipe_fingerprint,
            "hardware": self.hardware,
            # where the run stands on its schedule: what a resume under another recipe compares
            "max_steps": self.schedule.max_steps,
            "lr_schedule": self.schedule.kind,
            "lr": self.lr(self.step),
            "end": self.end,
            "decay_start": self.decay_start,
            "cooldown": self.cooldown.to_dict() if self.cooldown else None,
            "lineage": self.lineage,
            "data_origin": list(self.data_origin),
            "data_position": self.data_position(self.step),
            "data": self.data,
            "data_changes": self.data_changes,
            "math_keys": self.math_keys,
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Progress from a checkpoint; this session's fingerprint, math keys and hardware stay."""
        self.step = saved["step"]
        self.tokens_seen = saved["tokens_seen"]
        self.elapsed_seconds = saved.get("elapsed_seconds", 0.0)
        self.skipped_steps = saved.get("skipped_steps", 0)
        self.cooldown = Cooldown.from_dict(saved.get("cooldown"))
        self.lineage = list(saved.get("lineage", []))
        self.data_origin = tuple(saved.get("data_origin", (0, 0)))
        self.data_changes = list(saved.get("data_changes", []))

    def go_on_as(self, plan: Continuation, loaded: dict[str, Any]) -> list[str]:
        """Adjust this state, just loaded from `loaded`, to the continuation's plan; returns what to say."""
        if plan.max_steps_changed:
            self.cooldown = None  # the new max_steps is a new plan: any stop request belonged to the old one
        if plan.branch is not None:
            self.lineage.append(plan.branch)
        if plan.batch_changed:
            old_seq_len = (loaded.get("math_keys") or {}).get("data", {}).get("seq_len", self.samples_per_step)
            tokens_read = loaded.get("data_position", self.step) * old_seq_len
            new_seq_len = self.math_keys["data"]["seq_len"]
            self.data_origin = (self.step, math.ceil(tokens_read / new_seq_len))
        if plan.data_change is not None:
            self.data_changes.append(plan.data_change)
        return plan.notes
