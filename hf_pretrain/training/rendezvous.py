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

Where they part: the group must end last, and from Python. DDP's reducer holds the group too, and its
Python binding frees it holding the interpreter lock; when the reducer is the group's last owner, gloo's
destructor joins its worker threads under that lock. A worker still finishing the last collective (its
tensors came from Python: `gather_object`'s) needs the lock to drop them, so each waits for the other
and the process never exits: seen in CI, a two-process run that saved its last checkpoint and hung
(py-spy: the main thread in `~ProcessGroupGloo` joining from `Reducer` dealloc, a gloo thread in
`~AsyncAllgatherWork` waiting for the lock), more likely the busier the machine. `hold_the_group` keeps
a Python handle on the group from its start; `group_ends_last` collects the model first, then lets the
handle go, whose destructor releases the lock while it joins (torch binds it so).
"""

from __future__ import annotations

import faulthandler
import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"  # set by torchrun's agent in every process it starts
ATTEMPT_ENV = "TORCHELASTIC_RESTART_COUNT"  # 0, then 1, 2, ... at each restart of the group
DEFAULT_STORE_TIMEOUT = timedelta(minutes=30)  # torch's own for gloo

TEARDOWN_BACKSTOP_S = 120.0  # how long ending the group may take before the process is ended (exit 1)
_HELD: list[Any] = []  # this process's group, held from Python until its model is gone (module docstring)


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


def hold_the_group() -> None:
    """Keep a Python handle on the default process group (if one was started), so that its model's reducer
    is never its last owner."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        _HELD.append(dist.group.WORLD)


@contextmanager
def group_ends_last() -> Iterator[None]:
    """Around everything that uses the group: on the way out, the model (and its cycles) collected first,
    then the group let go from Python, whose destructor joins gloo's threads without the interpreter lock."""
    try:
        yield
    finally:
        if _HELD:  # one process holds no group: nothing to order
            # ending the group takes a second at most; a teardown stuck past this still ends the process,
            # with its stacks on stderr, rather than holding the machine (the watchdog stood down with the steps)
            faulthandler.dump_traceback_later(TEARDOWN_BACKSTOP_S, exit=True)
            try:
                gc.collect()
                _HELD.clear()
            finally:
                faulthandler.cancel_dump_traceback_later()
