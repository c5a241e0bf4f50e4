"""The transports the data-plane tests run: real `concord.peer.transport.Transport`s of run
``"t"`` with one model fingerprint, on free loopback ports."""

from __future__ import annotations

import socket
from typing import Any

from concord.peer.transport import Transport, TransportOptions


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def options(
    peer_id: int, world_size: int, *, dim: int, deadline: float, **kw: Any
) -> TransportOptions:
    """Peer ``peer_id``'s options: codec "none", 1 MiB chunks, tensors up to 64 MiB, unless
    ``kw`` says otherwise (any `TransportOptions` field)."""
    fields: dict[str, Any] = {"codec": "none", "chunk_bytes": 1 << 20, "max_tensor_bytes": 1 << 26}
    fields.update(kw)
    return TransportOptions(
        run_id="t",
        peer_id=peer_id,
        world_size=world_size,
        fingerprint="f" * 64,
        dim=dim,
        deadline=deadline,
        **fields,
    )


def transports(n: int, world: int, *, dim: int, deadline: float) -> list[Transport]:
    """Peers ``0 … n − 1`` of a ``world``-peer run at free loopback addresses, every frame's
    sender taken as a neighbour."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(world)]
    return [
        Transport(options(i, world, dim=dim, deadline=deadline), addresses, lambda *a: True)
        for i in range(n)
    ]
