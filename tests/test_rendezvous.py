"""Each launcher attempt's process group reads only its own keys in the launcher's store (training/rendezvous.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from hf_pretrain.training.rendezvous import attempt_store
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
