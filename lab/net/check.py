"""`check`: what an emulated link really does, measured beside what it is configured to do
(``concord net check``).

Two hosts, ``a`` and ``b``, each behind the emulation's common link (`Emulation.link`; the
per-peer overrides and spreads of a run are not measured). Measured with real packets
(`concord.lab.net.measure`): the round trip a → b → a of single UDP probes (median and 99th
percentile), the TCP throughput each way turned into the link's frame rate (a tbf cap counts
whole Ethernet frames; measured with the links' loss set to 0, so that what is compared with the
cap is the cap and not TCP's answer to loss), and the loss of stamped UDP datagrams a → b.
Each is compared with its configured value against the fidelity targets: RTT (median) and
rate within ±10 %, loss within ±20 %. The number of datagrams grows as the configured loss
shrinks (and its bursts lengthen) so that the spread of the measured loss stays within about a
tenth of it (at most `MAX_DATAGRAMS`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import asdict, dataclass

from concord.core.emulation import Emulation, HostLink, LinkSpec
from concord.lab.net.measure import datagrams, rtt_ms, throughput_mbit, wire_mbit
from concord.lab.net.topology import Net

TARGETS = {"rtt_ms": 0.10, "rate_mbit": 0.10, "loss": 0.20}
"""The fidelity targets: the largest relative error of each kind of quantity."""
MAX_DATAGRAMS = 100_000
_DATAGRAM_RATE = 5_000.0  # per second; 64-byte datagrams: ≈ 4 Mbit/s of frames


@dataclass(frozen=True)
class Row:
    """One quantity: ``configured`` (None: nothing configured to compare with), ``measured``,
    their relative error and whether it is within ``target`` (None: no target applies)."""

    quantity: str
    unit: str
    configured: float | None
    measured: float
    target: float | None

    @property
    def rel_err(self) -> float | None:
        if not self.configured:
            return None
        return abs(self.measured - self.configured) / self.configured

    @property
    def ok(self) -> bool:
        err = self.rel_err
        return self.target is None or err is None or err <= self.target

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "rel_err": self.rel_err, "ok": self.ok}


def _rtt(a: HostLink, b: HostLink) -> float:
    return a.up.delay_ms + b.down.delay_ms + b.up.delay_ms + a.down.delay_ms


def _rtt_p99(a: HostLink, b: HostLink) -> float | None:
    """The 99th percentile of the round trip when its four jitters add up as normal laws
    (clipping at ±3σ ignored); None without jitter."""
    sigma = math.sqrt(sum(s.jitter_ms**2 for s in (a.up, b.down, b.up, a.down)))
    return _rtt(a, b) + 2.326 * sigma if sigma else None


def _rate(send: LinkSpec, receive: LinkSpec) -> float | None:
    caps = [r for r in (send.rate_mbit, receive.rate_mbit) if r]
    return min(caps) if caps else None


def _loss(send: LinkSpec, receive: LinkSpec) -> float:
    return 1.0 - (1.0 - send.loss) * (1.0 - receive.loss)


def datagram_count(loss: float, burst: float = 1.0) -> int:
    """Datagrams to send so that about 100 runs of losses occur (losses come in runs of mean
    length ``burst``; σ of the measured loss ≈ 10 % of it), at least 5 000, at most
    `MAX_DATAGRAMS`."""
    return min(MAX_DATAGRAMS, max(5_000, math.ceil(100 * burst / loss))) if loss else 5_000


def _both(net: Net, link: HostLink) -> None:
    net.emulate(net["a"], link)
    net.emulate(net["b"], link)


def _rtt_rows(net: Net, link: HostLink, probes: int) -> list[Row]:
    late = 0.5 + 3 * (_rtt_p99(link, link) or _rtt(link, link)) / 1000  # s: a probe is lost
    rtts = sorted(rtt_ms(net["a"], net["b"], count=probes, interval=0.01, timeout=late))
    p99 = rtts[min(len(rtts) - 1, math.ceil(0.99 * len(rtts)) - 1)]
    return [
        Row("rtt_p50", "ms", _rtt(link, link), statistics.median(rtts), TARGETS["rtt_ms"]),
        Row("rtt_p99", "ms", _rtt_p99(link, link), p99, None),
    ]


def _rate_rows(net: Net, link: HostLink, seconds: float) -> list[Row]:
    a, b = net["a"], net["b"]
    _both(net, HostLink(*(dataclasses.replace(s, loss=0.0) for s in (link.up, link.down))))
    warmup = max(0.5, 5 * _rtt(link, link) / 1000)
    rows = []
    for name, src, dst in (("rate_a_to_b", a, b), ("rate_b_to_a", b, a)):
        goodput = throughput_mbit(src, dst, seconds=seconds + warmup, warmup=warmup)
        measured = wire_mbit(goodput, net.mtu)
        rows.append(Row(name, "Mbit/s", _rate(link.up, link.down), measured, TARGETS["rate_mbit"]))
    _both(net, link)
    return rows


def _loss_row(net: Net, link: HostLink) -> Row:
    loss = _loss(link.up, link.down)
    frames_per_s = (_rate(link.up, link.down) or 1e9) * 1e6 / 8 / 106  # 64 B datagram: 106 B
    rate = min(_DATAGRAM_RATE, 0.25 * frames_per_s)
    idle = 2.0 + _rtt(link, link) / 1000
    count = datagram_count(loss, max(link.up.loss_burst, link.down.loss_burst))
    got = datagrams(net["a"], net["b"], count=count, rate=rate, idle=idle)
    return Row("loss", "", loss if loss else None, got.loss, TARGETS["loss"])


def check(emulation: Emulation, *, probes: int = 100, seconds: float = 3.0) -> list[Row]:
    """Measure ``emulation``'s common link between two hosts (module docstring): ``probes``
    round trips, ``seconds`` of TCP each way. Raises `NetError` where namespaces are not
    permitted (`concord.lab.net.available`)."""
    link = emulation.link
    with Net.for_emulation(emulation, ["a", "b"]) as net:
        _both(net, link)
        return [
            *_rtt_rows(net, link, probes),
            *_rate_rows(net, link, seconds),
            _loss_row(net, link),
        ]
