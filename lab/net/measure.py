"""Measurements on the links of a `Net`, with real packets between two of its hosts (the
processes of `concord.lab.net.probe`): round-trip times, one-way delays and loss of datagrams,
and TCP throughput. Used by the fidelity benchmark and the tests; results are plain numbers."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from concord.lab.net.shell import NetError
from concord.lab.net.topology import Host

_PROBE = [sys.executable, "-m", "concord.lab.net.probe"]
_FRAME_OVERHEAD, _PAYLOAD_OVERHEAD = 14, 20 + 32  # Ethernet header; IPv4 + TCP with timestamps


@dataclass(frozen=True)
class Datagrams:
    """What a burst of stamped datagrams met: ``sent``, one-way ``delay_ms`` of each that
    arrived (arrival order)."""

    sent: int
    delay_ms: list[float]

    @property
    def loss(self) -> float:
        """The fraction of datagrams that did not arrive."""
        return 1.0 - len(self.delay_ms) / self.sent if self.sent else 0.0


class _Server:
    """A probe server in a host: its process, its port (first line), its result (last line)."""

    def __init__(self, host: Host, mode: str, *options: str, timeout: float = 30.0) -> None:
        self.mode = mode
        self.proc = host.run([*_PROBE, mode, host.ip, *options], stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        self.fd, self.buf = self.proc.stdout.fileno(), b""
        self.port = int(self.line(timeout))

    def line(self, timeout: float) -> str:
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise NetError(f"probe {self.mode} said nothing within {timeout:g} s")
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                raise NetError(f"probe {self.mode} exited early (status {self.proc.wait(5)})")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\n", 1)
        return raw.decode()

    def result(self, timeout: float) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.line(timeout))
        self.proc.wait(timeout)
        return out

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def _client(
    host: Host, mode: str, address: str, port: int, *options: str, timeout: float
) -> dict[str, Any]:
    done = host.call([*_PROBE, mode, address, str(port), *options], timeout=timeout)
    if done.returncode:
        raise NetError(f"probe {mode} in {host.name} failed: {done.stderr.strip()[-500:]}")
    out: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return out


def rtt_ms(
    src: Host, dst: Host, *, count: int = 50, interval: float = 0.02, timeout: float = 2.0
) -> list[float]:
    """Round-trip times (ms) of ``count`` UDP probes from ``src`` to an echo server on ``dst``,
    one in flight at a time, ``interval`` s apart (a probe unanswered after ``timeout`` s is
    lost, and left out)."""
    server = _Server(dst, "echo")
    try:
        options = ("--count", str(count), "--interval", str(interval), "--timeout", str(timeout))
        out = _client(
            src, "rtt", dst.ip, server.port, *options, timeout=count * (interval + timeout) + 30
        )
    finally:
        server.stop()
    rtts: list[float] = out["rtt_ms"]
    return rtts


def datagrams(
    src: Host,
    dst: Host,
    *,
    count: int = 1000,
    rate: float = 1000.0,
    size: int = 64,
    idle: float = 2.0,
) -> Datagrams:
    """Send ``count`` stamped UDP datagrams of ``size`` bytes from ``src`` to ``dst`` at
    ``rate`` per second; what arrived (``idle``: s of silence after which the rest is lost —
    longer than the largest one-way delay)."""
    sink = _Server(dst, "udp-sink", "--count", str(count), "--idle", str(idle))
    try:
        _client(
            src,
            "udp-source",
            dst.ip,
            sink.port,
            "--count",
            str(count),
            "--rate",
            str(rate),
            "--size",
            str(size),
            timeout=count / rate + 60,
        )
        got = sink.result(idle + 60)
    finally:
        if sink.proc.poll() is None:
            sink.stop()
    return Datagrams(count, got["delay_ms"])


def throughput_mbit(src: Host, dst: Host, *, seconds: float = 3.0, warmup: float = 0.5) -> float:
    """TCP goodput (Mbit/s of payload) from ``src`` to ``dst``: one connection sending for
    ``seconds``, measured at the receiver after its first ``warmup`` seconds."""
    sink = _Server(dst, "tcp-sink", "--warmup", str(warmup))
    try:
        _client(
            src, "tcp-source", dst.ip, sink.port, "--seconds", str(seconds), timeout=seconds + 60
        )
        got = sink.result(30)
    finally:
        if sink.proc.poll() is None:
            sink.stop()
    rate: float = got["steady_mbit"]
    return rate


def wire_mbit(goodput_mbit: float, mtu: int) -> float:
    """The link rate (whole Ethernet frames, what a tbf cap counts) that carries a TCP goodput
    of ``goodput_mbit`` in full-sized segments at ``mtu``."""
    return goodput_mbit * (mtu + _FRAME_OVERHEAD) / (mtu - _PAYLOAD_OVERHEAD)
