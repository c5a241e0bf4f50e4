"""Schedule publication, sans-io: what the orchestrator tells peers about the run's shape (no
MQTT; the caller publishes the messages this module builds).

* the phase plan (`plan_message`): total steps, phases, learning-rate schedule and the control
  settings every peer runs;
* the schedule (`Schedules.next`, retained; the run's graph settings:
  `concord.orchestrator.options.ScheduleOptions`): a version number, the live peers and their gRPC
  addresses, and the topology of every phase. Version 1 (``initial``) is effective at step 0;
  every later one — a *repair* after a peer left, or an adaptive-graph decision — at an
  ``effective_step`` ahead of the newest step any live peer reported (two steps, or the
  decision's step + lag), so all peers switch at the same step;
* adaptive graphs (`concord.core.graphs.adagraph`): the per-phase topologies start as
  ada-schedule's graphs or ada-feedback's ``exponential:K`` (`Schedules.start`), and every
  ada-feedback decision point (`Schedules.on_feedback`) moves every phase to the decided K and
  stamps the schedule with the step it was decided at. `Schedules.is_graph_statistic` tells
  which statistics feed that feedback (uncontrolled train-stage steps) rather than the round
  book.

A repaired schedule is built when it is about to be sent (the caller's publishing task), so it
carries the live peers and topologies of that moment.
"""

from __future__ import annotations

from typing import Any

from concord.core.config import RunConfig
from concord.core.control.plan import LRSchedule, PhasePlan
from concord.core.graphs.adagraph import FeedbackDecision, initial_topologies
from concord.core.graphs.topology import exponential_name
from concord.orchestrator.options import ScheduleOptions
from concord.protos.control_plane import Plan, Schedule, Stats

REPAIR_AHEAD = 2  # steps past the newest step a live peer reported, for a repaired schedule


def plan_message(
    cfg: RunConfig,
    plan: PhasePlan,
    lr: LRSchedule,
    *,
    store: str | None = None,
    store_prefix: str = "",
) -> Plan:
    """The retained ``plan``: the phase plan, learning rates and control settings; ``store``:
    the torch.distributed store the orchestrator hosts (`concord.orchestrator.store`) and the
    secret prefix of its keys."""
    c = cfg.control
    return Plan(
        total_steps=plan.total_steps,
        phases=plan.to_dict(),
        lr=lr.to_dict(),
        control={
            "mode": c.mode,
            "factor": c.factor,
            "max_rounds": c.max_rounds,
            "lagged": c.lagged,
            "lag": c.lag,
            "rounds": c.rounds,
            "phases": cfg.controlled_phases(),
        },
        store=store,
        store_prefix=store_prefix,
    )


class Schedules:
    """The schedule versions of one run (see the module docstring)."""

    def __init__(self, options: ScheduleOptions) -> None:
        self.options = options
        self.plan: PhasePlan | None = None
        self.version = 0  # of the last schedule built
        self.topologies: dict[int, str] = {}  # phase index → topology published (adaptive)
        self.decided_at: int | None = None  # ada-feedback: the decision they reflect

    def start(self, plan: PhasePlan) -> None:
        """The plan is known: the schedule carries each phase's topology (adaptive graphs)."""
        o = self.options
        self.plan = plan
        self.topologies = initial_topologies(o.algorithm, o.hyper, o.peers, len(plan.phases))

    def next(
        self,
        reason: str,
        live: list[int],
        addresses: list[str],
        newest_step: int,
        effective_step: int | None = None,
    ) -> Schedule:
        """The next schedule version over the ``live`` peers (sorted, with their ``addresses``);
        ``newest_step``: the newest step any of them reported (for a repair's effective step)."""
        assert self.plan is not None, "Schedules.start first"
        self.version += 1
        if effective_step is None:
            effective_step = newest_step + REPAIR_AHEAD if self.version > 1 else 0
        phases = [
            {"index": p.index, "topology": self.topologies.get(p.index, p.topology)}
            for p in self.plan.phases
        ]
        o = self.options
        return Schedule(
            version=self.version,
            peers=live,
            topology=o.topology,
            weights=o.weights,
            kappa=o.kappa,
            seed=o.seed,
            phases=phases,
            reason=reason,
            addresses=addresses,
            effective_step=effective_step,
            decided_at=self.decided_at,
        )

    @staticmethod
    def row(schedule: Schedule) -> dict[str, Any]:
        """One line of ``schedules.jsonl``."""
        return {
            "version": schedule.version,
            "peers": schedule.peers,
            "reason": schedule.reason,
            "effective_step": schedule.effective_step,
            "topologies": [p["topology"] for p in schedule.phases],
            "decided_at": schedule.decided_at,
        }

    def is_graph_statistic(self, stats: Stats) -> bool:
        """An ada-feedback statistic: a train-stage step that consensus control does not run
        (those go to the graph book, never to the round book)."""
        assert self.plan is not None
        if stats.stage != "train" or not 0 <= stats.step < self.plan.total_steps:
            return False
        return not self.plan.phase_at(stats.step).controlled

    def on_feedback(self, decision: FeedbackDecision) -> str:
        """An ada-feedback decision point: every phase moves to the decided K (the graph may be
        unchanged: peers wait for the decision, not for a change). Returns the reason of the
        schedule version to publish, effective at ``decision.effective``."""
        assert self.plan is not None
        d = decision
        self.topologies = {p.index: exponential_name(d.k_to) for p in self.plan.phases}
        self.decided_at = d.step
        return f"ada-feedback step {d.step}: K {d.k_from} -> {d.k_to} ({d.reason})"
