"""A periodic save that stalls training only for a copy: Accelerate's state staged into host memory,
then written to disk on a thread (torchtitan's asynchronous checkpointing, done by hand).

`accelerator.save_state` serializes and writes ~12.5 GB for the 1b recipe (fp32 weights and AdamW's
two moments) while the GPU waits. Here the training thread only copies the model and optimizer
states into host buffers (pinned under CUDA: a device-to-host copy at PCIe speed) and writes the
small files itself: scheduler, sampler, scaler, custom objects and, above all, the RNG states, which
must be those of the moment of the save. The staged copy is then written by `StagedState.write`
under the names `save_state` gives them, in one pass (checkpoints/tensor_files.py): the weights as
the very bytes `save_file` writes, the optimizer state through `torch.save`, each byte checksummed
and counted on its way to the disk, so the seal reads nothing back. `load_state` reads them.

The last save of a session stages nothing (`stage(in_buffers=False)`): training is over, the states do
not change any more, and they are written straight from where they live, without waiting for the
host buffers, which the previous save's thread may still be writing from.

Only where every process holds its state whole (one process, or DDP: the main process writes the
model and optimizer, each process its RNG states). FSDP's sharded state dicts need collectives on
every process to be gathered or written, DeepSpeed and Megatron write their own folders, XLA has
its own copies: those keep the synchronous `save_state` (`can_stage`).

The host buffers are kept from one save to the next (pinning 12.5 GB costs seconds, and a fresh
allocation faults every page in): the caller must wait for the previous write before staging again,
which the checkpointer does (checkpoints/checkpointer.py). They cost one training state of host memory.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.checkpointing import save_accelerator_state, save_custom_state
from accelerate.utils import DistributedType
from accelerate.utils.other import clean_state_dict_for_safetensors

from hf_pretrain.checkpoints.layout import optimizer_file, weights_file
from hf_pretrain.checkpoints.progress import ByteCount
from hf_pretrain.checkpoints.tensor_files import tensor_bytes, write_safetensors, write_torch

SAFETENSORS_METADATA = {"format": "pt"}  # what accelerate.utils.save gives save_file

# Where the model and optimizer states are whole on the process that writes them
STAGEABLE = (DistributedType.NO, DistributedType.MULTI_GPU, DistributedType.MULTI_CPU)


def can_stage(accelerator: Accelerator) -> bool:
    """Whether this run's saves can be staged and written in the background (else: `save_state`)."""
    return (
        accelerator.distributed_type in STAGEABLE
        and not accelerator._save_model_state_pre_hook  # a hook may change what is written: keep Accelerate's path
        and not accelerator.project_configuration.automatic_checkpoint_naming
        # each node's local main would write on its own thread: only the main process's failures are agreed on
        and not accelerator.project_configuration.save_on_each_node
    )


@dataclass
class StagedState:
    """Accelerate's model and optimizer states (copied to host memory, or where they live for the last
    save), and where each goes."""

    files: list[tuple[Path, Any, bool]] = field(default_factory=list)  # (file, state, written with safetensors)
    count: ByteCount = field(default_factory=ByteCount)  # bytes written so far, of about their total

    def write(self) -> dict[str, str]:
        """Write the staged states, each file checksummed and flushed as it is written; returns the
        checksums by file name (the manifest's entries for them)."""
        checksums = {}
        for path, state, safetensors in self.files:
            if safetensors:
                checksums[path.name] = write_safetensors(state, path, SAFETENSORS_METADATA, self.count)
            else:
                checksums[path.name] = write_torch(state, path, self.count)
        return checksums


class HostStage:
    """Host buffers for one training state, reused by every save (the previous write waited for)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._device_copies = False

    def stage(self, accelerator: Accelerator, folder: Path, in_buffers: bool = True) -> StagedState:
        """What `accelerator.save_state(folder, safe_serialization=True)` writes: the model and optimizer
        states staged for `StagedState.write` (copied into this stage's buffers, or with `in_buffers`
        False as they are: the last save), everything else written into `folder` now."""
        config = accelerator.project_configuration
        staged = StagedState()
        self._device_copies = False
        if accelerator.is_main_process:  # accelerate.utils.save writes on this process only (`can_stage`)
            for i, model in enumerate(accelerator._models):
                # the tied embedding's second name dropped now, as `save` would (it warns: the caller quiets it)
                weights = clean_state_dict_for_safetensors(accelerator.get_state_dict(model, unwrap=False))
                staged.files.append((folder / weights_file(i), self._held(weights, ("model", i), in_buffers), True))
            for i, optimizer in enumerate(accelerator._optimizers):
                state = optimizer.state_dict()
                staged.files.append(
                    (folder / optimizer_file(i), self._held(state, ("optimizer", i), in_buffers), False)
                )
            staged.count.grow(sum(tensor_bytes(state) for _, state, _ in staged.files))
            if self._device_copies:
                torch.cuda.synchronize()  # the non-blocking device-to-host copies have landed
        # the small files, as `save_state` writes them (its model and optimizer lists left empty here)
        save_accelerator_state(
            str(folder),
            [],
            [],
            accelerator._schedulers,
            accelerator._dataloaders,
            accelerator.state.process_index,
            accelerator.step,
            accelerator.scaler,
            save_on_each_node=config.save_on_each_node,
            safe_serialization=True,
        )
        for i, obj in enumerate(accelerator._custom_objects):
            save_custom_state(obj, str(folder), i, save_on_each_node=config.save_on_each_node)
        config.iteration += 1  # as save_state counts its saves
        return staged

    def _held(self, state: Any, key: tuple, in_buffers: bool) -> Any:
        # a state dict holds new containers of the live tensors already: left as it is for the last save
        return self._copy(state, key) if in_buffers else state

    def _copy(self, obj: Any, key: tuple) -> Any:
        """`obj` with every tensor copied into this stage's host buffers; new containers, same order."""
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj.detach(), key)
        if isinstance(obj, dict):
            items = [(k, self._copy(v, (*key, k))) for k, v in obj.items()]
            return OrderedDict(items) if isinstance(obj, OrderedDict) else dict(items)
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._copy(v, (*key, i)) for i, v in enumerate(obj))
        return copy.deepcopy(obj)  # numbers, strings, None: what an optimizer's param_groups hold

    def _tensor(self, tensor: torch.Tensor, key: tuple) -> torch.Tensor:
        on_device = tensor.device.type == "cuda"  # pinned: an asynchronous copy at the link's full speed
        buffer = self._buffers.get(key)
        if buffer is None or (buffer.shape, buffer.dtype, buffer.stride()) != (
            tensor.shape,
            tensor.dtype,
            tensor.stride(),
        ):
            buffer = torch.empty_strided(
                tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cpu", pin_memory=on_device
            )
            self._buffers[key] = buffer
        buffer.copy_(tensor, non_blocking=on_device)
        self._device_copies |= on_device
        return buffer
