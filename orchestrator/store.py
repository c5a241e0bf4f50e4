"""The rendezvous store of the torch.distributed data plane (``network.transport = "torch"``,
`concord.peer.torch_plane`): the orchestrator hosts a ``TCPStore`` (every interface, port
``network.torch.store_port``, 0: a free one) and announces ``HOST:PORT`` in the retained plan
(``Plan.store``), HOST being ``network.torch.store_host`` or, by default, this machine's host
name (127.0.0.1 when the broker is on loopback: a one-host run). In compose or Kubernetes set
``store_host`` to the orchestrator's service name and a fixed ``store_port``. Peers under
``torchrun`` use its store instead (``env://``).

torch is imported only here, and only for such runs: the orchestrator stays torch-free otherwise.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any
from urllib.parse import urlsplit

import structlog

from concord.core.config import RunConfig

log = structlog.get_logger("concord.orchestrator.store")


class StoreError(RuntimeError):
    """The store could not be started (the port is taken, torch is missing)."""


class TorchStore:
    """A started ``TCPStore``; `address` is what the plan announces."""

    def __init__(self, cfg: RunConfig, broker_url: str) -> None:
        t = cfg.network.torch
        host = t.store_host or announced_host(broker_url)
        try:
            import torch.distributed as dist
        except ImportError as exc:  # pragma: no cover - torch is a dependency
            raise StoreError(f"network.transport = 'torch' needs torch: {exc}") from exc
        try:
            # the server listens on every interface; "127.0.0.1" is where its own client
            # connects (the announced name need not resolve from here: a compose service name)
            self._store: Any = dist.TCPStore(  # type: ignore[attr-defined]
                "127.0.0.1",
                t.store_port,
                is_master=True,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=t.timeout),
                use_libuv=True,
            )
        except (RuntimeError, OSError) as exc:
            raise StoreError(
                f"cannot host the torch.distributed store on port {t.store_port} "
                f"(network.torch.store_port): {exc}"
            ) from exc
        self.address = f"{host}:{self._store.port}"
        log.info("orchestrator.torch_store", address=self.address)


def announced_host(broker_url: str) -> str:
    """The host peers reach the store at when ``network.torch.store_host`` is unset: this
    machine's name — or 127.0.0.1 when the broker is on loopback (the embedded broker, a
    single-host run)."""
    broker = urlsplit(broker_url).hostname or ""
    if broker in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    return socket.gethostname()


def torch_store(cfg: RunConfig, broker_url: str) -> TorchStore | None:
    """The store this run needs, started; None for the gRPC data plane or a rendezvous that is
    not the orchestrator's (``env``, ``tcp://``)."""
    n = cfg.network
    if n.transport != "torch" or n.torch.init not in ("auto", "orchestrator"):
        return None
    return TorchStore(cfg, broker_url)
