"""What a run config means over time, without torch: the LR schedule, the phase plan, the
consensus-control settings and the topology schedule over the live members.

The orchestrator (which never imports torch) and both engines build these from the same config
with the same functions, so a decision taken by the orchestrator refers to the same phases and
targets as the vectorized engine's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from concord.core.config import RunConfig
from concord.core.control.controller import ControlConfig
from concord.core.control.plan import LRSchedule, Phase, PhasePlan, build_plan
from concord.core.graphs.schedules import Spectral
from concord.core.graphs.topology import (
    TopologySchedule,
    exponential_k,
    exponential_name,
    make_schedule,
    max_exponential_k,
)


def make_lr_schedule(cfg: RunConfig, steps_per_epoch: int) -> LRSchedule:
    total = max(1, round(cfg.epochs * steps_per_epoch))
    o = cfg.optim
    return LRSchedule.from_fractions(
        o.lr,
        total,
        warmup=o.warmup,
        milestones=tuple(o.milestones),
        gamma=o.gamma,
        warmup_from=o.warmup_from,
    )


def make_plan(cfg: RunConfig, schedule: LRSchedule) -> PhasePlan:
    controlled = cfg.controlled_phases()
    return build_plan(
        schedule,
        modes=cfg.phase_modes(),
        topologies=cfg.phase_topologies,
        controlled_phases=tuple(controlled),
        control_mode=cfg.control.mode if controlled else "none",
    )


def control_config(cfg: RunConfig) -> ControlConfig:
    c = cfg.control
    return ControlConfig(
        mode=c.mode,
        factor=c.factor,
        max_rounds=c.max_rounds,
        lagged=c.lagged,
        lag=c.lag,
        ema=c.ema,
        statistic=c.statistic,
        rounds=c.rounds,
    )


def calibration_steps(plan: PhasePlan) -> int:
    """Steps an uncontrolled calibration pass must run: up to the end of the last controlled
    phase (0 when nothing is controlled)."""
    return max((p.end for p in plan.phases if p.controlled), default=0)


class MemberSchedule:
    """A topology schedule built over a subset of the run's peers (the live members), embedded in
    the run's n×n mixing matrices: rows and columns of absent peers are those of the identity, so
    a member never waits for, nor mixes with, a peer that left.

    With every peer a member this is the plain schedule (same matrices, bit for bit)."""

    def __init__(self, inner: TopologySchedule | None, members: Sequence[int], n: int) -> None:
        self.inner = inner
        self.members = np.asarray(sorted(members), dtype=np.int64)
        self.n = n
        self.full = len(self.members) == n

    @property
    def period(self) -> int | None:
        return self.inner.period if self.inner is not None else 1

    @property
    def time_varying(self) -> bool:
        return self.inner is not None and self.inner.time_varying

    def matrix(self, k: int) -> np.ndarray:
        if self.inner is None:
            return np.eye(self.n)
        W = self.inner.matrix(k)
        if self.full:
            return W
        out = np.eye(self.n)
        out[np.ix_(self.members, self.members)] = W
        return out

    def spectral(self) -> Spectral | None:
        return self.inner.spectral() if self.inner is not None else None


class Schedules:
    """Topology schedules of the phase plan, built once per (topology name, members).

    ``members`` (default: every peer) is the set the orchestrator's schedule lists; a repaired
    schedule after a peer left is applied with `set_members`. Per-phase topology *overrides*
    (`set_topologies`: the adaptive graphs of `concord.core.graphs.adagraph`, which a peer takes
    from the orchestrator's published schedule) replace the plan's topology of those phases."""

    def __init__(self, cfg: RunConfig, members: Sequence[int] | None = None) -> None:
        self.cfg = cfg
        self.members: tuple[int, ...] = tuple(range(cfg.peers))
        if members is not None:
            self.set_members(members)
        self._by_name: dict[tuple[str, tuple[int, ...]], MemberSchedule] = {}
        self.topologies: dict[int, str] = {}  # phase index → topology override

    def set_members(self, members: Sequence[int]) -> None:
        bad = [m for m in members if not 0 <= m < self.cfg.peers]
        if bad or not members:
            raise ValueError(f"members {list(members)} must be a non-empty subset of 0..n-1")
        self.members = tuple(sorted(set(members)))

    def set_topologies(self, topologies: Mapping[int, str | None]) -> None:
        """Override the topology of phases (1-based index → name; None drops the override)."""
        for index, name in topologies.items():
            if isinstance(index, bool) or not isinstance(index, int) or index < 1:
                raise ValueError(f"phase index {index!r} must be an integer >= 1")
            if name is None:
                self.topologies.pop(index, None)
            elif not isinstance(name, str) or not name:
                raise ValueError(f"phase {index}: topology {name!r} must be a non-empty name")
            else:
                self.topologies[index] = name

    def topology_name(self, phase: Phase) -> str:
        return self.topologies.get(phase.index) or phase.topology or self.cfg.topology

    def get(
        self, phase: Phase, members: Sequence[int] | None = None, topology: str | None = None
    ) -> MemberSchedule:
        """The schedule of ``phase``'s topology (or ``topology``) over ``members`` (default: the
        current ones). Over m < n live members ``exponential:K`` is capped at ⌈log2 m⌉."""
        name = topology or self.topology_name(phase)
        group = self.members if members is None else tuple(sorted(set(members)))
        k = exponential_k(name)
        if k is not None and name != "ring" and len(group) > 1:
            name = exponential_name(min(k, max_exponential_k(len(group))))
        key = (name, group)
        if key not in self._by_name:
            inner = None  # a lone survivor keeps its own model (identity)
            if len(group) > 1:
                inner = make_schedule(
                    name,
                    len(group),
                    weights=self.cfg.weights,
                    kappa=self.cfg.kappa,
                    seed=self.cfg.seed,
                )
            self._by_name[key] = MemberSchedule(inner, group, self.cfg.peers)
        return self._by_name[key]

    def spectral(self) -> dict[str, dict[str, object]]:
        import dataclasses

        out: dict[str, dict[str, object]] = {}
        for (name, members), s in self._by_name.items():
            spectral = s.spectral()
            if members == self.members and spectral is not None:
                out[name] = dataclasses.asdict(spectral)
        return out
