"""The measuring processes `concord.lab.net.measure` starts inside the hosts of a `Net`:
``python -m concord.lab.net.probe MODE ADDRESS [PORT] [options]``.

Servers bind ``ADDRESS`` on a free port, print it (one line), serve, and print one JSON line
with what they measured; clients print one JSON line. Timestamps are CLOCK_MONOTONIC, which all
namespaces of a machine share, so a receiver computes one-way delays from the sender's stamps.

* ``echo``: a UDP echo server (runs until killed).
* ``rtt``: ``--count`` UDP probes to an echo server, ``--interval`` s apart, one in flight at a
  time (a probe unanswered within ``--timeout`` s is lost): ``{"rtt_ms": [...], "lost": n}``.
* ``udp-sink`` / ``udp-source``: datagrams stamped with a sequence number and the send time:
  the sink prints ``{"received": n, "delay_ms": [...]}`` (one-way, in arrival order) once
  ``--count`` arrived or nothing arrived for ``--idle`` s; the source paces ``--count`` of
  ``--size`` bytes at ``--rate`` datagrams/s.
* ``tcp-sink`` / ``tcp-source``: the source sends as fast as TCP lets it for ``--seconds``; the
  sink prints ``{"bytes": n, "seconds": s, "steady_mbit": r}``, ``r`` the payload rate after the
  first ``--warmup`` s (slow start excluded).
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time
from collections.abc import Sequence
from typing import Any

_SO_RCVBUFFORCE = 33  # Linux's; the socket module does not name it
_STAMP = struct.Struct("!Qd")  # sequence number, send time (CLOCK_MONOTONIC seconds)


def _bound(kind: socket.SocketKind, address: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, kind)
    sock.bind((address, 0))
    print(sock.getsockname()[1], flush=True)
    return sock


def _emit(result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)


def echo(address: str) -> None:
    sock = _bound(socket.SOCK_DGRAM, address)
    while True:
        data, peer = sock.recvfrom(65_536)
        sock.sendto(data, peer)


def rtt(address: str, port: int, count: int, interval: float, timeout: float) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect((address, port))
    sock.settimeout(timeout)
    rtts, lost = [], 0
    for seq in range(count):
        sent = time.monotonic()
        sock.send(_STAMP.pack(seq, sent))
        try:
            while _STAMP.unpack(sock.recv(64)[: _STAMP.size])[0] != seq:  # a late answer
                pass
            rtts.append((time.monotonic() - sent) * 1e3)
        except TimeoutError:
            lost += 1
        time.sleep(max(0.0, sent + interval - time.monotonic()))
    _emit({"rtt_ms": rtts, "lost": lost})


def udp_sink(address: str, count: int, idle: float) -> None:
    sock = _bound(socket.SOCK_DGRAM, address)
    try:  # root may exceed net.core.rmem_max: a burst must not overflow the socket
        sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, 8 << 20)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    delays: list[float] = []
    sock.settimeout(None)
    while len(delays) < count:
        try:
            data = sock.recv(65_536)
        except TimeoutError:
            break
        now = time.monotonic()
        delays.append((now - _STAMP.unpack(data[: _STAMP.size])[1]) * 1e3)
        sock.settimeout(idle)
    _emit({"received": len(delays), "delay_ms": delays})


def udp_source(address: str, port: int, count: int, rate: float, size: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect((address, port))
    pad = b"\0" * max(0, size - _STAMP.size)
    start = time.monotonic()
    for seq in range(count):
        due = start + seq / rate
        if (wait := due - time.monotonic()) > 0:
            time.sleep(wait)
        sock.send(_STAMP.pack(seq, time.monotonic()) + pad)
    _emit({"sent": count, "seconds": time.monotonic() - start})


def tcp_sink(address: str, warmup: float) -> None:
    server = _bound(socket.SOCK_STREAM, address)
    server.listen(1)
    conn, _ = server.accept()
    total, first, mark, at_mark = 0, 0.0, 0.0, 0
    buf = bytearray(1 << 20)
    while n := conn.recv_into(buf):
        now = time.monotonic()
        if not total:
            first = now
        total += n
        if not mark and now - first >= warmup:
            mark, at_mark = now, total
    end = time.monotonic()
    steady = (total - at_mark) * 8 / (end - mark) / 1e6 if mark and end > mark else 0.0
    _emit({"bytes": total, "seconds": end - first, "steady_mbit": steady})


def tcp_source(address: str, port: int, seconds: float) -> None:
    conn = socket.create_connection((address, port), timeout=30)
    chunk = b"\0" * (1 << 18)
    sent, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        conn.sendall(chunk)
        sent += len(chunk)
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)  # the sink closes once it has read everything
    _emit({"bytes": sent})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m concord.lab.net.probe", description=__doc__)
    parser.add_argument(
        "mode", choices=["echo", "rtt", "udp-sink", "udp-source", "tcp-sink", "tcp-source"]
    )
    parser.add_argument("address")
    parser.add_argument("port", type=int, nargs="?", default=0)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--idle", type=float, default=2.0)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    a = parser.parse_args(argv)
    if a.mode == "echo":
        echo(a.address)
    elif a.mode == "rtt":
        rtt(a.address, a.port, a.count, a.interval, a.timeout)
    elif a.mode == "udp-sink":
        udp_sink(a.address, a.count, a.idle)
    elif a.mode == "udp-source":
        udp_source(a.address, a.port, a.count, a.rate, a.size)
    elif a.mode == "tcp-sink":
        tcp_sink(a.address, a.warmup)
    else:
        tcp_source(a.address, a.port, a.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
