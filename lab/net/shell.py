"""The system side of `concord.lab.net`: running ``ip`` and ``tc``, listing and deleting the
harness's namespaces, and probing whether all of it is permitted here."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import secrets
import shutil
import signal
import subprocess
import time

from concord.errors import ConcordError

PREFIX = "concord-net-"
"""Every namespace of this harness starts with it, followed by the owner's pid."""
_OWNED = re.compile(rf"^{re.escape(PREFIX)}(\d+)-[0-9a-f]+(?:-|$)")


class NetError(ConcordError, RuntimeError):
    """An emulated network cannot be built or driven: an ``ip`` or ``tc`` command failed, the
    link emulator did not start, or namespaces are not permitted here."""


@functools.cache
def which(tool: str) -> str | None:
    """``tool``'s path; also found in the sbin directories when they are not on PATH."""
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin:/bin")


def sh(*argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (its first word looked up with `which`); raise `NetError` on a non-zero exit
    unless ``check`` is False."""
    argv = (which(argv[0]) or argv[0], *argv[1:])
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and p.returncode:
        raise NetError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def sysctl(ns: str, values: dict[str, int]) -> None:
    """Set each key of ``values`` (dotted, e.g. ``net.ipv4.ip_forward``) inside namespace
    ``ns`` by writing /proc/sys from one process in that namespace (no ``sysctl`` binary)."""
    script = "; ".join(f"echo {v} > /proc/sys/{k.replace('.', '/')}" for k, v in values.items())
    sh("ip", "netns", "exec", ns, "sh", "-ec", script)


def namespaces() -> list[str]:
    """All named network namespaces (``ip netns list``)."""
    if which("ip") is None:
        return []
    out = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def delete_namespace(name: str) -> None:
    """Kill every process still inside ``name``, then delete it (its interfaces go with it)."""
    pids = sh("ip", "netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while pids and time.monotonic() < deadline:
        pids = sh("ip", "netns", "pids", name, check=False).stdout.split()
        if pids:
            time.sleep(0.05)
    sh("ip", "netns", "del", name, check=False)


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
        delete_namespace(name)
        removed.append(name)
    return removed


@functools.cache
def available() -> tuple[bool, str]:
    """(True, "") when network namespaces, veth pairs, tc tbf and TUN devices can be created
    here; else (False, the reason). Tries it with a throwaway namespace (cached per process)."""
    if not os.path.exists("/proc/self/ns/net"):
        return False, "no network namespaces on this system (/proc/self/ns/net missing)"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2")):
        if which(tool) is None:
            return False, f"`{tool}` not found (install Debian's {package})"
    if not os.path.exists("/dev/net/tun"):
        return False, "no TUN device (/dev/net/tun missing; load the `tun` kernel module)"
    name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}-probe"
    steps = [
        ("ip", "netns", "add", name),
        ("ip", "-n", name, "link", "set", "lo", "up"),
        ("ip", "-n", name, "link", "add", "va", "type", "veth", "peer", "name", "vb"),
        ("ip", "-n", name, "tuntap", "add", "dev", "tun0", "mode", "tun"),
        ("tc", "-n", name, "qdisc", "add", "dev", "vb", "root", "tbf", "rate", "1mbit",
         "burst", "32kb", "latency", "50ms"),
    ]  # fmt: skip
    try:
        for argv in steps:
            p = sh(*argv, check=False, timeout=10.0)
            if p.returncode:
                why = p.stderr.strip() or f"exit {p.returncode}"
                return False, f"`{' '.join(argv[:4])} …` not permitted here: {why}"
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"network namespaces not usable here: {e}"
    finally:
        if name in namespaces():
            delete_namespace(name)
    return True, ""
