"""`Net`: the namespaces, links and processes of one emulated network, and its link controls.

Layout (every name starts with the Net's unique ``prefix``, ``concord-net-<pid>-<hex>``)::

    namespace <prefix>            the switch: a router with one veth end "v<i>" per host, the
                                  address <subnet>.254 on "lo", and "tun0" once emulating
    namespace <prefix>-<host>     a host: "lo" up, the other veth end "eth0" = <subnet>.<i+1>/24

The switch routes (it is not a bridge): a /32 route per host to its port, proxy ARP on every
port (answered at once: ``proxy_delay`` 0) so that the hosts keep one flat /24, and a blackhole
route for the rest of the subnet (a cut host's packets vanish silently, as with a pulled cable).
Routing is what lets the link emulator see every packet: once a host's link has delay, jitter or
loss (`Net.emulate`), a rule per port sends what the hosts send into ``tun0``, where the emulator
process (`concord.lab.net.emulator`) holds or drops it and writes it back for the kernel to route
on to the destination port. Rates are ``tbf`` on the two veth ends, as without emulation.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import random
import re
import secrets
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

from concord.core.emulation import Emulation, HostLink, LinkSpec
from concord.lab.net.procs import kill, resume, send_signal, stall
from concord.lab.net.shell import (
    PREFIX,
    NetError,
    available,
    cleanup,
    delete_namespace,
    sh,
    sysctl,
    which,
)

_HOST_NAME = re.compile(r"^[a-z0-9][a-z0-9_]{0,31}$")
_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_TUN, _TABLE = "tun0", "100"  # the emulator's device and routing table in the switch
_TUN_QUEUE = 10_000  # packets the kernel queues for the emulator (default 500)
Direction = Literal["both", "up", "down"]


class Host:
    """One namespace of a `Net`: ``ns`` its name, ``ip`` its address, ``ifname`` its interface
    ("eth0"), ``port`` the switch-side end of its veth pair, ``link`` its emulated link."""

    def __init__(self, net: Net, name: str, index: int, ip: str) -> None:
        self.net, self.name, self.index, self.ip = net, name, index, ip
        self.ns = f"{net.prefix}-{name}"
        self.ifname = "eth0"
        self.port = f"v{index}"
        self.link = HostLink()

    def __repr__(self) -> str:
        return f"Host({self.name!r}, ip={self.ip!r}, ns={self.ns!r})"

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this namespace (``ip netns exec`` execs it: same pid)."""
        return [which("ip") or "ip", "netns", "exec", self.ns, *argv]

    def run(self, argv: Sequence[str], **popen_kw: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside this namespace; the `Net` kills it at the latest on exit."""
        proc: subprocess.Popen[Any] = subprocess.Popen(self.argv(argv), **popen_kw)
        self.net._procs.append(proc)
        return proc

    def call(
        self, argv: Sequence[str], *, timeout: float = 60.0, **run_kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside this namespace to completion; output captured as text."""
        run_kw.setdefault("capture_output", True)
        run_kw.setdefault("text", True)
        return subprocess.run(self.argv(argv), timeout=timeout, check=False, **run_kw)


class _Emulator:
    """The link emulator process of a `Net` and its control pipe."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None
        assert proc.stdout is not None
        self.proc, self.buf = proc, b""

    def request(self, message: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        """Send one request, return its answer; `NetError` when it has exited or is silent."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError as e:
            raise NetError(f"the link emulator exited (status {self.proc.poll()})") from e
        answer = self.read_line(timeout)
        if "error" in answer:
            raise NetError(f"link emulator: {answer['error']}")
        return answer

    def read_line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            if not select.select([fd], [], [], timeout)[0]:
                raise NetError(f"the link emulator did not answer within {timeout:g} s")
            chunk = os.read(fd, 65_536)
            if not chunk:
                raise NetError(f"the link emulator exited (status {self.proc.wait(5)})")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(raw)
        return answer


class Net:
    """The emulated network: a context manager owning every namespace, interface, qdisc and
    process (started with `Host.run`, and the link emulator) it created, and removing all of
    them on exit — also on an exception, on SIGINT (KeyboardInterrupt) and, from the main
    thread, on SIGTERM (turned into SystemExit while the `Net` is open); at interpreter exit
    (atexit) as a last resort. SIGINT and SIGTERM are held back while it sets up or tears down,
    so neither is left half done.

    ``hosts``: names of hosts to create on entry (more with `add`); ``subnet``: "10.x.y" (random
    by default); ``prefix``: the name prefix (unique by default: `PREFIX`, pid, random hex);
    ``mtu`` of every interface (hosts, ports, ``tun0``); ``seed`` and ``reorder``: the link
    emulator's (`concord.lab.net.linkmodel.DelayLine`). Entering also runs `cleanup` for
    leftovers of dead runs."""

    def __init__(
        self,
        hosts: Iterable[str] = (),
        *,
        subnet: str | None = None,
        prefix: str | None = None,
        mtu: int = 1500,
        seed: int = 0,
        reorder: bool = False,
    ) -> None:
        self.prefix = prefix or f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        rng = random.SystemRandom()
        self.subnet = subnet or f"10.{rng.randrange(1, 255)}.{rng.randrange(0, 256)}"
        self.switch = self.prefix  # the router's namespace
        self.mtu, self.seed, self.reorder = mtu, seed, reorder
        self.hosts: dict[str, Host] = {}
        self._initial = list(hosts)
        self._procs: list[subprocess.Popen[Any]] = []
        self._created: list[str] = []  # namespaces, in creation order
        self._emulator: _Emulator | None = None
        self._open = False
        self._old_term: Any = None

    @classmethod
    def for_emulation(cls, emulation: Emulation, hosts: Iterable[str] = (), **kw: Any) -> Net:
        """A `Net` with ``emulation``'s MTU, seed and reorder setting (links: `apply`)."""
        return cls(hosts, mtu=emulation.mtu, seed=emulation.seed, reorder=emulation.reorder, **kw)

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts.values())

    # -- lifecycle -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _signals_held(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a held signal is delivered now

    def __enter__(self) -> Net:
        ok, why = available()
        if not ok:
            raise NetError(why)
        cleanup()
        self._open = True
        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread():
            self._old_term = signal.getsignal(signal.SIGTERM)
            if self._old_term in (signal.SIG_DFL, None):
                signal.signal(signal.SIGTERM, _term_to_exit)
        try:
            with self._signals_held():
                self._make_switch()
            for name in self._initial:
                self.add(name)
        except BaseException:
            self.close()
            raise
        return self

    def _make_switch(self) -> None:
        sw = self.switch
        self._created.append(sw)
        sh("ip", "netns", "add", sw)
        sh("ip", "-n", sw, "link", "set", "lo", "up")
        sysctl(
            sw,
            {
                "net.ipv4.ip_forward": 1,
                "net.ipv4.conf.all.rp_filter": 0,  # packets come back from tun0 with any source
                "net.ipv4.conf.default.rp_filter": 0,
                "net.ipv4.conf.all.send_redirects": 0,
                "net.ipv4.conf.default.send_redirects": 0,
            },
        )
        sh("ip", "-n", sw, "addr", "add", f"{self.subnet}.254/32", "dev", "lo")
        sh("ip", "-n", sw, "route", "add", "blackhole", f"{self.subnet}.0/24")

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill the processes (the link emulator too), delete the namespaces (idempotent)."""
        if not self._open:
            return
        with self._signals_held():
            for proc in self._procs:
                if proc.poll() is None:
                    send_signal(proc, signal.SIGKILL, True)
            for proc in self._procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10.0)
            for name in reversed(self._created):
                delete_namespace(name)
            self._created.clear()
            self._emulator = None
            self._open = False
            atexit.unregister(self.close)
            if self._old_term is not None:
                if threading.current_thread() is threading.main_thread():
                    signal.signal(signal.SIGTERM, self._old_term)
                self._old_term = None

    def add(self, name: str) -> Host:
        """A new host ``name`` (lower-case letters, digits, "_"), with the next free address."""
        if not self._open:
            raise NetError("Net is not open: use it as a context manager")
        if not _HOST_NAME.match(name) or name in self.hosts:
            raise ValueError(f"bad or duplicate host name {name!r}")
        index = len(self.hosts)
        if index >= 253:
            raise NetError("at most 253 hosts per Net")
        host = Host(self, name, index, f"{self.subnet}.{index + 1}")
        sw, mtu = self.switch, str(self.mtu)
        with self._signals_held():
            self._created.append(host.ns)
            sh("ip", "netns", "add", host.ns)
            sh("ip", "-n", host.ns, "link", "set", "lo", "up")
            sh(
                "ip",
                "-n",
                sw,
                "link",
                "add",
                host.port,
                "mtu",
                mtu,
                "type",
                "veth",
                "peer",
                "name",
                host.ifname,
                "mtu",
                mtu,
                "netns",
                host.ns,
            )
            sysctl(
                sw,
                {
                    f"net.ipv4.conf.{host.port}.proxy_arp": 1,
                    f"net.ipv4.neigh.{host.port}.proxy_delay": 0,
                },
            )  # answer ARP at once
            sh("ip", "-n", sw, "link", "set", host.port, "up")
            sh("ip", "-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", host.ifname)
            sh("ip", "-n", host.ns, "link", "set", host.ifname, "up")
            self._route(host)
            if self._emulator is not None:
                self._steer(host)
        self.hosts[name] = host
        return host

    def _route(self, host: Host) -> None:
        """The switch's route to ``host`` (the kernel drops it when the port goes down)."""
        sh("ip", "-n", self.switch, "route", "replace", f"{host.ip}/32", "dev", host.port)

    def _steer(self, host: Host) -> None:
        """Send what ``host`` sends through the emulator's TUN device."""
        sh(
            "ip",
            "-n",
            self.switch,
            "rule",
            "add",
            "iif",
            host.port,
            "lookup",
            _TABLE,
            "pref",
            _TABLE,
        )

    # -- link controls ---------------------------------------------------------------------

    def _ends(self, host: Host, direction: Direction) -> list[tuple[str, str]]:
        """(namespace, device) whose egress carries ``host``'s upload / download."""
        if direction not in ("both", "up", "down"):
            raise ValueError(f"direction must be 'both', 'up' or 'down'; got {direction!r}")
        ends = []
        if direction in ("both", "up"):
            ends.append((host.ns, host.ifname))
        if direction in ("both", "down"):
            ends.append((self.switch, host.port))
        return ends

    def cap(
        self,
        host: Host,
        mbit: float,
        burst: int | None = None,
        *,
        latency_ms: float = 50.0,
        direction: Direction = "both",
    ) -> None:
        """Cap ``host``'s link at ``mbit`` Mbit/s (10^6 bit/s of whole Ethernet frames, so TCP
        payload gets ~95 % of it at MTU 1500, ~99 % at 9000) with a tbf token bucket of
        ``burst`` bytes (default: 4 ms at the rate, at least 32 KiB and one frame) and a queue of
        ``latency_ms``; "both" directions by default, or only "up" (what it sends) / "down"
        (what it receives). Re-capping replaces the cap."""
        if mbit <= 0:
            raise ValueError(f"mbit must be > 0; got {mbit}")
        rate_bytes = mbit * 1e6 / 8
        if burst is None:
            burst = max(32 * 1024, int(rate_bytes * 0.004), self.mtu + 64)
        for ns, dev in self._ends(host, direction):
            sh(
                "tc",
                "-n",
                ns,
                "qdisc",
                "replace",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                f"{max(1, round(mbit * 1000))}kbit",
                "burst",
                str(burst),
                "latency",
                f"{latency_ms}ms",
            )

    def uncap(self, host: Host, *, direction: Direction = "both") -> None:
        """Remove `cap` (no error when there is none)."""
        for ns, dev in self._ends(host, direction):
            sh("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)

    def emulate(self, host: Host, link: HostLink) -> None:
        """Give ``host``'s link ``link`` (both directions: delay, jitter and loss by the link
        emulator, started on first need; rates by `cap`). Replaces what was set before."""
        ways: tuple[tuple[Direction, LinkSpec], ...] = (("up", link.up), ("down", link.down))
        for direction, spec in ways:
            if spec.rate_mbit:
                self.cap(host, spec.rate_mbit, direction=direction)
            else:
                self.uncap(host, direction=direction)
        if link.emulated or self._emulator is not None:
            emulator = self._emulator or self._start_emulator()
            emulator.request(
                {
                    "op": "link",
                    "ip": host.ip,
                    "up": dataclasses.asdict(link.up),
                    "down": dataclasses.asdict(link.down),
                }
            )
        host.link = link

    def apply(
        self, emulation: Emulation, peers: Sequence[Host], others: Iterable[Host] = ()
    ) -> None:
        """``emulation``'s links: peer i's (`Emulation.for_peer`) on ``peers[i]``, the common
        link on each of ``others`` (orchestrator, broker, …)."""
        if emulation.mtu != self.mtu:
            raise NetError(
                f"the emulation's mtu {emulation.mtu} differs from this Net's {self.mtu}: "
                "build the Net with Net.for_emulation"
            )
        for host, link in zip(peers, emulation.links(len(peers)), strict=True):
            self.emulate(host, link)
        for host in others:
            self.emulate(host, emulation.link)

    def emulator_stats(self) -> dict[str, Any]:
        """The link emulator's counters (packets admitted, dropped, released, held; bytes
        admitted; its CPU seconds) and ``queue_dropped``: packets the kernel dropped because the
        emulator's queue was full (it fell behind); `NetError` if it is not running."""
        if self._emulator is None:
            raise NetError("no link emulator runs on this Net (no link has delay, jitter or loss)")
        stats = self._emulator.request({"op": "stats"})
        out = sh("ip", "-n", self.switch, "-s", "-j", "link", "show", "dev", _TUN).stdout
        stats["queue_dropped"] = int(json.loads(out)[0]["stats64"]["tx"]["dropped"])
        return stats

    def _start_emulator(self) -> _Emulator:
        if not self._open:
            raise NetError("Net is not open: use it as a context manager")
        sw = self.switch
        with self._signals_held():
            sh("ip", "-n", sw, "tuntap", "add", "dev", _TUN, "mode", "tun")
            # a queue long enough to ride out the emulator's scheduling delays on a busy machine
            sh(
                "ip",
                "-n",
                sw,
                "link",
                "set",
                _TUN,
                "mtu",
                str(self.mtu),
                "txqueuelen",
                str(_TUN_QUEUE),
                "up",
            )
            argv = [
                sys.executable,
                "-m",
                "concord.lab.net.emulator",
                "--tun",
                _TUN,
                "--seed",
                str(self.seed),
                *(["--reorder"] if self.reorder else []),
            ]
            proc = subprocess.Popen(
                [which("ip") or "ip", "netns", "exec", sw, *argv],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,  # a Ctrl-C reaches the owner, which tears it down
            )
            self._procs.append(proc)
            emulator = _Emulator(proc)
            emulator.read_line(30.0)  # {"ready": true}: the TUN device is attached
            sh("ip", "-n", sw, "route", "add", "default", "dev", _TUN, "table", _TABLE)
            for host in self.hosts.values():
                self._steer(host)
        self._emulator = emulator
        return emulator

    def counters(self, host: Host) -> dict[str, int]:
        """Bytes and packets ``host`` sent and received on its link so far (its ``eth0``
        counters: whole Ethernet frames, i.e. payload plus TCP/IP headers, retransmissions
        included): keys ``tx_bytes``, ``rx_bytes``, ``tx_packets``, ``rx_packets``."""
        out = sh("ip", "-n", host.ns, "-s", "-j", "link", "show", "dev", host.ifname).stdout
        stats = json.loads(out)[0]["stats64"]
        return {
            f"{way}_{unit}": int(stats[way][unit])
            for way in ("tx", "rx")
            for unit in ("bytes", "packets")
        }

    def cut(self, host: Host) -> None:
        """Disconnect ``host`` from the switch: all its packets are dropped, both ways, silently."""
        sh("ip", "-n", self.switch, "link", "set", host.port, "down")

    def restore(self, host: Host) -> None:
        """Reconnect ``host`` after `cut`."""
        sh("ip", "-n", self.switch, "link", "set", host.port, "up")
        self._route(host)

    stall = staticmethod(stall)
    resume = staticmethod(resume)
    kill = staticmethod(kill)


def _term_to_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
