"""Turn a checkpoint into the FSDP sharded layout, on CPU, for the export tests.

    python -m tests.fsdp_checkpoint SRC_CHECKPOINT DST_CHECKPOINT

Accelerate only shards with FSDP on GPUs, so this does by hand, with two gloo processes, what its
`save_state` does under `fsdp_state_dict_type: SHARDED_STATE_DICT`: FSDP2 (`fully_shard`) per
decoder layer and at the root, then `torch.distributed.checkpoint.save({"model": sharded state
dict})` into `pytorch_model_fsdp_0/`. DST gets SRC's other files (config, tokenizer, train state)
and a fresh manifest, but no `model.safetensors`.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2


def _shard_and_save(rank: int, source: str, target: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source))
    model.load_state_dict(load_file(Path(source) / "model.safetensors"), strict=False)  # the tied head is shared
    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))
    dcp.save({"model": state}, storage_writer=dcp.FileSystemWriter(str(Path(target) / "pytorch_model_fsdp_0")))
    dist.destroy_process_group()


def main(source: Path, target: Path) -> None:
    from hf_pretrain.checkpoints.layout import MANIFEST
    from hf_pretrain.checkpoints.manifest import write_manifest

    shutil.copytree(source, target, ignore=shutil.ignore_patterns("model.safetensors", MANIFEST))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_shard_and_save, args=(str(source), str(target), port), nprocs=WORLD_SIZE)
    write_manifest(target)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
