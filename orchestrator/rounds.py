"""The orchestrator's decision logic, sans-io: statistics in, decisions out (no MQTT, no clock).

`RoundBook` collects the peers' per-round `Stats` of the current stage and tells when a round is
complete, i.e. every *expected* peer (live and still training) reported it. Then:

* stage ``calibrate`` (constant targets): the round's Θ is recorded per phase
  (`concord.core.control.controller.CalibrationRecorder`); no decision is sent, peers run
  uncontrolled;
* stage ``train``, barrier mode: `concord.core.control.controller.ConsensusController` answers
  repeat/stop after every round and the decision is published for that (step, round);
* stage ``train``, lagged mode: peers run the rounds planned for the step without waiting; after
  the planned last round the controller's ``rounds_next`` is published and peers use it for step
  + ``control.lag`` (also when the step is closed incomplete because the next one began);
* stage ``train``, mode ``fixed`` (either protocol): every peer runs ``control.rounds`` rounds
  per controlled step on its own (`concord.peer.control`) and sends the step's statistics with its
  step record; the rounds go through the controller and into the records as above, but nothing
  is published: nobody waits for a decision.

Θ of a round is ``sqrt(mean_i θ_i)`` over the peers that reported (with ``control.statistic =
"sketch"`` the estimate Ξ̂ of the consensus distance from their sketches instead; a statistic
without a sketch of `SKETCH_SIZE` floats is then ignored), the adaptive target's gradient
norm the mean of the peers' ‖g_i‖ of round 1 — both computed by core
(`concord.core.control.statistic`, the very float arithmetic the vectorized engine's
`concord.core.control.consensus.theta` runs). A round that stays incomplete for ``timeout``
seconds (a peer vanished without a Last-Will yet, a lost message) is decided on what arrived, so
one slow peer never stalls the others for longer than that.

Statistics are not trusted (the control plane is not authenticated): besides the schema's checks
(finite, non-negative) a statistic is *ignored* when it is for another stage, a round already
decided, a step behind the newest one begun, a step or round outside the plan or
``control.max_rounds``, or a duplicate; and *refused* (``refused``) when its step is not open:
more than `OPEN_AHEAD` steps that report statistics (controlled steps; every step while
calibrating) ahead of ``base`` — the step the peers are known to be at (the caller's: the slowest
expected peer's last reported step) or the newest step this book decided, whichever is later. A
forged statistic for a far step would otherwise open a round there, be decided on its timeout,
and make every real statistic "stale".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from concord.core.control.controller import Calibration, CalibrationRecorder, ConsensusController
from concord.core.control.plan import PhasePlan
from concord.core.control.statistic import (
    SKETCH_SIZE,
    mean_of,
    theta_from_locals,
    xi_from_sketches,
)
from concord.orchestrator.pending import take_due
from concord.protos.control_plane import Decision, Stats

# the names this module has always offered for core's arithmetic (Θ of a round, a mean)
estimator = theta_from_locals
mean = mean_of


def round_statistic(statistic: str, stats: list[Stats]) -> float:
    """The controller's statistic of one round from the peers' `Stats`: Θ from their θ_i, or
    (``statistic`` "sketch") the estimate Ξ̂ of the consensus distance from their sketches —
    the arithmetic the vectorized engine runs (`concord.core.control.statistic`)."""
    if statistic == "sketch":
        return xi_from_sketches(s.sketch for s in stats)
    return theta_from_locals(s.theta for s in stats)


OPEN_AHEAD = 8  # statistics-reporting steps past the peers' known step that are still open


@dataclass
class PendingRound:
    step: int
    round: int
    opened: float  # clock value when its first statistic arrived
    stats: dict[int, Stats] = field(default_factory=dict)


@dataclass
class RoundRecord:
    """One decided round, for ``control.jsonl`` and the progress view."""

    stage: str
    step: int
    round: int
    peers: int
    theta: float
    target: float | None
    repeat: bool
    rounds_next: int | None
    reason: str
    partial: bool  # decided on a timeout, without every expected peer

    def to_json(self) -> dict[str, object]:
        return {"kind": "round", **self.__dict__}


class RoundBook:
    """Collects one stage's statistics and produces the decisions (see the module docstring)."""

    def __init__(
        self,
        stage: str,
        plan: PhasePlan,
        *,
        controller: ConsensusController | None = None,
        recorder: CalibrationRecorder | None = None,
        timeout: float = 10.0,
    ) -> None:
        if stage == "train" and controller is None:
            raise ValueError("the train stage needs a ConsensusController")
        if stage == "calibrate" and recorder is None:
            raise ValueError("the calibrate stage needs a CalibrationRecorder")
        self.stage = stage
        self.plan = plan
        self.controller = controller
        self.recorder = recorder
        self.timeout = timeout
        self.pending: dict[tuple[int, int], PendingRound] = {}
        self.decided: set[tuple[int, int]] = set()
        self.records: list[RoundRecord] = []
        self._step: int | None = None  # step the controller is in
        self._round = 0  # last round fed to the controller in that step
        self._stats: list[float] = []
        self._latest: int | None = None  # newest step the controller began
        self.max_rounds = controller.config.max_rounds if controller is not None else 1
        # what a round is reduced to: "theta" (Θ from the θ_i) or "sketch" (Ξ̂ from the s_i)
        self.statistic = (
            controller.config.statistic
            if controller is not None
            else recorder.statistic
            if recorder is not None
            else "theta"
        )
        # mode fixed: rounds are recorded, no decision is published (module docstring)
        self.silent = controller is not None and controller.config.mode == "fixed"
        self.ignored = 0  # duplicates, rounds already decided, steps outside the plan / stale
        self.refused = 0  # statistics for steps that are not open (module docstring)
        self._newest: int | None = None  # newest step a round was decided for
        # called with the step after the controller ended it (the orchestrator's checkpoint)
        self.on_end: Callable[[int], None] | None = None

    @property
    def lagged(self) -> bool:
        return self.controller is not None and self.controller.config.lagged

    # -- input ---------------------------------------------------------------------------------

    def add(
        self, stats: Stats, expected: set[int], now: float, base: int | None = None
    ) -> list[Decision]:
        """File one peer's statistic; returns the decisions to publish (possibly none).
        ``base``: the step the peers are known to be at (None: no window, module docstring)."""
        key = (stats.step, stats.round)
        stale = self._latest is not None and stats.step < self._latest
        outside = stats.step >= self.plan.total_steps or stats.round > self.max_rounds
        unsketched = self.statistic == "sketch" and len(stats.sketch) != SKETCH_SIZE
        if stats.stage != self.stage or key in self.decided or stale or outside or unsketched:
            self.ignored += 1
            return []
        if base is not None and not self.is_open(stats.step, base):
            self.refused += 1
            return []
        pending = self.pending.get(key)
        if pending is None:
            pending = self.pending[key] = PendingRound(stats.step, stats.round, now)
        if stats.peer in pending.stats:
            self.ignored += 1  # a duplicate: the first one counts
            return []
        pending.stats[stats.peer] = stats
        return self._complete(expected, now)

    def is_open(self, step: int, base: int) -> bool:
        """Fewer than `OPEN_AHEAD` statistics-reporting steps lie strictly between the later of
        ``base`` and the newest decided step, and ``step``."""
        low = max(base, -1 if self._newest is None else self._newest) + 1
        if step <= low:
            return True
        if self.stage == "calibrate":
            between = step - low
        else:
            between = sum(
                max(0, min(p.end, step) - max(p.start, low))
                for p in self.plan.phases
                if p.controlled
            )
        return between < OPEN_AHEAD

    def expire(self, expected: set[int], now: float) -> list[Decision]:
        """Re-check pending rounds (a peer left, or time passed); decide the complete or stale."""
        return self._complete(expected, now)

    def _complete(self, expected: set[int], now: float) -> list[Decision]:
        out: list[Decision] = []
        for key, p, done in take_due(self.pending, expected, now, self.timeout, in_order=False):
            self.decided.add(key)
            self._newest = p.step if self._newest is None else max(self._newest, p.step)
            decisions = self._decide(p, partial=not done)
            if not self.silent:
                out.extend(decisions)
        return out

    # -- decisions -----------------------------------------------------------------------------

    def _decide(self, p: PendingRound, *, partial: bool) -> list[Decision]:
        stats = [p.stats[k] for k in sorted(p.stats)]
        theta = round_statistic(self.statistic, stats)
        phase = self.plan.phase_at(p.step)
        if self.stage == "calibrate":
            assert self.recorder is not None
            self.recorder.observe(p.step, phase.index, theta)
            self._record(p, len(stats), theta, None, False, None, "calibration", partial)
            return []
        ctl = self.controller
        assert ctl is not None
        if self._latest is not None and p.step < self._latest:  # went stale behind a newer step
            self._record(p, len(stats), theta, None, False, None, "resync", partial)
            return [Decision(step=p.step, round=p.round, repeat=False, reason="resync")]
        out = []
        if self._step != p.step:
            out = self._close_step()
            if p.round != 1:  # the step's first rounds were lost (broker outage): move on
                self._record(p, len(stats), theta, None, False, None, "resync", partial)
                return [*out, Decision(step=p.step, round=p.round, repeat=False, reason="resync")]
            ctl.begin_step(p.step, mean_of(s.grad_norm for s in stats))
            self._step, self._round, self._stats, self._latest = p.step, 0, [], p.step
        if p.round != self._round + 1:
            self._record(p, len(stats), theta, None, False, None, "resync", partial)
            return [*out, Decision(step=p.step, round=p.round, repeat=False, reason="resync")]
        d = ctl.after_round(p.step, p.round, theta)
        self._round = p.round
        self._stats.append(theta)
        if not d.repeat:
            ctl.end_step(p.step, self._stats)
            self._step, self._stats = None, []
            self._ended(p.step)
        self._record(p, len(stats), theta, d.target, d.repeat, d.rounds_next, d.reason, partial)
        if self.lagged and d.repeat:
            return out  # peers follow the plan within a step; only its end is published
        decision = Decision(
            step=p.step,
            round=p.round,
            repeat=d.repeat,
            target=d.target,
            statistic=theta,
            rounds_next=d.rounds_next,
            reason=d.reason,
        )
        return [*out, decision]

    def _close_step(self) -> list[Decision]:
        """Abandon a step whose last rounds never completed (peers moved on without us). In
        lagged mode the plan it yields for step + lag is published all the same, so peers that
        wait for it are not left to their decision timeout."""
        if self._step is None or self.controller is None:
            return []
        step, stats = self._step, self._stats
        self._step, self._stats = None, []
        ctl = self.controller
        ctl.end_step(step, stats)  # never empty: begun with round 1
        self._ended(step)
        rounds = ctl.planned(step + ctl.config.lag)
        if not self.lagged or rounds is None:
            return []
        return [
            Decision(
                step=step,
                round=len(stats),
                repeat=False,
                target=ctl.target(step),
                statistic=stats[-1],
                rounds_next=rounds,
                reason="closed-incomplete",
            )
        ]

    def _ended(self, step: int) -> None:
        if self.on_end is not None:
            self.on_end(step)

    def _record(
        self,
        p: PendingRound,
        peers: int,
        theta: float,
        target: float | None,
        repeat: bool,
        rounds_next: int | None,
        reason: str,
        partial: bool,
    ) -> None:
        self.records.append(
            RoundRecord(
                self.stage,
                p.step,
                p.round,
                peers,
                theta,
                target,
                repeat,
                rounds_next,
                reason,
                partial,
            )
        )

    def calibration(self) -> Calibration:
        if self.recorder is None:
            raise ValueError("not a calibration stage")
        return self.recorder.result()
