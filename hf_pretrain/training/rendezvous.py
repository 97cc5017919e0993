"""Where the processes of one launcher attempt meet: a store of their own, so that a restart starts clean.

Under torchrun (what `accelerate launch` runs for several processes), the launcher's agent hosts the
job's TCPStore and keeps it for the whole job (`TORCHELASTIC_USE_AGENT_STORE`: the static rendezvous
always, c10d's shared store too). `torch.distributed.init_process_group` writes its keys there under
fixed names (`default_pg/...`: each process's gloo address, NCCL's unique id) and nothing removes
them. When `--max_restarts` restarts the group after a process died, a new process can read the key
the dead attempt left, before its new peer has rewritten it, and connects to a dead address: the
connection is refused and the restart is wasted (exit 1), or that port now belongs to another listener
and the connection waits for an answer that never comes. Whether the stale key is read first is a
race, which is why the restart passed alone and failed or hung on a busy machine.

`attempt_store` gives the process group the agent's store under the attempt's number
(`TORCHELASTIC_RESTART_COUNT`), so each attempt reads only the keys of its own processes.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"  # set by torchrun's agent in every process it starts
ATTEMPT_ENV = "TORCHELASTIC_RESTART_COUNT"  # 0, then 1, 2, ... at each restart of the group
DEFAULT_STORE_TIMEOUT = timedelta(minutes=30)  # torch's own for gloo


def attempt_key_prefix() -> str:
    return f"hf_pretrain/attempt_{os.environ.get(ATTEMPT_ENV, '0')}/"


def attempt_store(timeout: timedelta | None = None) -> dict[str, Any]:
    """`init_process_group` arguments (`store`, `rank`, `world_size`) that put this attempt's keys apart in
    the launcher's store; none outside a torchrun agent's store (one process, mpirun, a store of the
    first process's own, which dies with its attempt) and under DeepSpeed, whose launcher takes no store."""
    if os.environ.get(AGENT_STORE_ENV) != str(True) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        return {}
    import torch.distributed as dist  # here: only a launched process needs it

    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,  # the agent hosts it
        timeout=timeout or DEFAULT_STORE_TIMEOUT,
    )
    return {
        "store": dist.PrefixStore(attempt_key_prefix(), store),
        "rank": int(os.environ["RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
    }
