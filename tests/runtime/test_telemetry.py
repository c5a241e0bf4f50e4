"""The Prometheus endpoint (`concord.runtime.telemetry`): exposition text that Prometheus's own
parser reads, a real HTTP server on loopback, and the peer's step hook."""

from __future__ import annotations

import asyncio
import json
import math
import socket
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from concord.core.records import JSON, EvalRecord
from concord.peer.telemetry import PeerMetrics, peer_registry, watch_refusals
from concord.runtime.telemetry import ENDPOINT_FILE, MetricsServer, Registry, metrics_server
from tests.records import step_record


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_exposition_parses_with_prometheus_own_parser() -> None:
    r = Registry("concord_test", {"run": 'a"b\\c', "peer": "3"})
    r.declare("theta", "gauge", "a gauge with a \\ and a\nnewline in its help")
    r.declare("rounds_total", "counter", "a counter")
    r.declare("by_peer", "gauge", "labelled per sample")
    r.set("theta", 0.25)
    r.inc("rounds_total")
    r.inc("rounds_total", 2)
    r.set("by_peer", float("nan"), {"neighbour": "7"})
    got = _samples(r.render())
    labels = (("peer", "3"), ("run", 'a"b\\c'))
    assert got[("concord_test_theta", labels)] == 0.25
    assert got[("concord_test_rounds_total", labels)] == 3.0
    nan = got[("concord_test_by_peer", tuple(sorted((*labels, ("neighbour", "7")))))]
    assert math.isnan(nan)


def test_undeclared_and_misnamed_metrics_are_refused() -> None:
    r = Registry("x", {})
    with pytest.raises(ValueError, match="must end in _total"):
        r.declare("rounds", "counter", "no suffix")
    with pytest.raises(KeyError, match="never declared"):
        r.set("nothing", 1.0)


def test_the_peer_hook_turns_records_into_metrics() -> None:
    registry = peer_registry("run-1", 2)
    hook = PeerMetrics(registry, total_steps=10)
    extra: dict[str, JSON] = {"step_ms": 20.0, "wait_ms": 5.0, "missing": [1], "rejected": []}
    record = step_record(4, phase=1, epoch=0.5, loss=1.5, rounds=3, rounds_total=9, theta=0.01,
                         target=0.02, grad_norm=0.3, bytes_sent=4096, extra=extra)  # fmt: skip
    assert hook.after(4, record) is record  # it reads the record, adds nothing
    hook.after(5, replace(record, step=5, extra={**extra, "missing": [1, 3]}))
    hook.evaluated(5, EvalRecord(step=5, epoch=0.6, peer=2, accuracy_mean_peer=0.75,
                                 loss_mean_peer=0.9))  # fmt: skip
    got = _samples(registry.render())
    labels = (("peer", "2"), ("run", "run-1"))
    assert got[("concord_peer_step", labels)] == 5
    assert got[("concord_peer_steps_total", labels)] == 2
    assert got[("concord_peer_gossip_rounds_total", labels)] == 9
    assert got[("concord_peer_neighbours_missing_total", labels)] == 3
    assert got[("concord_peer_step_seconds_total", labels)] == pytest.approx(0.04)
    assert got[("concord_peer_eval_accuracy", labels)] == 0.75
    assert got[("concord_peer_eval_loss", labels)] == 0.9
    assert got[("concord_peer_bytes_sent_total", labels)] == 4096
    assert got[("concord_peer_wait_seconds_total", labels)] == pytest.approx(0.01)


async def _get(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return data


def test_the_server_answers_get_and_refuses_the_rest(tmp_path: Path) -> None:
    registry = Registry("concord_test", {"run": "r"})
    registry.declare("up", "gauge", "always 1")
    registry.set("up", 1)
    server = metrics_server("127.0.0.1:0", registry, tmp_path)
    assert server is not None
    assert metrics_server(None, registry) is None  # metrics.listen unset: no endpoint

    async def cut(port: int) -> bytes:
        """A request line, then the end of the stream before the headers end."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\n")
        writer.write_eof()
        data = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        return data

    async def scenario() -> list[bytes]:
        async with server:
            port = server.port
            return [
                await _get(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
                await _get(port, b"GET /nope HTTP/1.1\r\n\r\n"),
                await _get(port, b"POST /metrics HTTP/1.1\r\n\r\n"),
                await cut(port),
            ]

    ok, missing, post, bad = asyncio.run(scenario())
    head, _, body = ok.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"text/plain; version=0.0.4" in head
    samples = _samples(body.decode())
    assert samples[("concord_test_up", (("run", "r"),))] == 1
    assert any(name == "process_resident_memory_bytes" for name, _ in samples)
    assert missing.startswith(b"HTTP/1.1 404")
    assert post.startswith(b"HTTP/1.1 405")
    assert bad.startswith(b"HTTP/1.1 400")
    endpoint = json.loads((tmp_path / ENDPOINT_FILE).read_text())["metrics"]
    assert endpoint.startswith("http://127.0.0.1:")
    assert endpoint.endswith("/metrics")
    assert server.scrapes == 1


def test_a_taken_port_is_a_sentence() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        server = MetricsServer(f"127.0.0.1:{port}", [])

        async def enter() -> None:
            async with server:
                pass

        with pytest.raises(OSError, match=rf"metrics.listen 127.0.0.1:{port}: cannot listen"):
            asyncio.run(enter())


def test_refusals_are_read_at_every_scrape() -> None:
    registry = peer_registry("run-1", 0)
    refused: dict[str, int] = {}  # the transport's counters, updated by its server
    watch_refusals(registry, refused)
    labels = (("peer", "0"), ("run", "run-1"))
    assert _samples(registry.render())[("concord_peer_requests_refused_total", labels)] == 0
    refused["permission"] = 3  # e.g. Fetches from a non-neighbour
    got = _samples(registry.render())
    key = tuple(sorted((*labels, ("reason", "permission"))))
    assert got[("concord_peer_requests_refused_total", key)] == 3
