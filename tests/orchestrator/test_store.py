"""The torch.distributed rendezvous store the orchestrator hosts (`concord.orchestrator.store`):
started for ``network.transport = "torch"`` only, announced under a name the peers resolve,
reachable at its port while the announced name need not resolve on the orchestrator's host."""

from __future__ import annotations

import datetime
import socket

import torch.distributed as dist

from concord.core.config import load_config
from concord.orchestrator.store import announced_host, torch_store


def test_no_store_for_the_grpc_plane_or_a_rendezvous_elsewhere() -> None:
    assert torch_store(load_config(None, [], environ={}), "mqtt://127.0.0.1:1883") is None
    env = load_config(None, ["network.transport=torch", "network.torch.init=env"], environ={})
    assert torch_store(env, "mqtt://127.0.0.1:1883") is None


def test_the_announced_host_is_loopback_only_for_a_loopback_broker() -> None:
    assert announced_host("mqtt://127.0.0.1:1883") == "127.0.0.1"
    assert announced_host("mqtt://localhost:1883") == "127.0.0.1"
    assert announced_host("mqtts://broker.example:8883") == socket.gethostname()


def test_a_store_announced_under_another_name_starts_and_serves() -> None:
    """``store_host`` names a host this machine cannot resolve (a compose service seen from
    elsewhere): the store still starts at once and answers on its port."""
    cfg = load_config(
        None, ["network.transport=torch", "network.torch.store_host=orchestrator"], environ={}
    )
    store = torch_store(cfg, "mqtt://mosquitto:1883")
    assert store is not None
    host, _, port = store.address.rpartition(":")
    assert host == "orchestrator"
    client = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", int(port), is_master=False, timeout=datetime.timedelta(seconds=10)
    )
    client.set("k", "v")
    assert client.get("k") == b"v"
