"""An emulated network for tests and benchmarks: every process of a run (peers, orchestrator,
broker) in a Linux network namespace of its own, all joined to one bridge.

Layout of one `Net` (every name starts with its unique ``prefix``, ``concord-net-<pid>-<hex>``,
so that concurrent runs never clash and leftovers of a crashed run can be found by name)::

    namespace <prefix>            the switch: bridge "br0", one veth end "v<i>" per host
    namespace <prefix>-<host>     a host: "lo" up, the other veth end "eth0" = 10.x.y.<i+1>/24

Nothing is created in the root namespace (the host's own interfaces are never touched), so the
random private ``10.x.y.0/24`` of each instance can never collide with anything.

Link controls (all on the host's veth pair, so they act on everything the host sends or gets):

* `Net.cap`: a ``tbf`` token bucket on the egress of both ends (``direction`` "both"), i.e. the
  host's upload (its ``eth0``) and its download (the switch's ``v<i>``); `Net.uncap` removes it;
* `Net.cut` / `Net.restore`: the switch-side end down / up: the host's packets are silently
  dropped in both directions (a pulled cable: connection attempts time out, established TCP
  connections retransmit and survive a short cut);
* `stall` / `resume` / `kill`: SIGSTOP / SIGCONT / SIGKILL to a process and its descendants.
* `Net.counters`: the bytes and packets a host's link carried so far, each way.

There is no delay or loss emulation: the kernel of the CI machines has no ``netem``.

`available` says whether all this is permitted here (root or CAP_NET_ADMIN, iproute2's ``ip`` and
``tc``, veth, bridge and tbf in the kernel); callers skip with its reason otherwise. `cleanup`
removes the namespaces of runs whose owning process is gone.

    with Net(["a", "b"]) as net:
        server = net["a"].run([sys.executable, "server.py", net["a"].ip])
        net.cap(net["b"], 20)  # Mbit/s
        net["b"].call([sys.executable, "client.py", net["a"].ip], timeout=60)
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import getpass
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

PREFIX = "concord-net-"
"""Every namespace of this harness starts with it, followed by the owner's pid."""
_OWNED = re.compile(rf"^{re.escape(PREFIX)}(\d+)-[0-9a-f]+(?:-|$)")
_HOST_NAME = re.compile(r"^[a-z0-9][a-z0-9_]{0,31}$")
_SIGNALS = {signal.SIGINT, signal.SIGTERM}
Direction = Literal["both", "up", "down"]


class NetError(RuntimeError):
    """An ``ip`` or ``tc`` command failed."""


@functools.cache
def _which(tool: str) -> str | None:
    """``tool``'s path; also found in the sbin directories when they are not on PATH."""
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin:/bin")


def _sh(*argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    argv = (_which(argv[0]) or argv[0], *argv[1:])
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and p.returncode:
        raise NetError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def namespaces() -> list[str]:
    """All named network namespaces (``ip netns list``)."""
    if _which("ip") is None:
        return []
    out = _sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete_namespace(name: str) -> None:
    """Kill every process still inside ``name``, then delete it (its interfaces go with it)."""
    pids = _sh("ip", "netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while pids and time.monotonic() < deadline:
        pids = _sh("ip", "netns", "pids", name, check=False).stdout.split()
        if pids:
            time.sleep(0.05)
    _sh("ip", "netns", "del", name, check=False)


def cleanup(prefix: str | None = None) -> list[str]:
    """Delete leftover namespaces; returns their names. With ``prefix``: every namespace whose
    name starts with it. Without: those of this harness (`PREFIX`) whose owning process is no
    longer alive (a crashed or killed run), never those of a live run."""
    removed = []
    for name in namespaces():
        if prefix is not None:
            if not name.startswith(prefix):
                continue
        else:
            m = _OWNED.match(name)
            if m is None or _pid_alive(int(m.group(1))):
                continue
        _delete_namespace(name)
        removed.append(name)
    return removed


@functools.cache
def available() -> tuple[bool, str]:
    """(True, "") when network namespaces, veth pairs, a bridge and tc tbf can be created here;
    else (False, the reason). Tries it with a throwaway namespace (cached per process)."""
    if not os.path.exists("/proc/self/ns/net"):
        return False, "no network namespaces on this system (/proc/self/ns/net missing)"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2")):
        if _which(tool) is None:
            return False, f"`{tool}` not found (install Debian's {package})"
    name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}-probe"
    steps = [
        ("ip", "netns", "add", name),
        ("ip", "-n", name, "link", "set", "lo", "up"),
        ("ip", "-n", name, "link", "add", "br0", "type", "bridge"),
        ("ip", "-n", name, "link", "add", "va", "type", "veth", "peer", "name", "vb"),
        ("ip", "-n", name, "link", "set", "va", "master", "br0"),
        ("tc", "-n", name, "qdisc", "add", "dev", "vb", "root", "tbf", "rate", "1mbit",
         "burst", "32kb", "latency", "50ms"),
    ]  # fmt: skip
    try:
        for argv in steps:
            p = _sh(*argv, check=False, timeout=10.0)
            if p.returncode:
                why = p.stderr.strip() or f"exit {p.returncode}"
                return False, f"`{' '.join(argv[:4])} …` not permitted here: {why}"
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"network namespaces not usable here: {e}"
    finally:
        if name in namespaces():
            _delete_namespace(name)
    return True, ""


def _procs_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _pid(proc: subprocess.Popen[Any] | int) -> int:
    return proc if isinstance(proc, int) else proc.pid


def _signal(proc: subprocess.Popen[Any] | int, sig: int, tree: bool) -> None:
    for pid in _procs_tree(_pid(proc)) if tree else [_pid(proc)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stall(proc: subprocess.Popen[Any] | int, *, tree: bool = True) -> None:
    """Freeze ``proc`` (and, with ``tree``, its descendants) with SIGSTOP: its sockets stay open
    and the kernel still accepts connections and buffers data for it, but it answers nothing."""
    _signal(proc, signal.SIGSTOP, tree)


def resume(proc: subprocess.Popen[Any] | int, *, tree: bool = True) -> None:
    """Undo `stall` (SIGCONT)."""
    _signal(proc, signal.SIGCONT, tree)


def kill(proc: subprocess.Popen[Any] | int, *, tree: bool = True, timeout: float = 10.0) -> None:
    """SIGKILL ``proc`` (and its descendants); a `subprocess.Popen` is also reaped."""
    _signal(proc, signal.SIGKILL, tree)
    if isinstance(proc, subprocess.Popen):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)


class Host:
    """One namespace of a `Net`: ``ns`` its name, ``ip`` its address on the bridge, ``ifname``
    its interface ("eth0"), ``port`` the switch-side end of its veth pair."""

    def __init__(self, net: Net, name: str, index: int, ip: str) -> None:
        self.net, self.name, self.index, self.ip = net, name, index, ip
        self.ns = f"{net.prefix}-{name}"
        self.ifname = "eth0"
        self.port = f"v{index}"

    def __repr__(self) -> str:
        return f"Host({self.name!r}, ip={self.ip!r}, ns={self.ns!r})"

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this namespace (``ip netns exec`` execs it: same pid)."""
        return [_which("ip") or "ip", "netns", "exec", self.ns, *argv]

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


class Net:
    """The emulated network: a context manager owning every namespace, interface, qdisc and
    process (started with `Host.run`) it created, and removing all of them on exit — also on an
    exception, on SIGINT (KeyboardInterrupt) and, from the main thread, on SIGTERM (turned into
    SystemExit while the `Net` is open); at interpreter exit (atexit) as a last resort. SIGINT
    and SIGTERM are held back while it sets up or tears down, so neither is left half done.

    ``hosts``: names of hosts to create on entry (more with `add`); ``subnet``: "10.x.y" (random
    by default); ``prefix``: the name prefix (unique by default: `PREFIX`, pid, random hex).
    Entering also runs `cleanup` for leftovers of dead runs."""

    def __init__(
        self, hosts: Iterable[str] = (), *, subnet: str | None = None, prefix: str | None = None
    ) -> None:
        self.prefix = prefix or f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        rng = random.SystemRandom()
        self.subnet = subnet or f"10.{rng.randrange(1, 255)}.{rng.randrange(0, 256)}"
        self.switch = self.prefix  # the bridge's namespace
        self.hosts: dict[str, Host] = {}
        self._initial = list(hosts)
        self._procs: list[subprocess.Popen[Any]] = []
        self._created: list[str] = []  # namespaces, in creation order
        self._open = False
        self._old_term: Any = None

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
                self._created.append(self.switch)
                _sh("ip", "netns", "add", self.switch)
                _sh("ip", "-n", self.switch, "link", "set", "lo", "up")
                _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
                _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
            for name in self._initial:
                self.add(name)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill the processes, delete the namespaces (idempotent)."""
        if not self._open:
            return
        with self._signals_held():
            for proc in self._procs:
                if proc.poll() is None:
                    _signal(proc, signal.SIGKILL, True)
            for proc in self._procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10.0)
            for name in reversed(self._created):
                _delete_namespace(name)
            self._created.clear()
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
        with self._signals_held():
            self._created.append(host.ns)
            _sh("ip", "netns", "add", host.ns)
            _sh("ip", "-n", host.ns, "link", "set", "lo", "up")
            _sh("ip", "-n", self.switch, "link", "add", host.port, "type", "veth",
                "peer", "name", host.ifname, "netns", host.ns)  # fmt: skip
            _sh("ip", "-n", self.switch, "link", "set", host.port, "master", "br0", "up")
            _sh("ip", "-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", host.ifname)
            _sh("ip", "-n", host.ns, "link", "set", host.ifname, "up")
        self.hosts[name] = host
        return host

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
        payload gets ~95 % of it) with a tbf token bucket of ``burst`` bytes (default: 4 ms at
        the rate, at least 32 KiB) and a queue of ``latency_ms``; "both" directions by default,
        or only "up" (what it sends) / "down" (what it receives). Re-capping replaces the cap."""
        if mbit <= 0:
            raise ValueError(f"mbit must be > 0; got {mbit}")
        rate_bytes = mbit * 1e6 / 8
        burst = burst if burst is not None else max(32 * 1024, int(rate_bytes * 0.004))
        for ns, dev in self._ends(host, direction):
            _sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
                "rate", f"{max(1, round(mbit * 1000))}kbit", "burst", str(burst),
                "latency", f"{latency_ms}ms")  # fmt: skip

    def uncap(self, host: Host, *, direction: Direction = "both") -> None:
        """Remove `cap` (no error when there is none)."""
        for ns, dev in self._ends(host, direction):
            _sh("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)

    def counters(self, host: Host) -> dict[str, int]:
        """Bytes and packets ``host`` sent and received on its link so far (its ``eth0``
        counters: whole Ethernet frames, i.e. payload plus TCP/IP headers, retransmissions
        included): keys ``tx_bytes``, ``rx_bytes``, ``tx_packets``, ``rx_packets``."""
        out = _sh("ip", "-n", host.ns, "-s", "-j", "link", "show", "dev", host.ifname).stdout
        stats = json.loads(out)[0]["stats64"]
        return {
            f"{way}_{unit}": int(stats[way][unit])
            for way in ("tx", "rx")
            for unit in ("bytes", "packets")
        }

    def cut(self, host: Host) -> None:
        """Disconnect ``host`` from the bridge: all its packets are dropped, both ways, silently."""
        _sh("ip", "-n", self.switch, "link", "set", host.port, "down")

    def restore(self, host: Host) -> None:
        """Reconnect ``host`` after `cut`."""
        _sh("ip", "-n", self.switch, "link", "set", host.port, "up")

    stall = staticmethod(stall)
    resume = staticmethod(resume)
    kill = staticmethod(kill)


def _term_to_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def mosquitto(host: Host, directory: Path, *, port: int = 1883, timeout: float = 15.0) -> Any:
    """Start Mosquitto (anonymous, TCP_NODELAY, no persistence) on ``host``'s address inside
    its namespace, its config and output (``mosquitto.out``) in ``directory``; return the
    process once the port answers from inside the namespace. Raises RuntimeError (with the
    output's tail) when mosquitto is missing or does not answer within ``timeout`` seconds."""
    from concord.orchestrator.broker import mosquitto_binary

    binary = mosquitto_binary()
    if binary is None:
        raise RuntimeError("mosquitto is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    conf, log = directory / "mosquitto.conf", directory / "mosquitto.out"
    conf.write_text(
        f"listener {port} {host.ip}\nallow_anonymous true\nset_tcp_nodelay true\n"
        f"persistence false\nlog_type error\nuser {getpass.getuser()}\n"
    )
    with open(log, "ab") as out:
        proc = host.run(
            [binary, "-c", str(conf)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    probe = f"import socket; socket.create_connection(('{host.ip}', {port}), 1).close()"
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if host.call([sys.executable, "-c", probe], timeout=10).returncode == 0:
            return proc
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"mosquitto did not start on {host.ip}:{port}: {log.read_text()[-800:]}")
