"""`hf_pretrain.train` under FSDP2 on CPU processes, for the FSDP tests.

    accelerate launch --config_file accelerate_configs/fsdp_cpu_2proc.yaml tests/fsdp_cpu_train.py --recipe smoke ...

Accelerate 1.x turns FSDP on only for accelerators: on the CPU its state stays MULTI_CPU and the
launch config's FSDP plugin is dropped, so the run would be plain DDP. Everything FSDP2 needs
works on the CPU with gloo (`fully_shard` on a CPU mesh, sharded `torch.distributed.checkpoint`
saves), so this entry point, for tests only, sets the state to FSDP with the plugin the launch
configured, then runs the real training entry point unchanged: Accelerate's `prepare` shards the
model, `save_state`/`load_state` write and read the sharded checkpoint.
"""

from __future__ import annotations

import os
import sys

from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType

_init = AcceleratorState.__init__


def _fsdp_on_cpu(self, *args, **kwargs) -> None:
    _init(self, *args, **kwargs)
    plugin = kwargs.get("fsdp_plugin")
    if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
        self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = plugin
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP


if __name__ == "__main__":
    assert os.environ.get("ACCELERATE_USE_FSDP") == "true", "launch with an FSDP config"
    AcceleratorState.__init__ = _fsdp_on_cpu
    from hf_pretrain.train import main

    sys.exit(main())
