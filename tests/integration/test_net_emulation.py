"""The link emulator really delays a link: two hosts of a `concord.lab.net.Net`, 40 ms one way
on one host's link (both directions, from a ``[network.emulation]`` table with a per-peer
override), round trips measured with real UDP packets; afterwards
nothing of the run is left (`ip netns list`, the emulator process). Skipped where namespaces are
not permitted."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from concord.lab.net import Net, available, namespaces, parse_emulation
from concord.lab.net.measure import rtt_ms

_ok, _why = available()
pytestmark = pytest.mark.skipif(not _ok, reason=f"emulated network unavailable: {_why}")


def test_a_40_ms_link_delays_round_trips_by_80_ms_and_leaves_nothing() -> None:
    """The emulator never releases a packet early (its timer waits at least the delay), so
    every RTT is ≥ 80 ms; it adds its own forwarding time (≈ 0.3 ms per pass on an idle
    machine, two passes per round trip) plus scheduling delays of a loaded 2-core machine: the
    median within +8 ms (10 %)."""
    emulation = parse_emulation({"peers": {"1": {"delay_ms": 40}}})  # as a run config says it
    with Net.for_emulation(emulation, ["a", "b"]) as net:
        a, b = net["a"], net["b"]
        before = statistics.median(rtt_ms(a, b, count=10))
        net.apply(emulation, [a, b])
        emulator = net._emulator
        assert emulator is not None
        rtts = rtt_ms(a, b, count=30)
        stats = net.emulator_stats()
    print(f"RTT before {before:.2f} ms; at 2 × 40 ms: min {min(rtts):.2f}, "
          f"median {statistics.median(rtts):.2f}, max {max(rtts):.2f} ms")  # fmt: skip
    assert before < 10.0
    assert len(rtts) == 30
    assert min(rtts) >= 80.0
    assert statistics.median(rtts) <= 88.0
    assert stats["admitted"] >= 60  # 30 probes and 30 answers crossed it
    assert not [n for n in namespaces() if n.startswith(net.prefix)]
    assert emulator.proc.poll() is not None
    assert not Path(f"/proc/{emulator.proc.pid}").exists()
