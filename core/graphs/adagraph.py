"""Ada-style adaptive communication graphs — two *interpretations*, not the published rule
(torch-free, sans-io).

Source: Xie, Yin, Zhou, Oral, Wang, "Scaling Up Data Parallelism in Decentralized Deep
Learning", arXiv 2509.12213, 2025 (DBench and Ada; docs/algorithms.md#ada-interpretations). The
paper reports that accuracy correlates with the number of connections of the communication graph and
with the variance of parameters across replicas, and proposes Ada, a D-SGD that "adapts the
communication graph in use dynamically throughout training iterations". **Ada's exact rule (graph
family, trigger, schedule, hyperparameters) is not published in what we could read**, so Concord
ships two interpretations, labelled as such everywhere (config names, docs, run metrics):

* ``ada-schedule`` — interpretation (a), a *schedule*: D-SGD whose gossip graph is dense early
  and sparser after each learning-rate decay (consistent with Consensus Control's finding that
  phase 1 is the critical one). ``hyper.graphs`` lists one topology name per phase; the default
  (`default_graphs`) is ``exponential:⌈log2 n⌉`` in phase 1, K halved (rounded up) in each middle
  phase, and ``ring`` in the last phase.
* ``ada-feedback`` — interpretation (b), *feedback* on the measured replica variance: the graph
  is the k-peer exponential graph ``exponential:K`` (`concord.core.graphs.topology`; K = 1 the ring,
  ⌈log2 n⌉ the full exponential graph) and `GraphFeedback` moves K from the consensus estimator Θ.

The feedback rule (`GraphFeedback`), per step t with Θ_t = sqrt(mean_i θ_i) of the step's last
gossip round (Kong et al. 2021's estimator, `concord.core.control.consensus.theta`) and φ_t = mean_i
‖g_i‖:

1. φ̂ ← EMA_ema(φ_t), reset at the first step of each phase (exactly like
   `concord.core.control.controller.AdaptiveTarget`); target = factor · φ̂.
2. At every decision point s ((s + 1) mod every = 0), with Θ̄ the mean of the Θ_t of the window
   (the steps since the previous decision point): Θ̄ > target → K + 1 (denser);
   Θ̄ < hysteresis · target → K − 1 (sparser); otherwise K stays; clamped to [1, ⌈log2 n⌉].
3. The K decided at s is in force from step s + lag on (in both engines: the lag is the time the
   orchestrator has to publish the schedule), until the next decision takes effect.

Every mean is ``math.fsum(values) / len(values)`` of Python floats, so the vectorized engine and
the orchestrator (which only sees the peers' scalars) compute the same numbers from the same θ_i
and ‖g_i‖.

Hyperparameters of ``ada-feedback`` (``[hyper]``; `FeedbackConfig`, valid ranges):
every ≥ 1 steps (default 20); factor > 0 (default 0.25, Concord's consensus-control default:
with cnn1d on mnist1d, n = 4–16, lr 0.1, we measured Θ/φ ≈ 0.2 in phase 1 and ≈ 0.02–0.04 after
the first decay, so the defaults keep the dense graph in phase 1 and thin it after the decay —
not a number from the paper); ema ∈ [0, 1) (default 0.9); hysteresis ∈ (0, 1] (default 0.5;
1 = no dead band); k0 ∈ [1, ⌈log2 n⌉] (default: the densest); lag ∈ [1, every] (default 2; at
most ``every`` so that a decision is in force before the next one is taken).

Caveat (docs/algorithms.md#consensus-distance-and-the-estimator): Θ ≈ ‖(I − W)(X − X̄)‖/√n depends
on the graph itself, so a denser graph lowers Ξ but raises 1 − λ₂; Θ moves much less with K than Ξ
does. The learning-rate decays move Θ by 10× and drive most of the decisions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeGuard

import pydantic

from concord.core.algorithms.catalog import CATALOG, AdaptiveGraph, adaptive_graph_algorithms
from concord.core.graphs.graph import TopologyError
from concord.core.graphs.topology import (
    FILE_PREFIX,
    exponential_k,
    exponential_name,
    max_exponential_k,
    topology_spec,
)
from concord.core.records import JSON
from concord.core.specs import TOPOLOGY_SPECS

__all__ = [
    "ADA_ALGORITHMS",
    "FeedbackConfig",
    "FeedbackDecision",
    "GraphFeedback",
    "default_graphs",
    "feedback_config",
    "hyper_problems",
    "initial_topologies",
    "schedule_graphs",
]

# the algorithms that choose their own graphs (`AlgorithmSpec.adaptive_graph` of the catalog)
ADA_ALGORITHMS: tuple[str, ...] = adaptive_graph_algorithms()


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> TypeGuard[float | int]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


# ---- interpretation (a): dense → sparse by phase --------------------------------------------


def default_graphs(n: int, phases: int) -> list[str]:
    """``exponential:⌈log2 n⌉`` in phase 1, K halved (rounded up) in each middle phase,
    K_p = ⌈K_max / 2^(p−1)⌉, and ``ring`` in the last phase (a single phase keeps the dense
    graph). E.g. n = 16, three phases: exponential:4, exponential:2, ring."""
    k_max = max_exponential_k(n)
    out = [exponential_name((k_max + (1 << p) - 1) >> p) for p in range(phases)]
    if phases > 1:
        out[-1] = "ring"
    return out


def check_graph_names(graphs: object) -> list[str]:
    """``hyper.graphs`` as a list of names (syntax only; `schedule_graphs` checks them for n)."""
    if not isinstance(graphs, Sequence) or isinstance(graphs, str | bytes):
        raise ValueError(
            f"hyper.graphs = {graphs!r}; must be a list of topology names, one per phase"
        )
    bad = [g for g in graphs if not isinstance(g, str) or not g]
    if bad:
        raise ValueError(f"hyper.graphs: entries must be topology names; got {bad[0]!r}")
    return [str(g) for g in graphs]


def schedule_graphs(graphs: Sequence[str] | None, n: int, phases: int) -> list[str]:
    """The per-phase topologies of ``ada-schedule``: ``graphs`` checked against n and the number
    of phases, or `default_graphs`. ValueError names every problem."""
    if graphs is None:
        return default_graphs(n, phases)
    names = check_graph_names(graphs)
    problems = []
    if len(names) != phases:
        problems.append(
            f"hyper.graphs lists {len(names)} topologies for {phases} phase(s) "
            "(len(optim.milestones) + 1); give one per phase"
        )
    for i, name in enumerate(names):
        where = f"hyper.graphs[{i}] (phase {i + 1})"
        try:
            known = exponential_k(name, n) is not None
        except TopologyError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if name.startswith(FILE_PREFIX):
            if not Path(name[len(FILE_PREFIX) :]).is_file():
                problems.append(f"{where}: edge-list file {name[len(FILE_PREFIX) :]!r} not found")
        elif not known and name not in TOPOLOGY_SPECS:
            problems.append(
                f"{where}: unknown topology {name!r}; valid: {', '.join(TOPOLOGY_SPECS)}, "
                "exponential:K, file:PATH"
            )
        elif topology_spec(name).directed:
            problems.append(
                f"{where}: {name!r} is directed (push-sum only); ada-schedule gossips with "
                "symmetric weights"
            )
    if problems:
        raise ValueError("; ".join(problems))
    return names


# ---- interpretation (b): feedback on Θ ------------------------------------------------------


@dataclass(frozen=True)
class FeedbackConfig:
    """Hyperparameters of ``ada-feedback`` (see the module docstring for ranges and defaults)."""

    every: int = 20
    factor: float = 0.25
    ema: float = 0.9
    hysteresis: float = 0.5
    k0: int | None = None  # None: the densest, ⌈log2 n⌉
    lag: int = 2

    def __post_init__(self) -> None:
        problems = []
        if not _is_int(self.every) or self.every < 1:
            problems.append(f"hyper.every = {self.every!r}; must be an integer >= 1 (steps)")
        if not _is_number(self.factor) or self.factor <= 0:
            problems.append(f"hyper.factor = {self.factor!r}; must be a finite number > 0")
        if not _is_number(self.ema) or not 0.0 <= self.ema < 1.0:
            problems.append(f"hyper.ema = {self.ema!r}; the EMA coefficient must be in [0, 1)")
        if not _is_number(self.hysteresis) or not 0.0 < self.hysteresis <= 1.0:
            problems.append(
                f"hyper.hysteresis = {self.hysteresis!r}; must be in (0, 1] (go sparser below "
                "hysteresis × target; 1 = no dead band)"
            )
        if self.k0 is not None and (not _is_int(self.k0) or self.k0 < 1):
            problems.append(f"hyper.k0 = {self.k0!r}; must be an integer >= 1 (or unset)")
        if not _is_int(self.lag) or self.lag < 1:
            problems.append(f"hyper.lag = {self.lag!r}; must be an integer >= 1 (steps)")
        elif _is_int(self.every) and self.every >= 1 and self.lag > self.every:
            problems.append(
                f"hyper.lag = {self.lag} exceeds hyper.every = {self.every}: a decision must be "
                "in force before the next one is taken"
            )
        if problems:
            raise ValueError("; ".join(problems))

    def k_start(self, n: int) -> int:
        """K of the first step for n peers (checks k0 ≤ ⌈log2 n⌉)."""
        k_max = max_exponential_k(n)
        if self.k0 is None:
            return k_max
        if self.k0 > k_max:
            raise ValueError(
                f"hyper.k0 = {self.k0} exceeds ceil(log2 n) = {k_max} for n = {n} peers "
                f"(valid: 1 … {k_max})"
            )
        return self.k0

    def is_decision_point(self, step: int) -> bool:
        return (step + 1) % self.every == 0

    def decided_for(self, step: int) -> int | None:
        """The decision point whose K takes effect exactly at ``step`` (None if none does)."""
        s = step - self.lag
        return s if s >= 0 and self.is_decision_point(s) else None

    def in_force(self, step: int) -> int | None:
        """The latest decision point whose K is in force at ``step`` (None: still k0)."""
        m = (step - self.lag + 1) // self.every
        return m * self.every - 1 if m >= 1 else None


_HYPER: dict[AdaptiveGraph, tuple[str, ...]] = {
    "schedule": ("graphs",),
    "feedback": tuple(f.name for f in fields(FeedbackConfig)),
}


def _kind(algorithm: str) -> AdaptiveGraph | None:
    spec = CATALOG.get(algorithm)
    return None if spec is None else spec.adaptive_graph


def _hyper_keys(algorithm: str) -> tuple[str, ...]:
    kind = _kind(algorithm)
    if kind is None:
        raise ValueError(f"algorithm {algorithm!r} does not choose its graphs")
    return _HYPER[kind]


def feedback_config(hyper: Mapping[str, Any]) -> FeedbackConfig:
    """`FeedbackConfig` from the ``[hyper]`` table (unknown keys: ValueError naming the valid)."""
    _check_keys("ada-feedback", hyper)
    return FeedbackConfig(**dict(hyper))


def _check_keys(algorithm: str, hyper: Mapping[str, Any]) -> None:
    valid = _hyper_keys(algorithm)
    unknown = sorted(set(hyper) - set(valid))
    if unknown:
        raise ValueError(f"hyper: unknown key(s) {unknown} for {algorithm}; valid: {list(valid)}")


def hyper_problems(algorithm: str, hyper: Mapping[str, Any], n: int, phases: int) -> list[str]:
    """Every problem of an ada-* ``[hyper]`` table for n peers and ``phases`` phases."""
    problems = []
    try:
        _check_keys(algorithm, hyper)
    except ValueError as exc:
        problems.append(str(exc))
    known = {k: v for k, v in hyper.items() if k in _hyper_keys(algorithm)}
    try:
        if _kind(algorithm) == "schedule":
            schedule_graphs(known.get("graphs"), n, phases)
        else:
            FeedbackConfig(**known).k_start(n)
    except ValueError as exc:
        problems.append(str(exc))
    return problems


@dataclass(frozen=True)
class FeedbackDecision:
    """One decision point of `GraphFeedback`: K ``k_from`` → ``k_to`` from step ``effective``.

    theta: mean Θ_t over the window (None if no step of the window was observed); target:
    factor × φ̂ at the decision; steps: steps in the window; reason: "denser", "sparser",
    "in-band", "densest" (wanted denser, at ⌈log2 n⌉), "sparsest" (wanted sparser, at 1) or
    "no-statistics".
    """

    step: int
    effective: int
    k_from: int
    k_to: int
    theta: float | None
    target: float | None
    steps: int
    reason: str

    def to_json(self) -> dict[str, JSON]:
        """A ``graph-decisions.jsonl`` line: ``"kind": "graph"`` and the fields."""
        return {"kind": "graph", **self._fields()}

    def _fields(self) -> dict[str, JSON]:
        return {
            "step": self.step,
            "effective": self.effective,
            "k_from": self.k_from,
            "k_to": self.k_to,
            "theta": self.theta,
            "target": self.target,
            "steps": self.steps,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class _FeedbackState:
    """`GraphFeedback.state_dict`'s table, as validated on loading."""

    k: int
    k0: int
    decisions: list[FeedbackDecision]
    changes: list[tuple[int, int]]
    window: list[float]
    phi: float | None
    phase: int | None
    last: int | None


def _mean(values: Sequence[float], what: str) -> float:
    v = [float(x) for x in values]
    if not v:
        raise ValueError(f"{what} is empty; one value per reporting replica is needed")
    for i, x in enumerate(v):
        if not math.isfinite(x) or x < 0:
            raise ValueError(f"{what}[{i}] = {x!r}; must be a finite number >= 0")
    return math.fsum(v) / len(v)


class GraphFeedback:
    """The ``ada-feedback`` controller (module docstring): feed `observe` after every gossip step
    in step order; `k_at` gives the K in force at a step. Deterministic, no clock, no I/O."""

    def __init__(self, config: FeedbackConfig, n: int) -> None:
        self.config = config
        self.n = n
        self.k_max = max_exponential_k(n)
        self.k = config.k_start(n)  # the latest decided K
        self.k0 = self.k
        self.decisions: list[FeedbackDecision] = []
        self._changes: list[tuple[int, int]] = []  # (effective step, K), in decision order
        self._window: list[float] = []
        self._phi: float | None = None
        self._phase: int | None = None
        self._last: int | None = None  # last observed step

    def state_dict(self) -> dict[str, JSON]:
        """Everything `observe` and `k_at` depend on, as JSON (a checkpoint's ``feedback``): K,
        its decisions, changes, window, φ̂, the phase and the last observed step."""
        return {
            "k": self.k,
            "k0": self.k0,
            "decisions": [d._fields() for d in self.decisions],
            "changes": [[e, k] for e, k in self._changes],
            "window": list(self._window),
            "phi": self._phi,
            "phase": self._phase,
            "last": self._last,
        }

    def load_state_dict(self, d: Mapping[str, JSON]) -> None:
        """Continue from a `state_dict` (a resumed run decides exactly as the uninterrupted one).
        Raises ValueError naming the field that does not match."""
        try:
            state = pydantic.TypeAdapter(_FeedbackState).validate_python(dict(d))
        except pydantic.ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise ValueError(f"ada-feedback state field {where!r}: {err['msg']}") from None
        self.k, self.k0, self.decisions = state.k, state.k0, list(state.decisions)
        self._changes, self._window = list(state.changes), list(state.window)
        self._phi, self._phase, self._last = state.phi, state.phase, state.last

    def topology(self, step: int) -> str:
        """``exponential:K`` with the K in force at ``step``."""
        return exponential_name(self.k_at(step))

    def k_at(self, step: int) -> int:
        for effective, k in reversed(self._changes):
            if effective <= step:
                return k
        return self.k0

    def target(self) -> float | None:
        return None if self._phi is None else self.config.factor * self._phi

    def observe(
        self, step: int, phase: int, thetas: Sequence[float], grad_norms: Sequence[float]
    ) -> list[FeedbackDecision]:
        """Feed step ``step`` of phase ``phase``: the θ_i of its last gossip round and the ‖g_i‖
        of the replicas that reported. Returns the decisions taken (decision points skipped by a
        gap in the steps are decided first, on what their window holds)."""
        if not _is_int(step) or step < 0:
            raise ValueError(f"step = {step!r}; must be an integer >= 0")
        if self._last is not None and step <= self._last:
            raise ValueError(f"step {step} observed after step {self._last}; feed steps in order")
        theta = math.sqrt(_mean(thetas, f"thetas (step {step})"))
        phi = _mean(grad_norms, f"grad_norms (step {step})")
        first = 0 if self._last is None else self._last + 1
        skipped = [s for s in range(first, step) if self.config.is_decision_point(s)]
        out = [self._decide(s) for s in skipped]  # decision points of steps never observed
        self._last = step
        if self._phase != phase or self._phi is None:
            self._phi, self._phase = phi, phase
        else:
            self._phi = self.config.ema * self._phi + (1.0 - self.config.ema) * phi
        self._window.append(theta)
        if self.config.is_decision_point(step):
            out.append(self._decide(step))
        return out

    def _decide(self, s: int) -> FeedbackDecision:
        target = self.target()
        k = self.k
        if not self._window or target is None:
            theta, k_to, reason = None, k, "no-statistics"
        else:
            theta = math.fsum(self._window) / len(self._window)
            if theta > target:
                k_to, reason = (k + 1, "denser") if k < self.k_max else (k, "densest")
            elif theta < self.config.hysteresis * target:
                k_to, reason = (k - 1, "sparser") if k > 1 else (k, "sparsest")
            else:
                k_to, reason = k, "in-band"
        d = FeedbackDecision(
            step=s,
            effective=s + self.config.lag,
            k_from=k,
            k_to=k_to,
            theta=theta,
            target=target,
            steps=len(self._window),
            reason=reason,
        )
        self._window = []
        self.k = k_to
        self._changes.append((d.effective, k_to))
        self.decisions.append(d)
        return d


def initial_topologies(
    algorithm: str, hyper: Mapping[str, Any], n: int, phases: int
) -> dict[int, str]:
    """Phase index (1-based) → topology at the start of a run: ada-schedule's per-phase graphs,
    ada-feedback's ``exponential:k0`` in every phase; {} for other algorithms (no overrides)."""
    kind = _kind(algorithm)
    if kind == "schedule":
        graphs = schedule_graphs(hyper.get("graphs"), n, phases)
        return dict(enumerate(graphs, start=1))
    if kind == "feedback":
        k = feedback_config(hyper).k_start(n)
        return {i: exponential_name(k) for i in range(1, phases + 1)}
    return {}
