"""The link emulator's queueing and loss logic (`concord.lab.net.linkmodel`) and its control
requests (`concord.lab.net.emulator.handle`), without root: packets are built here as bytes.

Statistical tolerances: every draw comes from a seeded `random.Random`, so each test is
deterministic; the bounds are still the ones a fresh seed would pass with high probability
(stated per test), so that they check the law and not one lucky sequence."""

from __future__ import annotations

import ipaddress
import random
import statistics
import struct

import pytest

from concord.core.emulation import HostLink
from concord.lab.net.emulator import handle
from concord.lab.net.linkmodel import DelayLine, DelaySampler, LossModel, flow_key

A, B, C = "10.0.0.1", "10.0.0.2", "10.0.0.3"


def packet(src: str, dst: str, sport: int = 1000, dport: int = 2000, proto: int = 17) -> bytes:
    """A minimal IPv4 packet (20-byte header) with a UDP/TCP-like port pair."""
    header = struct.pack(
        "!BBHHHBBH4s4s",
        0x45, 0, 28, 0, 0, 64, proto, 0,
        ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed,
    )  # fmt: skip
    return header + struct.pack("!HHI", sport, dport, 0)


def addr(ip: str) -> bytes:
    return ipaddress.IPv4Address(ip).packed


def test_packets_leave_after_their_delay_in_release_order() -> None:
    line = DelayLine()
    line.set_link(addr(B), HostLink.both(delay_ms=10))
    line.set_link(addr(C), HostLink.both(delay_ms=3))
    to_b, to_c = packet(A, B), packet(A, C)
    assert line.admit(to_b, 0.0) == pytest.approx(0.010)
    assert line.admit(to_c, 0.001) == pytest.approx(0.004)
    assert line.held == 2
    assert line.next_release() == pytest.approx(0.004)
    assert line.due(0.0039) == []
    assert line.due(0.0041) == [to_c]  # admitted later, released first: another path
    assert line.due(0.0099) == []
    assert line.due(0.0101) == [to_b]
    assert line.next_release() is None
    assert (line.admitted, line.released, line.dropped) == (2, 2, 0)


def test_a_path_adds_the_senders_up_and_the_receivers_down() -> None:
    line = DelayLine()
    line.set_link(addr(A), HostLink.both(delay_ms=5))
    line.set_link(addr(B), HostLink.both(delay_ms=7))
    assert line.admit(packet(A, B), 1.0) == pytest.approx(1.012)
    line.set_link(addr(B), HostLink(up=HostLink.both(delay_ms=7).up))  # down: 0 ms
    assert line.admit(packet(A, B, sport=1), 1.0) == pytest.approx(1.005)


def test_unemulated_hosts_pass_at_once_and_are_not_held() -> None:
    line = DelayLine()
    assert line.admit(packet(A, B), 2.0) == 2.0
    assert line.held == 0
    assert line.released == 1


def test_jitter_stays_within_its_bounds_with_the_stated_spread() -> None:
    """delay + N(0, σ) clipped to ±3σ: all samples in [d − 3σ, d + 3σ]; the clipping leaves a
    standard deviation of 0.9866σ. n = 20 000: the sample std's standard error is
    σ/√(2n) = 0.5 % of σ and the mean's σ/√n = 0.035 ms, so ±3 % and ±0.2 ms are > 5 SE."""
    sampler = DelaySampler(20.0, 5.0, random.Random(1))
    ms = [sampler.sample() * 1e3 for _ in range(20_000)]
    assert min(ms) >= 5.0
    assert max(ms) <= 35.0
    assert statistics.fmean(ms) == pytest.approx(20.0, abs=0.2)
    assert statistics.pstdev(ms) / 5.0 == pytest.approx(0.9866, abs=0.03)


def test_jitter_never_makes_a_delay_negative() -> None:
    sampler = DelaySampler(1.0, 5.0, random.Random(2))
    ms = [sampler.sample() * 1e3 for _ in range(5_000)]
    assert min(ms) == 0.0  # clipped, often: P(d + X < 0) = P(X < -0.2σ) ≈ 42 %
    assert max(ms) <= 16.0


def _released_order(line: DelayLine, packets: list[bytes], gap: float) -> list[bytes]:
    """The order in which the emulator's loop would write ``packets`` arriving ``gap`` s apart:
    what is due first, then a packet released at once, and the rest at the end."""
    out = []
    for i, p in enumerate(packets):
        now = i * gap
        out += line.due(now)
        release = line.admit(p, now)
        if release is not None and release <= now:
            out.append(p)
    return out + line.due(1e9)


def test_jitter_does_not_reorder_a_flow_unless_asked() -> None:
    """Packets 1 ms apart with 10 ms of jitter would overtake each other constantly; a flow's
    packets still leave in order, while two flows (other ports) interleave freely."""
    flow1 = [packet(A, B, sport=1) + bytes([i]) for i in range(200)]
    flow2 = [packet(A, B, sport=2) + bytes([i]) for i in range(200)]
    mixed = [p for pair in zip(flow1, flow2, strict=True) for p in pair]
    line = DelayLine(seed=3)
    line.set_link(addr(B), HostLink.both(delay_ms=20, jitter_ms=10))
    out = _released_order(line, mixed, 0.0005)
    assert [p for p in out if p in flow1] == flow1
    assert [p for p in out if p in flow2] == flow2
    assert out != mixed  # the flows did interleave differently from their arrival

    line = DelayLine(seed=3, reorder=True)
    line.set_link(addr(B), HostLink.both(delay_ms=20, jitter_ms=10))
    out = _released_order(line, flow1, 0.001)
    assert out != flow1  # asked for: reordered
    assert sorted(out) == sorted(flow1)  # and nothing lost


def test_flows_are_told_apart_by_protocol_addresses_and_ports() -> None:
    assert flow_key(packet(A, B, 1, 2)) != flow_key(packet(A, B, 1, 3))
    assert flow_key(packet(A, B, 1, 2)) != flow_key(packet(B, A, 1, 2))
    assert flow_key(packet(A, B, 1, 2, proto=6)) != flow_key(packet(A, B, 1, 2, proto=17))
    # ICMP has no ports: the rest of its header does not split a flow
    assert flow_key(packet(A, B, 1, 2, proto=1)) == flow_key(packet(A, B, 9, 9, proto=1))


def test_bernoulli_loss_rate_within_binomial_tolerance() -> None:
    """n = 40 000 at p = 0.05: the count's binomial σ = √(n p (1 − p)) = 43.6; ±4σ (a fresh
    seed fails with probability 6e-5)."""
    n, p = 40_000, 0.05
    model = LossModel(p, 1.0, random.Random(4))
    lost = sum(model.lose() for _ in range(n))
    sigma = (n * p * (1 - p)) ** 0.5
    assert abs(lost - n * p) <= 4 * sigma


def _runs(fates: list[bool]) -> list[int]:
    """Lengths of the runs of consecutive losses."""
    runs, current = [], 0
    for lost in fates:
        if lost:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    return runs


def test_gilbert_elliott_keeps_the_mean_loss_and_makes_bursts() -> None:
    """loss 0.05 in bursts of mean 4 over n = 200 000 packets. The chain's correlation
    ρ = 1 − p_gb − p_bg = 0.737 inflates the binomial variance by (1 + ρ)/(1 − ρ) = 6.6: σ of
    the loss fraction ≈ 0.0013, so ±0.005 is > 3.8σ. ~2 500 bursts of geometric length (σ 3.5):
    the mean burst's SE is 0.07, ±0.35 is 5 SE. Bernoulli's runs average 1/(1 − p) = 1.05."""
    n = 200_000
    model = LossModel(0.05, 4.0, random.Random(5))
    fates = [model.lose() for _ in range(n)]
    assert sum(fates) / n == pytest.approx(0.05, abs=0.005)
    assert statistics.fmean(_runs(fates)) == pytest.approx(4.0, abs=0.35)
    bernoulli = LossModel(0.05, 1.0, random.Random(5))
    assert statistics.fmean(_runs([bernoulli.lose() for _ in range(n)])) < 1.1


def test_lost_packets_are_counted_and_never_held() -> None:
    line = DelayLine(seed=6)
    line.set_link(addr(B), HostLink.both(delay_ms=5, loss=0.5))
    fates = [line.admit(packet(A, B, sport=i), 0.0) for i in range(1_000)]
    lost = fates.count(None)
    assert 400 < lost < 600  # binomial σ = 15.8 around 500
    assert line.dropped == lost
    assert line.held == 1_000 - lost


def test_no_loss_and_no_delay_cost_no_draws() -> None:
    rng = random.Random(7)
    state = rng.getstate()
    assert not LossModel(0.0, 1.0, rng).lose()
    assert DelaySampler(4.0, 0.0, rng).sample() == 0.004
    assert rng.getstate() == state


def test_control_requests_set_links_and_report() -> None:
    line = DelayLine()
    up = {"delay_ms": 0.0, "jitter_ms": 0.0, "loss": 0.0, "loss_burst": 1.0, "rate_mbit": 0.0}
    down = {**up, "delay_ms": 8.0}
    assert handle(line, {"op": "link", "ip": B, "up": up, "down": down}) == {"ok": True}
    assert line.admit(packet(A, B), 0.0) == pytest.approx(0.008)
    stats = handle(line, {"op": "stats"})
    assert (stats["admitted"], stats["held"], stats["bytes"]) == (1, 1, 28)
    assert stats["cpu_s"] > 0
    bad = handle(line, {"op": "link", "ip": B, "up": {**up, "loss": 0.9}, "down": down})
    assert "loss" in bad["error"]
    assert "0 ≤ loss ≤ 0.5" in bad["error"]
    assert (
        "not-an-ip"
        in handle(line, {"op": "link", "ip": "not-an-ip", "up": up, "down": up})["error"]
    )
    assert "unknown op" in handle(line, {"op": "reboot"})["error"]
