"""``bench/netns.py``: the emulated network really isolates, caps, cuts and stalls, and leaves
nothing behind (namespaces, interfaces, processes) — also after an exception, SIGINT, SIGTERM, or
a killed owner (module-level `cleanup`). Skipped where namespaces are not permitted."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from concord.lab.net import Host, Net, available, cleanup, namespaces

ROOT = Path(__file__).resolve().parents[2]
_ok, _why = available()
pytestmark = pytest.mark.skipif(not _ok, reason=f"emulated network unavailable: {_why}")

PY = sys.executable

# one connection: count bytes from the first one to EOF, print "<bytes> <seconds>", answer "k"
SINK = r"""
import socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 16)
    if not b:
        break
    if t0 is None:
        t0 = time.perf_counter()
    n += len(b)
t1 = time.perf_counter()
c.sendall(b"k"); c.close()
print(n, t1 - t0, flush=True)
"""
# send argv[3] bytes to argv[1]:argv[2], wait for the sink's answer
SOURCE = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
c.sendall(b"x" * int(sys.argv[3])); c.shutdown(socket.SHUT_WR)
assert c.recv(1) == b"k"
"""
# echo every connection (one thread each)
ECHO = r"""
import socket, sys, threading
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
def serve(c):
    while b := c.recv(4096):
        c.sendall(b)
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
"""
# connect + one echo within argv[3] seconds: exit 0 ("ok") or 1 (the error)
PROBE = r"""
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    c.sendall(b"ping")
    assert c.recv(4) == b"ping"
except Exception as e:
    print(type(e).__name__, e); sys.exit(1)
print("ok")
"""
# one connection kept open: "connected" after a first echo, then one echo per stdin line
CLIENT = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
c.sendall(b"0"); assert c.recv(1) == b"0"
print("connected", flush=True)
c.settimeout(60)
for line in sys.stdin:
    c.sendall(b"1"); assert c.recv(1) == b"1"
    print("echoed", flush=True)
"""


class Lines:
    """Lines of a child's stdout (binary pipe), each with a timeout."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.proc, self.fd, self.buf = proc, proc.stdout.fileno(), b""

    def get(self, timeout: float) -> str | None:
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()


def _start(host: Host, script: str, *args: str) -> tuple[subprocess.Popen[bytes], Lines, int]:
    """A server script in ``host``; returns it, its stdout and the port it printed."""
    proc = host.run([PY, "-c", script, *args], stdout=subprocess.PIPE)
    out = Lines(proc)
    port = out.get(30)
    assert port is not None, f"{script.splitlines()[1]}… did not start"
    return proc, out, int(port)


def _mbit(net: Net, src: Host, dst: Host, nbytes: int) -> float:
    """Goodput (Mbit/s of TCP payload) of sending ``nbytes`` from ``src`` to ``dst``."""
    sink, out, port = _start(dst, SINK, dst.ip)
    sent = src.call([PY, "-c", SOURCE, dst.ip, str(port), str(nbytes)], timeout=120)
    assert sent.returncode == 0, sent.stderr
    line = out.get(30)
    assert line is not None
    n, seconds = line.split()
    assert int(n) == nbytes
    sink.wait(10)
    return nbytes * 8 / float(seconds) / 1e6


def _probe(host: Host, ip: str, port: int, timeout: float) -> subprocess.CompletedProcess[str]:
    return host.call([PY, "-c", PROBE, ip, str(port), str(timeout)], timeout=timeout + 30)


def _leftovers(prefix: str) -> list[str]:
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [n for n in namespaces() if n.startswith(prefix)] + [
        line for line in links.splitlines() if prefix in line
    ]


def test_hosts_reach_each_other_and_nothing_is_left() -> None:
    with Net(["a", "b"]) as net:
        a, b = net["a"], net["b"]
        assert a.ip != b.ip
        assert a.ip.rsplit(".", 1)[0] == b.ip.rsplit(".", 1)[0] == net.subnet
        assert len(namespaces()) >= 3
        assert _leftovers(net.prefix)
        _, _, port = _start(a, ECHO, a.ip)
        assert _probe(b, a.ip, port, 10).stdout.strip() == "ok"
        # loopback is up inside a host
        lo = a.call([PY, "-c", "import socket; socket.socket().bind(('127.0.0.1', 0))"])
        assert lo.returncode == 0, lo.stderr
        # an emulated host sees only its own interfaces
        assert b.call(["ip", "-o", "link"]).stdout.count("\n") == 2  # lo, eth0
    assert _leftovers(net.prefix) == []


def test_cap_limits_throughput_both_ways() -> None:
    """tbf shapes whole Ethernet frames exactly, so TCP goodput is ~95 % of the cap (headers:
    1448 payload bytes per 1514-byte frame) minus a little for TCP's recovery from tbf's tail
    drops; its 32 KiB bucket passes at line rate once (< 1 % of 5 MB). Tolerance [0.5, 1.15] ×
    cap: the low end for a loaded 2-core CI machine (sender and receiver are processes competing
    for the CPU), the high end for the bucket and timer granularity."""
    cap = 20.0
    with Net(["a", "b"]) as net:
        a, b = net["a"], net["b"]
        free = _mbit(net, b, a, 50 << 20)
        net.cap(b, cap)
        up = _mbit(net, b, a, 5 << 20)  # b's egress
        down = _mbit(net, a, b, 5 << 20)  # the switch's egress towards b
        net.uncap(b)
        again = _mbit(net, b, a, 50 << 20)
    print(f"uncapped {free:.0f} Mbit/s; capped at {cap:g}: up {up:.1f}, down {down:.1f}; "
          f"uncapped again {again:.0f}")  # fmt: skip
    for rate in (up, down):
        assert 0.5 * cap <= rate <= 1.15 * cap
    assert free > 5 * cap
    assert again > 5 * cap


def test_cut_drops_everything_until_restored() -> None:
    with Net(["a", "b"]) as net:
        a, b = net["a"], net["b"]
        _, _, port = _start(a, ECHO, a.ip)
        client = b.run([PY, "-c", CLIENT, a.ip, str(port)], stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE)  # fmt: skip
        lines = Lines(client)
        assert lines.get(30) == "connected"
        net.cut(b)
        failed = _probe(b, a.ip, port, 1.5)
        assert failed.returncode == 1
        assert "timed out" in failed.stdout
        assert "timed out" in _probe(a, b.ip, 9, 1.5).stdout  # the other way too (not refused)
        assert client.stdin is not None
        client.stdin.write(b"go\n")
        client.stdin.flush()
        assert lines.get(1.5) is None  # the established connection hangs...
        net.restore(b)
        assert _probe(b, a.ip, port, 10).stdout.strip() == "ok"
        assert lines.get(30) == "echoed"  # ...and TCP's retransmission carries it through


def test_stalled_process_stops_answering_until_resumed() -> None:
    with Net(["a", "b"]) as net:
        a, b = net["a"], net["b"]
        server, _, port = _start(a, ECHO, a.ip)
        net.stall(server)
        failed = _probe(b, a.ip, port, 1.5)  # the kernel accepts, the process never echoes
        assert failed.returncode == 1
        assert "timed out" in failed.stdout
        net.resume(server)
        assert _probe(b, a.ip, port, 10).stdout.strip() == "ok"
        net.kill(server)
        assert server.returncode == -signal.SIGKILL
        assert _probe(b, a.ip, port, 5).returncode == 1  # refused now


def test_exception_tears_everything_down() -> None:
    with pytest.raises(RuntimeError, match="boom"), Net(["a"]) as net:  # noqa: PT012
        proc = net["a"].run(["sleep", "300"])
        raise RuntimeError("boom")
    assert proc.poll() == -signal.SIGKILL
    assert _leftovers(net.prefix) == []


_OWNER = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from concord.lab.net import Net
with Net(["a", "b"]) as net:
    p = net["a"].run(["sleep", "300"])
    print(net.prefix, p.pid, flush=True)
    time.sleep(300)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_owner_signalled_or_killed_leaves_nothing(sig: int) -> None:
    """SIGINT / SIGTERM: the owner tears down itself; SIGKILL: `cleanup` removes what a dead
    owner left (namespaces and the processes still inside them)."""
    owner = subprocess.Popen(
        [PY, "-c", _OWNER, str(ROOT)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        line = Lines(owner).get(60)
        assert line is not None
        prefix, pid = line.split()
        os.kill(owner.pid, sig)
        owner.wait(30)
        if sig == signal.SIGKILL:
            left = _leftovers(prefix)
            assert len(left) == 3  # the switch and two hosts
            assert set(left) <= set(cleanup())
        assert _leftovers(prefix) == []
        time.sleep(0.1)
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_cleanup_spares_live_runs() -> None:
    with Net(["a"]) as net:
        assert not [n for n in cleanup() if n.startswith(net.prefix)]
        assert len(_leftovers(net.prefix)) == 2


# structlog, unconfigured here, logs to stdout: results are tagged lines
_RECEIVER = r"""
import asyncio, sys
from bench._grpc import _transport
ip, dim = sys.argv[1], int(sys.argv[2])
async def main():
    t = _transport(1, ["0.0.0.0:1", f"{ip}:0"], dim)  # peer 0 is never dialled
    print("PORT", await t.start(f"{ip}:0"), flush=True)
    await asyncio.wait_for(t.mailbox.slot((0, 0, 0, 0)), 120)
    await asyncio.sleep(1.0)  # let the Ack leave
    await t.stop(1.0)
asyncio.run(main())
"""
_SENDER = r"""
import asyncio, sys, time
import torch
from bench._grpc import _transport
ip, port, dim = sys.argv[1], sys.argv[2], int(sys.argv[3])
async def main():
    t = _transport(0, ["0.0.0.0:1", f"{ip}:{port}"], dim)
    assert not await t.connect([1], timeout=30), "no handshake"
    t0 = time.perf_counter()
    frames = t.frames(step=0, round=0, tensor_id=0, codec="none", parts={"values": torch.ones(dim)})
    await t.round_(step=0, round=0, tensor_id=0, frames=frames, send_to=[1], receive_from=[])
    assert not t.counters.send_failures, "send failed"
    await asyncio.wait_for(t.links[1].acks[(0, 0, 0)], 120)
    print("SECONDS", time.perf_counter() - t0, flush=True)
    await t.stop(1.0)
asyncio.run(main())
"""


def test_concord_transport_exchanges_a_tensor_over_a_capped_link(tmp_path: Path) -> None:
    """The real `concord.peer.transport.Transport` in two namespaces: handshake, one 4 MiB
    tensor, the Ack — through a 40 Mbit/s cap, so it takes at least ~0.8 s on the wire."""
    dim, cap = 1 << 20, 40.0
    env: dict[str, Any] = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = tmp_path / "receiver.log"
    with Net(["a", "b"]) as net, log.open("wb") as err:
        a, b = net["a"], net["b"]
        net.cap(b, cap)
        recv = a.run([PY, "-c", _RECEIVER, a.ip, str(dim)], stdout=subprocess.PIPE, stderr=err,
                     env=env, cwd=ROOT)  # fmt: skip
        out, end, port = Lines(recv), time.monotonic() + 120, None
        while port is None and (line := out.get(end - time.monotonic())) is not None:
            port = line.split()[1] if line.startswith("PORT ") else None  # skip structlog lines
        assert port is not None, f"the receiver did not start: {log.read_text()[-2000:]}"
        sent = b.call([PY, "-c", _SENDER, a.ip, port, str(dim)], timeout=300, env=env, cwd=ROOT)
        assert sent.returncode == 0, f"{sent.stderr[-2000:]}\nreceiver: {log.read_text()[-2000:]}"
        seconds = float(next(x for x in sent.stdout.splitlines() if x.startswith("SECONDS "))[8:])
        assert recv.wait(60) == 0, log.read_text()[-2000:]
    print(f"4 MiB through {cap:g} Mbit/s: {seconds:.2f} s")
    assert seconds >= 0.8 * (4 * dim * 8) / (cap * 1e6)
