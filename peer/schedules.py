"""Which schedule an orchestrated peer holds in force, and which it may apply at all.

A received schedule is applied only if `ScheduleCheck` accepts it (the control plane is not
authenticated; a retained forged or stale schedule must not crash or mislead the peer): it names
this run's topology, weights, κ and seed; its peers are the ones this peer expects (version 1:
every peer of the run; later: any peers of the run — dropped ones, or ones added back after a
restart — with a version newer than the one in force) and include this peer; each peer that stays
keeps its address, one added back comes with its new one (this peer's is the one it advertised); its
phase indices are the plan's; and every phase's topology yields a valid mixing matrix over its
peers (core's builder and validation: symmetric doubly stochastic, column-stochastic for push-sum
topologies, which only push-sum algorithms may use). Otherwise it is refused with a logged reason
(`concord.peer.control.ControlClient`) and the peer keeps its current schedule.

`Membership` keeps the schedule applied and a pending newer one (a repaired schedule, or an
ada-feedback decision), puts the newer one in force at its effective step and judges each
received frame against the schedule in force at that frame's step.
"""

from __future__ import annotations

from concord.core.config import RunConfig
from concord.core.control.plan import Phase
from concord.core.graphs.adagraph import FeedbackConfig
from concord.core.graphs.mixing import validate_column_stochastic, validate_mixing
from concord.core.graphs.topology import (
    exponential_k,
    exponential_name,
    make_schedule,
    max_exponential_k,
    topology_spec,
)
from concord.core.loop import StepRunner
from concord.peer.control import ControlClient
from concord.peer.serde import TENSOR_ALLREDUCE
from concord.protos.control_plane import Schedule

__all__ = ["Membership", "ScheduleCheck", "phase_topologies"]


def phase_topologies(schedule: Schedule) -> dict[int, str | None]:
    """Phase index → the topology the schedule gives it (None: the run's topology)."""
    return {int(p["index"]): p["topology"] for p in schedule.phases}


class ScheduleCheck:
    """Whether a received schedule may be applied by peer ``peer_id`` (module docstring): called
    with the candidate and the schedule accepted so far; returns why it is refused, or None."""

    def __init__(self, cfg: RunConfig, peer_id: int) -> None:
        self.cfg = cfg
        self.peer_id = peer_id
        self.advertise = ""  # this peer's own address, once known (`OrchestratedCoordination.join`)
        self.phases: int | None = None  # number of phases of the plan, once known
        self._mixing: dict[tuple[str, int], str | None] = {}

    def __call__(self, s: Schedule, current: Schedule | None) -> str | None:
        cfg, me = self.cfg, self.peer_id
        ours = (cfg.topology, cfg.weights, cfg.kappa, cfg.seed)
        theirs = (s.topology, s.weights, s.kappa, s.seed)
        if theirs != ours:
            return f"topology/weights/kappa/seed {theirs} are not this run's {ours}"
        members = set(s.peers)
        foreign = sorted(m for m in members if not 0 <= m < cfg.peers)
        if foreign:
            return f"peers {foreign} are not peers of this run (0..{cfg.peers - 1})"
        if me not in members:
            return f"it does not include this peer ({me}); a peer is never told to leave"
        everyone = set(range(cfg.peers))
        if s.version <= 1 and members != everyone:
            missing = sorted(everyone - members)
            return f"version {s.version} must list every peer of the run; missing {missing}"
        if current is not None and s.version <= current.version:
            return f"version {s.version} is not newer than version {current.version} in force"
        if len(s.addresses) != len(s.peers):
            return f"{len(s.addresses)} addresses for {len(s.peers)} peers"
        address = dict(zip(s.peers, s.addresses, strict=True))
        if self.advertise and address[me] != self.advertise:
            return f"it gives this peer the address {address[me]!r}, not {self.advertise!r}"
        if current is not None and len(current.addresses) == len(current.peers):
            # a peer keeps its address while it stays in; one added back (re-admitted after a
            # restart) comes with the address it announced now
            known = dict(zip(current.peers, current.addresses, strict=True))
            moved = sorted(p for p in members if known.get(p, address[p]) != address[p])
            if moved:
                return f"it changes the addresses of peers {moved}"
        return self._phases_problem(s)

    def _phases_problem(self, s: Schedule) -> str | None:
        indices = [int(p["index"]) for p in s.phases]
        if len(set(indices)) != len(indices) or any(i < 1 for i in indices):
            return f"phase indices {indices} must be distinct and >= 1"
        if self.phases is not None and any(i > self.phases for i in indices):
            return f"phase indices {indices} beyond the plan's {self.phases} phases"
        names = {p["topology"] or self.cfg.topology for p in s.phases} | {self.cfg.topology}
        for name in sorted(names):
            why = self.mixing_problem(name, len(s.peers))
            if why is not None:
                return why
        return None

    def mixing_problem(self, name: str, m: int) -> str | None:
        """Why topology ``name`` over ``m`` peers does not give this run valid mixing matrices
        (built and validated with core's code, as `concord.core.control.runplan` builds them)."""
        key = (name, m)
        if key not in self._mixing:
            self._mixing[key] = self._build_problem(name, m)
        return self._mixing[key]

    def _build_problem(self, name: str, m: int) -> str | None:
        cfg = self.cfg
        if name.startswith("file:") and name != cfg.topology:
            return f"topology {name!r} is not this run's edge-list file"
        try:
            directed = topology_spec(name).directed
        except Exception as exc:  # an unknown name is a refusal, like every problem below
            return f"topology {name!r} over {m} peers: {exc}"
        if directed and not cfg.spec.directed:
            algorithm = cfg.algorithm
            return f"topology {name!r} is directed; algorithm {algorithm!r} needs symmetric W"
        if m < 2:
            return None  # a lone survivor keeps its own model
        k = exponential_k(name)
        if k is not None and name != "ring":
            name = exponential_name(min(k, max_exponential_k(m)))
        try:
            schedule = make_schedule(name, m, weights=cfg.weights, kappa=cfg.kappa, seed=cfg.seed)
            W = schedule.matrix(0)
            what = f"topology {name!r} over {m} peers"
            if schedule.directed:
                validate_column_stochastic(W, what=what)
            else:
                validate_mixing(W, what=what)
        except Exception as exc:  # unknown names, bad sizes, invalid matrices: all refusals
            return f"topology {name!r} over {m} peers: {exc}"
        return None


class Membership:
    """Which peers gossip at which step, over which graph: the applied schedule and a pending
    newer one (a repaired schedule, or an ada-feedback decision)."""

    def __init__(self, peer_id: int, feedback: FeedbackConfig | None = None, n: int = 2) -> None:
        self.peer_id = peer_id
        self.client: ControlClient | None = None
        self.runner: StepRunner | None = None
        self.step_base = 0
        self.applied = 0  # version of the schedule in force
        self.members: frozenset[int] = frozenset()  # … and its peers
        self.feedback = feedback  # ada-feedback: when decisions take effect
        self.densest = exponential_name(max_exponential_k(n))  # contains every exponential:K

    def _pending(self) -> Schedule | None:
        s = self.client.schedule if self.client is not None else None
        return s if s is not None and s.version > self.applied else None

    def apply(self, s: Schedule) -> None:
        """Put ``s`` in force: its members and each phase's topology."""
        if self.runner is not None:
            self.runner.schedules.set_members(s.peers)
            self.runner.schedules.set_topologies(phase_topologies(s))
        self.applied, self.members = s.version, frozenset(s.peers)

    def before_step(self, step: int) -> Schedule | None:
        """Apply a newer schedule whose effective step has come; returns it if applied."""
        s = self._pending()
        if s is None or step < s.effective_step or self.runner is None:
            return None
        self.apply(s)
        return s

    def holds(self, decision: int) -> bool:
        """This peer holds a schedule reflecting ada-feedback decision point ``decision``."""
        s = self.client.schedule if self.client is not None else None
        return s is not None and s.decided_at is not None and s.decided_at >= decision

    def awaited(self, step: int) -> int | None:
        """ada-feedback: the decision point taking effect at ``step`` whose schedule this peer
        does not hold yet (None: nothing to wait for)."""
        if self.feedback is None:
            return None
        s = self.feedback.decided_for(step)
        return s if s is not None and not self.holds(s) else None

    def _topology_at(self, step: int, phase: Phase, in_force: Schedule | None) -> str | None:
        """The topology of ``phase`` at ``step`` (None: the applied one)."""
        if self.feedback is not None:
            s = self.feedback.in_force(step)
            if s is not None and not self.holds(s):
                return self.densest  # a decision not received yet: any K it may pick
        if in_force is None or self.runner is None:
            return None
        name = phase_topologies(in_force).get(phase.index)
        return name or phase.topology or self.runner.cfg.topology

    def is_neighbour(self, sender: int, wire_step: int, round: int, tensor_id: int) -> bool:
        if tensor_id == TENSOR_ALLREDUCE:
            return sender != self.peer_id
        runner = self.runner
        step = wire_step - self.step_base
        if runner is None or step < 0:
            return True  # a straggler of the previous stage: filed and never read
        phase = runner.plan.phase_at(min(step, runner.total_steps - 1))
        if phase.mode != "gossip":
            return False
        pending = self._pending()
        in_force = pending if pending is not None and step >= pending.effective_step else None
        members = in_force.peers if in_force is not None else None
        topology = self._topology_at(step, phase, in_force)
        W = runner.schedules.get(phase, members, topology).matrix(round)
        return bool(W[self.peer_id, sender] > 0 or W[sender, self.peer_id] > 0)
