"""The orchestrator's side of ``ada-feedback`` (`concord.core.graphs.adagraph`), sans-io: statistics
in, graph decisions out (no MQTT, no clock).

In an ada-feedback run every peer publishes, after each gossip step, the θ_i of the step's last
round and its ‖g_i‖ (a `Stats`). `GraphBook` files them by step; a step is complete when every
*expected* peer (live, still training) reported it, or ``timeout`` seconds after its first
statistic (decided on what arrived). Complete steps feed
`concord.core.graphs.adagraph.GraphFeedback` in step
order — the very controller the vectorized engine runs — and each decision it takes (one per
decision point, K changed or not) is returned for the orchestrator to publish as a new schedule
version effective at the decision's step + lag. A step that completes after a later one was fed
is stale and ignored (counted); the controller decides a decision point it never saw on what its
window holds, so peers waiting for it are released.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from concord.core.control.plan import PhasePlan
from concord.core.graphs.adagraph import FeedbackDecision, GraphFeedback
from concord.orchestrator.pending import take_due
from concord.protos.control_plane import Stats


@dataclass
class PendingStep:
    step: int
    opened: float  # clock value when its first statistic arrived
    stats: dict[int, Stats] = field(default_factory=dict)


class GraphBook:
    """Collects the per-step statistics of an ada-feedback run (module docstring)."""

    def __init__(self, plan: PhasePlan, feedback: GraphFeedback, *, timeout: float = 10.0) -> None:
        self.plan = plan
        self.feedback = feedback
        self.timeout = timeout
        self.pending: dict[int, PendingStep] = {}
        self.fed = -1  # last step fed to the controller
        self.partial = 0  # steps decided on a timeout, without every expected peer
        self.ignored = 0  # duplicates, stale steps, steps outside the plan

    def add(self, stats: Stats, expected: set[int], now: float) -> list[FeedbackDecision]:
        """File one peer's statistic; returns the decisions to publish (possibly none)."""
        if stats.step <= self.fed or stats.step >= self.plan.total_steps:
            self.ignored += 1
            return []
        pending = self.pending.get(stats.step)
        if pending is None:
            pending = self.pending[stats.step] = PendingStep(stats.step, now)
        if stats.peer in pending.stats:
            self.ignored += 1  # a duplicate: the first one counts
            return []
        pending.stats[stats.peer] = stats
        return self._complete(expected, now)

    def expire(self, expected: set[int], now: float) -> list[FeedbackDecision]:
        """Re-check pending steps (a peer left, or time passed)."""
        return self._complete(expected, now)

    def _complete(self, expected: set[int], now: float) -> list[FeedbackDecision]:
        out: list[FeedbackDecision] = []
        for step, p, done in take_due(self.pending, expected, now, self.timeout, in_order=True):
            if step <= self.fed:
                self.ignored += 1
                continue
            self.partial += not done
            stats = [p.stats[k] for k in sorted(p.stats)]
            phase = self.plan.phase_at(step).index
            out.extend(
                self.feedback.observe(
                    step, phase, [s.theta for s in stats], [s.grad_norm for s in stats]
                )
            )
            self.fed = step
        return out
