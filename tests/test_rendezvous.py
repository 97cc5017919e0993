"""Each launcher attempt's process group reads only its own keys in the launcher's store (training/rendezvous.py)."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
import torch.distributed as dist

from hf_pretrain.training import rendezvous
from hf_pretrain.training.rendezvous import attempt_store, group_ends_last, hold_the_group
from tests.test_survival import free_port


@pytest.fixture
def agent_store(monkeypatch):
    """A store hosted as torchrun's agent hosts it, and a process's environment under that agent."""
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10))
    environment = {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for name, value in {**environment, "RANK": "1", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    return server


def test_a_restarted_attempt_does_not_read_the_keys_the_dead_attempt_left(agent_store, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    first = attempt_store(timedelta(seconds=1))
    assert (first["rank"], first["world_size"]) == (1, 2)
    first["store"].set("default_pg/0//cpu/rank_0", "127.0.0.1:27062 (a process that is gone)")

    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    again = attempt_store(timedelta(seconds=1))["store"]
    assert not again.check(["default_pg/0//cpu/rank_0"])  # it waits for its new peer's key instead
    again.set("default_pg/0//cpu/rank_0", "new")
    assert first["store"].get("default_pg/0//cpu/rank_0") == b"127.0.0.1:27062 (a process that is gone)"


def test_outside_an_agents_store_the_process_group_is_left_to_torch(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert attempt_store() == {}


STUCK_TEARDOWN = """
import time
import torch.distributed as dist
from hf_pretrain.training import rendezvous

rendezvous.TEARDOWN_BACKSTOP_S = 2.0
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
rendezvous.hold_the_group()


class StuckInTeardown:  # stands in for a destructor that never returns (a join that waits forever)
    def __del__(self):
        time.sleep(600)


with rendezvous.group_ends_last():
    cycle = StuckInTeardown()
    cycle.itself = cycle  # freed only by the collection on the way out
    del cycle
print("never", flush=True)
"""


def test_a_teardown_that_never_ends_still_ends_the_process_with_its_stacks(tmp_path):
    """The watchdog stood down with the steps; the group's teardown has a backstop of its own."""
    script = tmp_path / "stuck.py"
    script.write_text(STUCK_TEARDOWN.format(port=free_port()))
    ended = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert ended.returncode == 1 and "never" not in ended.stdout
    assert "__del__" in ended.stderr and "group_ends_last" in ended.stderr  # where it was stuck


def test_one_process_holds_no_group_and_its_teardown_orders_nothing():
    assert not dist.is_initialized()
    hold_the_group()
    with group_ends_last():
        pass
    assert rendezvous._HELD == []
