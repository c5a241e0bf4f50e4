"""The rendezvous store of the torch.distributed data plane (``network.transport = "torch"``,
`concord.peer.torch_plane`): the orchestrator hosts a ``TCPStore`` (every interface, port
``network.torch.store_port``, 0: a free one) and announces ``HOST:PORT`` in the retained plan
(``Plan.store``), HOST being ``network.torch.store_host`` or, by default, this machine's host
name (127.0.0.1 when the broker is on loopback: a one-host run). In compose or Kubernetes set
``store_host`` to the orchestrator's service name and a fixed ``store_port``. Peers under
``torchrun`` use its store instead (``env://``).

What protects it (the store itself authenticates nobody: torch.distributed has no such option):
the server listens only on the address the peers need — loopback when the announced host is
(a one-host run, `concord sim`), else the announced host's address (every interface only when
that name does not resolve to a local address) — and every key lives under a per-run secret
prefix (``Plan.store_prefix``, 32 hex digits, travelling on the control plane: signed with
``[network.tls]``, readable by the broker and its readers). Anyone who reaches the port can
still connect, and write or wait on keys they guess: run the torch data plane inside a trusted
cluster network only.

torch is imported only here, and only for such runs: the orchestrator stays torch-free otherwise.
"""

from __future__ import annotations

import datetime
import secrets
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
        self.bind = bind_address(host)
        self.prefix = secrets.token_hex(16)  # every key of the run lives under it
        try:
            # bound here, handed to the store as a listening socket: torch itself would listen
            # on every interface
            self._socket = socket.create_server((self.bind, t.store_port), backlog=512)
            own = "127.0.0.1" if self.bind == "0.0.0.0" else self.bind  # its own client's way
            self._store: Any = dist.TCPStore(  # type: ignore[attr-defined]
                own,
                self._socket.getsockname()[1],
                is_master=True,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=t.timeout),
                master_listen_fd=self._socket.fileno(),
                use_libuv=True,
            )
        except (RuntimeError, OSError) as exc:
            raise StoreError(
                f"cannot host the torch.distributed store on {self.bind}:{t.store_port} "
                f"(network.torch.store_host / store_port): {exc}"
            ) from exc
        self.address = f"{host}:{self._store.port}"
        log.info("orchestrator.torch_store", address=self.address, bind=self.bind)


def bind_address(host: str) -> str:
    """Where the store listens for peers that dial ``host``: 127.0.0.1 for a loopback host, the
    host's own address when it resolves to an address of this machine that is not loopback,
    else 0.0.0.0 (a name that resolves elsewhere from here, e.g. through a proxy)."""
    if host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return "0.0.0.0"
    if address.startswith("127."):
        return "0.0.0.0"  # e.g. Debian's 127.0.1.1 for the host name: peers come from outside
    try:
        with socket.socket() as probe:
            probe.bind((address, 0))  # an address of this machine
    except OSError:
        return "0.0.0.0"
    return address


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
