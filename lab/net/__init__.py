"""Emulated networks on one machine: every process of a run (peers, orchestrator, broker) in a
Linux network namespace of its own behind an access link with a chosen delay, jitter, loss and
rate (docs/network-emulation.md).

* `Net` / `Host` (`concord.lab.net.topology`): the namespaces, the routing switch, the link
  controls (`Net.cap`, `Net.emulate`, `Net.cut`, `stall`, …) and the teardown;
* `concord.core.emulation`: `LinkSpec`, `HostLink`, `Emulation`, the named `PROFILES` and
  `parse_emulation` of a ``[network.emulation]`` table;
* `concord.lab.net.emulator`: the userspace link emulator (a TUN device in the switch) and
  `concord.lab.net.linkmodel` its queueing and loss logic;
* `concord.lab.net.measure`: RTT, one-way delay, throughput and loss measured on a `Net`;
* `concord.lab.net.check`: a profile's links measured beside their configured values
  (``concord net check``); `concord.lab.net.placement`: the children of ``concord sim --net``,
  each in its namespace (the launcher's `Placement`);
* `available` says whether all this is permitted here (root or CAP_NET_ADMIN, iproute2, veth,
  tbf, TUN); `cleanup` removes the namespaces of runs whose owner is gone.

    with Net(["a", "b"], mtu=9000) as net:
        net.emulate(net["b"], HostLink.both(delay_ms=40, rate_mbit=20))
        server = net["a"].run([sys.executable, "server.py", net["a"].ip])
        net["b"].call([sys.executable, "client.py", net["a"].ip], timeout=60)
"""

from concord.core.emulation import (
    PROFILES,
    Emulation,
    HostLink,
    LinkSpec,
    load_emulation,
    parse_emulation,
    profile,
    resolve,
)
from concord.lab.net.procs import kill, resume, stall
from concord.lab.net.services import mosquitto
from concord.lab.net.shell import PREFIX, NetError, available, cleanup, namespaces
from concord.lab.net.topology import Direction, Host, Net

__all__ = [
    "PREFIX",
    "PROFILES",
    "Direction",
    "Emulation",
    "Host",
    "HostLink",
    "LinkSpec",
    "Net",
    "NetError",
    "available",
    "cleanup",
    "kill",
    "load_emulation",
    "mosquitto",
    "namespaces",
    "parse_emulation",
    "profile",
    "resolve",
    "resume",
    "stall",
]
