"""`NetPlacement`: the children of a ``concord sim --engine processes --net`` run, each in a
network namespace of its own behind an emulated access link (the launcher's `Placement`,
`concord.sim.processes`).

Hosts of the `Net`: ``broker`` (Mosquitto, anonymous, on its host address: the orchestrator's
embedded broker binds only loopback without credentials, and loopback is private to each
namespace), ``orchestrator``, ``peer_<i>`` for every peer and ``launcher``, the namespace the
launcher's own MQTT client (the progress view) connects from. Peer ``i``'s link is the
emulation's link for that peer (`Emulation.for_peer`: the spread and the per-peer overrides), the
broker's and the orchestrator's are the common link, the launcher's is not emulated (it only
watches). The namespaces form a closed network: nothing outside them, not even this host's own
namespace, reaches an address in it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from concord.core.emulation import Emulation
from concord.lab.net.services import mosquitto
from concord.lab.net.shell import NetError, available
from concord.lab.net.topology import Host, Net

_CLONE_NEWNET = 0x40000000
_NETNS_DIR = Path("/run/netns")


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NetError(f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered(host: Host) -> Iterator[None]:
    """While entered, sockets this thread opens live in ``host``'s namespace (setns(2) of the
    calling thread; threads it starts meanwhile inherit it); the thread's own namespace after."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(_NETNS_DIR / host.ns, os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)


def _host_name(child: str) -> str:
    """The `Net` host of launcher child ``child`` ("peer-3" → "peer_3")."""
    return child.replace("-", "_")


class NetPlacement:
    """A context manager: on entry the `Net` of ``n_peers`` peers, the orchestrator, the broker
    and the launcher with ``emulation``'s links, and Mosquitto started (its config and output
    in ``directory``); on exit (also on an exception, Ctrl-C, SIGTERM, at interpreter exit)
    every namespace and process removed (`Net.close`). Raises `NetError` before creating
    anything when namespaces are not permitted here (`available`: root or CAP_NET_ADMIN, …)."""

    def __init__(self, emulation: Emulation, n_peers: int, directory: Path) -> None:
        ok, why = available()
        if not ok:
            raise NetError(f"--net needs network namespaces: {why}")
        self.emulation, self.n_peers, self.directory = emulation, n_peers, directory
        emulation.links(n_peers)  # a per-peer override of a peer the run lacks: ConfigError now
        self.net = Net.for_emulation(emulation)
        self.broker: str | None = None

    def __enter__(self) -> NetPlacement:
        net = self.net.__enter__()
        try:
            peers = [net.add(f"peer_{i}") for i in range(self.n_peers)]
            others = [net.add("broker"), net.add("orchestrator")]
            net.add("launcher")
            net.apply(self.emulation, peers, others)
            try:
                mosquitto(net["broker"], self.directory)
            except RuntimeError as exc:
                raise NetError(f"--net runs the broker in its own namespace: {exc}") from None
            self.broker = f"mqtt://{net['broker'].ip}:1883"
        except BaseException:
            net.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.net.close()

    def start(self, name: str, argv: Sequence[str], **popen_kw: Any) -> subprocess.Popen[bytes]:
        """Start child ``name`` in its namespace (the `Net` kills it at the latest on exit).
        Its torch.distributed gloo sockets bind the emulated link (``eth0``): by default gloo
        binds the address the host name resolves to, loopback in a namespace."""
        env = {**(popen_kw.pop("env", None) or os.environ), "GLOO_SOCKET_IFNAME": "eth0"}
        proc: subprocess.Popen[bytes] = self.net[_host_name(name)].run(argv, env=env, **popen_kw)
        return proc

    def address(self, name: str) -> str:
        """Child ``name``'s address on the emulated network."""
        return self.net[_host_name(name)].ip

    def monitor(self) -> contextlib.AbstractContextManager[object]:
        """The launcher's namespace, entered by the calling thread."""
        return entered(self.net["launcher"])
