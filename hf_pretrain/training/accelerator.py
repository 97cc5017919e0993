"""The one Accelerator builder: what a run profile describes, as Accelerate runs it.

Training's `setup` and the pod check's synthetic step (check/synthetic_step.py) both build their
Accelerator here, so the step the check times has the kernel, precision, compile and FP8 settings the
run will train with (issue 58: the check once built its own, from a profile whose kernel was `auto`).
It lives in training/ because it reads the run's parts (the compile plugin, the trackers, FP8's
converter); the check is a product above training and may read it, nothing below training needs it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

from hf_pretrain.config import ComputeConfig
from hf_pretrain.machine.run_profile import RunProfile
from hf_pretrain.model.fp8 import fp8_handlers
from hf_pretrain.training.compiling import dynamo_plugin
from hf_pretrain.training.metrics import trackers_for


def accelerator_for(
    profile: RunProfile,
    compute: ComputeConfig,
    grad_accum: int,
    report_to: str = "none",
    group: dict | None = None,
    project_dir: Path | None = None,
) -> Accelerator:
    """The Accelerator the run profile describes: its device and precision, compiled as the compute section
    asks, FP8's converter where it trains in fp8; TF32 matmuls on a GPU that allows them. A run adds the
    process group's timeout (`group`), the trackers `report_to` names and its folder (`project_dir`); the
    check's one-process step has none of them, and nothing else differs."""
    handlers = [InitProcessGroupKwargs(**group)] if group else []
    accelerator = Accelerator(
        cpu=not profile.machine.on_gpu,
        mixed_precision=profile.accelerate_precision,
        gradient_accumulation_steps=grad_accum,
        log_with=trackers_for(report_to) or None,
        project_dir=str(project_dir) if project_dir is not None else None,
        dynamo_plugin=dynamo_plugin(compute),  # compiled in `prepare`: whole model, regions, or not at all
        # fp8: torchao's float8 for the decoder's linear layers, converted in `prepare` (hf_pretrain/model/fp8.py)
        kwargs_handlers=handlers + fp8_handlers(profile.step) or None,
    )
    if profile.machine.on_gpu and profile.step.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return accelerator
