"""The orchestrator's Prometheus metrics (`concord.runtime.telemetry`): the run's peers as the
orchestrator sees them (state, step, last heartbeat) and its consensus-control decisions.
Names: docs/deployment.md#metrics. Torch-free."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from concord.orchestrator.admission import PeerAdmission
from concord.protos.control_plane import Decision
from concord.runtime.telemetry import Registry

__all__ = ["OrchestratorMetrics"]

_DECLARED = (
    ("peers_live", "gauge", "Peers taking part in the run now."),
    ("peers_dropped", "gauge", "Peers dropped from the run (silent, failed, left)."),
    ("peer_step", "gauge", "Last step each peer reported (label peer)."),
    ("peer_heartbeat_age_seconds", "gauge", "Seconds since each peer was last heard (label peer)."),
    ("peer_live", "gauge", "1 while a peer takes part in the run, 0 once dropped (label peer)."),
    ("step", "gauge", "Step of the last consensus-control decision."),
    ("round", "gauge", "Round of the last decision (0-based)."),
    ("theta", "gauge", "Θ, the mean of the peers' consensus statistics, at the last decision."),
    ("target", "gauge", "The consensus-control target at the last decision."),
    ("decisions_total", "counter", "Repeat/stop decisions published."),
    ("repeats_total", "counter", "Decisions that asked for another gossip round."),
    ("payloads_rejected_total", "counter", "Control-plane payloads refused (invalid, unsigned)."),
    ("stats_refused_total", "counter", "Statistics refused (unknown peer, closed step, …)."),
)


class OrchestratorMetrics:
    """``concord_orchestrator_*``: updated by `decided`, the rest read at scrape time from
    ``admission``'s snapshot of its peers and the ``counters`` callback."""

    def __init__(
        self,
        run: str,
        admission: PeerAdmission,
        counters: Callable[[], tuple[int, int]],
    ) -> None:
        self.registry = Registry("concord_orchestrator", {"run": run})
        for name, kind, help in _DECLARED:
            self.registry.declare(name, kind, help)
        self.admission = admission
        self.counters = counters  # () → (payloads rejected, statistics refused)
        self.registry.collector(self._collect)

    def decided(self, decisions: Iterable[Decision]) -> None:
        r = self.registry
        for d in decisions:
            r.inc("decisions_total")
            r.inc("repeats_total", int(d.repeat))
            r.set("step", d.step)
            r.set("round", d.round)
            if d.statistic is not None:
                r.set("theta", d.statistic)
            if d.target is not None:
                r.set("target", d.target)

    def _collect(self) -> None:
        r, peers = self.registry, self.admission.peers
        now = time.monotonic()
        dropped = sum(info.gone for info in peers.values())
        r.set("peers_live", len(peers) - dropped)
        r.set("peers_dropped", dropped)
        for peer, info in peers.items():
            labels = {"peer": str(peer)}
            r.set("peer_step", info.step, labels)
            r.set("peer_live", int(not info.gone), labels)
            if info.last_seen:
                r.set("peer_heartbeat_age_seconds", max(0.0, now - info.last_seen), labels)
        rejected, refused = self.counters()
        r.set("payloads_rejected_total", rejected)
        r.set("stats_refused_total", refused)
