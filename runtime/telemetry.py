"""Metrics an operator can scrape: a Prometheus endpoint on the orchestrator and every peer.

Opt-in with ``metrics.listen = "HOST:PORT"`` (``concord peer|orchestrator --metrics-listen``):
the process serves ``GET /metrics`` in the Prometheus text exposition format (version 0.0.4) on
its own event loop — no thread, no dependency. What it exports is a `Registry` of gauges and
counters that the process updates as it works (the peer from its step records, the orchestrator
from its decisions) plus the standard ``process_*`` metrics. docs/deployment.md#metrics lists
every name.

Torch-free (the orchestrator uses it). Values are plain floats assigned from any thread (the
peer trains in a worker thread); a scrape reads whatever is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import resource
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import structlog

__all__ = [
    "ENDPOINT_FILE",
    "MetricsServer",
    "Registry",
    "metrics_server",
    "parse_listen",
    "process_registry",
]

log = structlog.get_logger(__name__)

ENDPOINT_FILE = "telemetry.json"  # in the process's run directory: where its endpoint listens
_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_MAX_REQUEST = 8192  # bytes of request line and headers read before the request is refused
_READ_TIMEOUT = 5.0  # seconds a client may take to send its request


def parse_listen(listen: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``[::1]:9400`` for IPv6) → (host, port); ValueError naming the problem."""
    host, sep, port = listen.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"metrics.listen {listen!r}: expected HOST:PORT with a port in 0-65535")
    return host, int(port)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


@dataclass
class _Family:
    name: str
    kind: str  # "gauge" | "counter"
    help: str
    values: dict[tuple[tuple[str, str], ...], float] = field(default_factory=dict)


class Registry:
    """Named gauges and counters with fixed labels (``labels``, e.g. run and peer) plus optional
    per-sample labels; `render` writes the exposition text."""

    def __init__(self, prefix: str, labels: Mapping[str, str]) -> None:
        self.prefix = prefix
        self.labels = tuple(sorted((k, str(v)) for k, v in labels.items()))
        self._families: dict[str, _Family] = {}
        self._collectors: list[Callable[[], None]] = []

    def declare(self, name: str, kind: str, help: str) -> None:
        """A metric ``<prefix>_<name>``; a counter's name ends in ``_total``."""
        if kind not in ("gauge", "counter"):
            raise ValueError(f"metric kind {kind!r}: gauge or counter")
        if kind == "counter" and not name.endswith("_total"):
            raise ValueError(f"counter {name!r} must end in _total")
        full = f"{self.prefix}_{name}" if self.prefix else name
        family = self._families.setdefault(full, _Family(full, kind, help))
        if kind == "counter":  # from 0, so that rate() sees the first increase
            family.values.setdefault(self.labels, 0.0)

    def _key(self, extra: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
        if not extra:
            return self.labels
        return tuple(sorted((*self.labels, *((k, str(v)) for k, v in extra.items()))))

    def _family(self, name: str) -> _Family:
        full = f"{self.prefix}_{name}" if self.prefix else name
        try:
            return self._families[full]
        except KeyError:
            raise KeyError(f"metric {full!r} was never declared") from None

    def set(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        self._family(name).values[self._key(labels)] = float(value)

    def inc(self, name: str, by: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        family = self._family(name)
        key = self._key(labels)
        family.values[key] = family.values.get(key, 0.0) + float(by)

    def collector(self, fn: Callable[[], None]) -> None:
        """``fn`` runs before every render (values computed at scrape time)."""
        self._collectors.append(fn)

    def render(self) -> str:
        for fn in self._collectors:
            with contextlib.suppress(Exception):  # a scrape never fails on one value
                fn()
        lines: list[str] = []
        for family in self._families.values():
            if not family.values:
                continue
            lines.append(f"# HELP {family.name} {_escape(family.help)}")
            lines.append(f"# TYPE {family.name} {family.kind}")
            for key, value in list(family.values.items()):
                text = ",".join(f'{k}="{_escape(v)}"' for k, v in key)
                lines.append(f"{family.name}{{{text}}} {_number(value)}")
        return "".join(line + "\n" for line in lines)


def process_registry(labels: Mapping[str, str]) -> Registry:
    """The standard ``process_*`` metrics (the names every Prometheus client library exports),
    with ``labels``: resident memory, CPU seconds, start time, open file descriptors."""
    registry = Registry("", labels)
    started = _start_time()
    names = (
        ("process_resident_memory_bytes", "gauge", "Resident memory size in bytes."),
        ("process_cpu_seconds_total", "counter", "Total user and system CPU time in seconds."),
        ("process_start_time_seconds", "gauge", "Start time of the process since the epoch."),
        ("process_open_fds", "gauge", "Number of open file descriptors."),
    )
    for name, kind, help in names:
        registry.declare(name, kind, help)

    def collect() -> None:
        registry.set("process_resident_memory_bytes", _rss_bytes())
        usage = resource.getrusage(resource.RUSAGE_SELF)
        registry.set("process_cpu_seconds_total", usage.ru_utime + usage.ru_stime)
        registry.set("process_start_time_seconds", started)
        with contextlib.suppress(OSError):
            registry.set("process_open_fds", len(os.listdir("/proc/self/fd")))

    registry.collector(collect)
    return registry


def _start_time() -> float:
    """This process's start in seconds since the epoch (Linux: boot time + start ticks from
    /proc; elsewhere: now, which is close enough for a process that exports it at start)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(float(x.split()[1]) for x in f if x.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def _rss_bytes() -> float:
    try:
        with open("/proc/self/statm") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, B on macOS
        return float(peak if sys.platform == "darwin" else peak * 1024)


class MetricsServer:
    """``GET /metrics`` of ``registries`` on ``listen`` (port 0: a free one), served by the
    running event loop: ``async with MetricsServer(...) as server`` (``server.url``)."""

    def __init__(
        self, listen: str, registries: Iterable[Registry], *, run_dir: Path | None = None
    ) -> None:
        self.host, self.port = parse_listen(listen)
        self.registries = list(registries)
        self.run_dir = run_dir
        self.scrapes = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    async def __aenter__(self) -> MetricsServer:
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)
        except OSError as exc:
            raise OSError(
                f"metrics.listen {self.host}:{self.port}: cannot listen there ({exc.strerror})"
            ) from None
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("metrics.listening", url=self.url)
        if self.run_dir is not None:
            path = self.run_dir / ENDPOINT_FILE
            tmp = path.with_name(ENDPOINT_FILE + ".tmp")
            tmp.write_text(json.dumps({"metrics": self.url}) + "\n", encoding="utf-8")
            tmp.replace(path)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT)
            status, body = self._answer(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            status, body = "400 Bad Request", "bad request\n"
        except ConnectionError:
            writer.close()
            return
        data = body.encode("utf-8")
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: {_CONTENT_TYPE}\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode("ascii")
            + data
        )
        with contextlib.suppress(ConnectionError, TimeoutError):
            await asyncio.wait_for(writer.drain(), _READ_TIMEOUT)
        writer.close()

    def _answer(self, head: bytes) -> tuple[str, str]:
        if len(head) > _MAX_REQUEST:
            return "431 Request Header Fields Too Large", "request too large\n"
        method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
        path = rest.split(" ", 1)[0].split("?", 1)[0]
        if method != "GET":
            return "405 Method Not Allowed", "only GET\n"
        if path not in ("/metrics", "/"):
            return "404 Not Found", "not found: the metrics are at /metrics\n"
        self.scrapes += 1
        return "200 OK", "".join(r.render() for r in self.registries)


def metrics_server(
    listen: str | None, registry: Registry, run_dir: Path | None = None
) -> MetricsServer | None:
    """The endpoint ``metrics.listen`` asks for (None: unset): ``registry`` and the process's
    ``process_*`` metrics, with ``registry``'s labels."""
    if listen is None:
        return None
    labels = dict(registry.labels)
    return MetricsServer(listen, [registry, process_registry(labels)], run_dir=run_dir)
