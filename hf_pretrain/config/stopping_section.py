"""The recipe's `stopping:` section."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import key


@dataclass
class StoppingConfig:
    """Every reason a run ends early, short of a signal: an invocation's last step, non-finite steps, a
    hang, the cost or validation-loss rules (`training/guards.py` and `training/watchdog.py` own it).
    """

    # The schedule still spans max_steps, so a time-boxed session resumes exactly where it stopped.
    stop_at_step: int = key(
        0, "end this invocation after this step with a checkpoint (0 = run to max_steps)", math=False, ge=0
    )
    max_bad_steps: int = key(
        3, "consecutive non-finite steps (skipped, weights untouched) before the run stops", math=False, ge=1
    )
    loss_spike_factor: float = key(
        1.5, "log a loss spike when a step's loss exceeds this multiple of the recent average", math=False, gt=1
    )
    # Sized for the 1b on one GPU: a step is 131K tokens at ~6.2 GFLOPs each, ~2 s at 40% MFU on an
    # H100 and ~6 s on an A100; its 12.5 GB checkpoint takes about 2 minutes at 100 MB/s, an evaluation
    # well under one (estimates from the sizes, not measurements). 600 s is far above all of them, and
    # a hang costs at most ten minutes. Collectives time out 60 s later (training/watchdog.py), so the
    # watchdog, which writes the stacks, always speaks first.
    hang_timeout_s: float = key(
        600.0,
        "seconds without progress (an optimizer step, a checkpoint save or an evaluation completing) after "
        "which the run counts as hung: every process that can writes its threads' stacks into hangs/, "
        "status.json says `hung`, and the run exits 69 (0 = off, e.g. under a debugger). The default fits the 1b "
        "on a GPU with room to spare: a step takes ~2-6 s on an H100/A100, its 12.5 GB checkpoint ~2 min at "
        "100 MB/s (estimates)",
        math=False,
        ge=0,
    )
    max_fruitless_sessions: int = key(
        3,
        "a start after this many sessions in a row that saved no new checkpoint (killed, preempted or failed "
        "before their first save: a relaunch storm) is refused with exit 78, naming what they cost; a "
        "finished, stopped or refused session never counts (0 = never refuse; run_folder/sessions.py)",
        math=False,
        ge=0,
    )
    early_stop_cost_per_loss_point: float = key(
        0.0,
        "stop (with a checkpoint and final/) when the last "
        "early_stop_window steps cost more than this many dollars per "
        "loss point (0 = off; needs price_per_hour)",
        math=False,
        ge=0,
    )
    early_stop_window: int = key(1000, "steps in the early_stop_cost_per_loss_point window", math=False, ge=1)
    early_stop_patience: int = key(
        0,
        "stop when validation loss has not improved by early_stop_min_delta for this "
        "many evaluations in a row (0 = off)",
        math=False,
        ge=0,
    )
    early_stop_min_delta: float = key(
        0.01, "the validation-loss improvement that counts for early_stop_patience", math=False, ge=0
    )
