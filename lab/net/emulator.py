"""The link emulator process: ``python -m concord.lab.net.emulator --tun tun0 [--seed N]
[--reorder]``, run by `concord.lab.net.Net` inside the switch namespace.

The switch routes every IPv4 packet a host sends into the TUN device ``--tun`` (policy routing
by incoming interface); this process reads each one, lets `DelayLine` drop it or hold it for its
delay, and writes it back into the TUN device at its release time, from where the kernel routes
it to the destination host's link. One thread, one ``select`` over the TUN and the control pipe
with the next release time as its timeout: no busy waiting, no per-packet timer.

Control (stdin / stdout, one JSON object per line; every request gets one line back):

* ``{"op": "link", "ip": "10.1.2.3", "up": {...}, "down": {...}}`` (`LinkSpec` fields):
  set a host's link; answers ``{"ok": true}`` or ``{"error": "..."}``.
* ``{"op": "stats"}``: answers packets (admitted, dropped, released), bytes admitted,
  packets held, and the CPU seconds this process used.

It prints ``{"ready": true}`` once the TUN device is attached, and exits when stdin closes (its
owner is gone) or on SIGTERM.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import gc
import ipaddress
import json
import os
import resource
import select
import signal
import struct
import sys
import time
from collections.abc import Sequence
from typing import Any

from concord.core.emulation import HostLink, LinkSpec
from concord.errors import ConfigError
from concord.lab.net.linkmodel import DelayLine

_TUNSETIFF = 0x400454CA
_IFF_TUN, _IFF_NO_PI = 0x0001, 0x1000
_READ_BURST = 256  # packets read per wake-up before releasing what is due
_MAX_PACKET = 65_536


def open_tun(name: str) -> int:
    """A non-blocking file descriptor attached to the existing TUN device ``name`` (IPv4 packets
    without the packet-information prefix)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


def handle(line: DelayLine, request: dict[str, Any]) -> dict[str, Any]:
    """Answer one control request (module docstring)."""
    op = request.get("op")
    if op == "link":
        try:
            link = HostLink(LinkSpec(**request["up"]), LinkSpec(**request["down"]))
            address = ipaddress.IPv4Address(request["ip"]).packed
        except (ConfigError, KeyError, TypeError, ValueError) as e:
            return {"error": f"bad link request: {e}"}
        line.set_link(address, link)
        return {"ok": True}
    if op == "stats":
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "admitted": line.admitted,
            "dropped": line.dropped,
            "released": line.released,
            "bytes": line.bytes,
            "held": line.held,
            "cpu_s": usage.ru_utime + usage.ru_stime,
        }
    return {"error": f"unknown op {op!r}: 'link' or 'stats'"}


class _Control:
    """Line-framed JSON requests on a pipe, answered on another."""

    def __init__(self, fd_in: int, fd_out: int) -> None:
        self.fd_in, self.fd_out, self.buf = fd_in, fd_out, b""

    def send(self, message: dict[str, Any]) -> None:
        os.write(self.fd_out, json.dumps(message).encode() + b"\n")

    def serve(self, line: DelayLine) -> bool:
        """Answer the requests that arrived; False once the pipe is closed."""
        chunk = os.read(self.fd_in, 65_536)
        if not chunk:
            return False
        self.buf += chunk
        while b"\n" in self.buf:
            raw, self.buf = self.buf.split(b"\n", 1)
            try:
                request = json.loads(raw)
            except json.JSONDecodeError as e:
                self.send({"error": f"not JSON: {e}"})
                continue
            self.send(
                handle(line, request) if isinstance(request, dict) else {"error": "not an object"}
            )
        return True


def _release(fd: int, packets: Sequence[bytes]) -> None:
    for packet in packets:
        try:
            os.write(fd, packet)
        except OSError as e:  # a packet the stack refuses (e.g. its host is gone): drop it
            if e.errno not in (errno.EINVAL, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EIO):
                raise


def _read_burst(fd: int, line: DelayLine, now: float) -> None:
    for _ in range(_READ_BURST):
        try:
            packet = os.read(fd, _MAX_PACKET)
        except BlockingIOError:
            return
        if len(packet) < 20 or packet[0] >> 4 != 4:
            continue  # not IPv4: the switch routes only IPv4 here
        release = line.admit(packet, now)
        if release is not None and release <= now:
            _release(fd, (packet,))


def serve(tun: int, control: _Control, line: DelayLine) -> None:
    """Forward packets until the control pipe closes."""
    watched = [tun, control.fd_in]
    while True:
        now = time.monotonic()
        _release(tun, line.due(now))
        nxt = line.next_release()
        timeout = None if nxt is None else max(0.0, nxt - time.monotonic())
        ready, _, _ = select.select(watched, [], [], timeout)
        if tun in ready:
            _read_burst(tun, line, time.monotonic())
        if control.fd_in in ready and not control.serve(line):
            return


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m concord.lab.net.emulator", description=__doc__)
    parser.add_argument("--tun", required=True, help="the TUN device to attach to")
    parser.add_argument("--seed", type=int, default=0, help="seed of the loss and jitter draws")
    parser.add_argument("--reorder", action="store_true", help="let jitter reorder a flow")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner ends it (stdin closed or SIGTERM)
    tun = open_tun(args.tun)
    control = _Control(sys.stdin.fileno(), sys.stdout.fileno())
    gc.freeze()  # nothing allocated so far is garbage; keeps the collector's passes short
    control.send({"ready": True})
    serve(tun, control, DelayLine(seed=args.seed, reorder=args.reorder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
