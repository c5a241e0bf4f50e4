"""Learning-rate schedules and per-phase communication plans (torch-free).

Phases follow Kong et al., "Consensus Control for Decentralized Deep Learning" (ICML 2021, §4.1):
training is split at the learning-rate decays; **phase k** is the stretch between the (k−1)-th and
the k-th decay (phase 1 starts at step 0, the last phase ends at ``total_steps``). The warm-up is
*not* a phase of its own, it belongs to phase 1. ``dec-phase-k`` = gossip (decentralized) only in
phase k and exact averaging (all-reduce) in the others; "control phase 1 only" (the paper's
guideline, Appendix A.2) = gossip everywhere with consensus control in phase 1. Both are plans
built by `build_plan`, not special code. A *controlled* phase is one whose gossip rounds per step
the controller (`concord.core.control.controller`) sets: consensus control (modes ``constant``,
``adaptive``) or a fixed number of rounds (mode ``fixed``).

The orchestrator imports this module, so it must never import torch.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal, TypeGuard, get_args

from concord.core.records import JSON

__all__ = [
    "CONTROL_MODES",
    "MODE_PRESETS",
    "PHASE_MODES",
    "LRSchedule",
    "Phase",
    "PhaseMode",
    "PhasePlan",
    "build_plan",
]

ControlMode = Literal["none", "constant", "adaptive", "fixed"]
CONTROL_MODES: tuple[str, ...] = get_args(ControlMode)
PhaseMode = Literal["exact", "gossip"]
PHASE_MODES: tuple[str, ...] = get_args(PhaseMode)
MODE_PRESETS: tuple[str, ...] = ("gossip", "exact", "dec-phase-K")
_DEC_PHASE = re.compile(r"dec-phase-(\d+)")
_PLAN_VERSION = 1


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _round_half_up(x: float) -> int:
    """Deterministic rounding (Python's round() is banker's rounding: round(0.5) == 0)."""
    return math.floor(x + 0.5)


@dataclass(frozen=True)
class LRSchedule:
    """Linear warm-up followed by multi-step decay (the Goyal et al. / Tao Lin convention).

    lr(t) = base_lr · (warmup_from + (1 − warmup_from) · t / warmup_steps)   for t < warmup_steps
    lr(t) = base_lr · gamma^(number of milestones ≤ t)                        otherwise

    Hyperparameters (valid ranges):
        base_lr: > 0, finite.
        total_steps: ≥ 1; steps are 0 … total_steps − 1.
        warmup_steps: 0 ≤ warmup_steps < total_steps (0 = no warm-up).
        milestones: strictly increasing steps with warmup_steps < m < total_steps (decays do not
            happen during the warm-up); may be empty (one phase).
        gamma: decay factor in (0, 1].
        warmup_from: first warm-up lr as a fraction of base_lr, in [0, 1].
    """

    base_lr: float
    total_steps: int
    warmup_steps: int
    milestones: tuple[int, ...]
    gamma: float = 0.1
    warmup_from: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.base_lr, int | float) or not (
            math.isfinite(self.base_lr) and self.base_lr > 0
        ):
            raise ValueError(f"base_lr = {self.base_lr!r}; must be a finite number > 0")
        if not _is_int(self.total_steps) or self.total_steps < 1:
            raise ValueError(f"total_steps = {self.total_steps!r}; must be an integer ≥ 1")
        if not _is_int(self.warmup_steps) or not 0 <= self.warmup_steps < self.total_steps:
            raise ValueError(
                f"warmup_steps = {self.warmup_steps!r}; must be an integer in "
                f"[0, total_steps = {self.total_steps})"
            )
        object.__setattr__(self, "milestones", tuple(self.milestones))
        prev = self.warmup_steps
        for m in self.milestones:
            if not _is_int(m) or not prev < m < self.total_steps:
                raise ValueError(
                    f"milestones = {self.milestones!r}; must be strictly increasing integer steps "
                    f"with warmup_steps = {self.warmup_steps} < m < total_steps = "
                    f"{self.total_steps} (offending value {m!r})"
                )
            prev = m
        if not (0.0 < self.gamma <= 1.0):
            raise ValueError(f"gamma = {self.gamma!r}; the decay factor must be in (0, 1]")
        if not (0.0 <= self.warmup_from <= 1.0):
            raise ValueError(f"warmup_from = {self.warmup_from!r}; must be in [0, 1]")

    @classmethod
    def from_fractions(
        cls,
        base_lr: float,
        total_steps: int,
        *,
        warmup: float = 0.05,
        milestones: Sequence[float] = (0.5, 0.75),
        gamma: float = 0.1,
        warmup_from: float = 0.0,
    ) -> LRSchedule:
        """Build from fractions of training; steps = round-half-up(fraction × total_steps).

        Args:
            warmup: warm-up length as a fraction of training, 0 ≤ warmup < 1 (and below the
                first milestone).
            milestones: decay points as fractions, strictly increasing, each in (0, 1).
        """
        if not (0.0 <= warmup < 1.0):
            raise ValueError(f"warmup = {warmup!r}; the warm-up fraction must be in [0, 1)")
        fracs = tuple(float(m) for m in milestones)
        prev = 0.0
        for m in fracs:
            if not (prev < m < 1.0):
                raise ValueError(
                    f"milestones = {tuple(milestones)!r}; fractions must be strictly increasing "
                    f"and each in (0, 1) (offending value {m!r})"
                )
            prev = m
        if fracs and warmup >= fracs[0]:
            raise ValueError(
                f"warmup = {warmup!r} must end before the first milestone {fracs[0]!r}"
            )
        if not _is_int(total_steps) or total_steps < 1:
            raise ValueError(f"total_steps = {total_steps!r}; must be an integer ≥ 1")
        steps = tuple(_round_half_up(m * total_steps) for m in fracs)
        warm = _round_half_up(warmup * total_steps)
        if len(set(steps)) != len(steps) or any(s <= warm or s >= total_steps for s in steps):
            raise ValueError(
                f"total_steps = {total_steps} is too small to separate warmup = {warmup!r} and "
                f"milestones = {fracs!r} (they round to warm-up {warm} and steps {steps})"
            )
        return cls(base_lr, total_steps, warm, steps, gamma, warmup_from)

    def lr(self, step: int) -> float:
        """Learning rate of step ``step`` (0 ≤ step < total_steps)."""
        if not _is_int(step) or not 0 <= step < self.total_steps:
            raise ValueError(f"step = {step!r}; must be an integer in [0, {self.total_steps})")
        if step < self.warmup_steps:
            frac = self.warmup_from + (1.0 - self.warmup_from) * step / self.warmup_steps
            return self.base_lr * frac
        return self.base_lr * self.gamma ** bisect_right(self.milestones, step)

    def phase_bounds(self) -> list[tuple[int, int]]:
        """[start, end) of each phase: len(milestones) + 1 intervals covering [0, total_steps)."""
        edges = (0, *self.milestones, self.total_steps)
        return list(pairwise(edges))

    def to_dict(self) -> dict[str, JSON]:
        """JSON description (the control plane's plan message)."""
        return {
            "base_lr": self.base_lr,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "milestones": list(self.milestones),
            "gamma": self.gamma,
            "warmup_from": self.warmup_from,
        }


@dataclass(frozen=True)
class Phase:
    """One training phase of a `PhasePlan`.

    Attributes:
        index: 1-based; phase k lies between the (k−1)-th and the k-th LR decay.
        start, end: steps [start, end), 0 ≤ start < end.
        mode: "exact" = exact averaging (all-reduce); "gossip" = gossip on ``topology``.
        topology: topology name for gossip phases; None = the run's topology (always None for
            exact phases).
        controlled: gossip whose rounds per step the controller sets (consensus control: repeat
            rounds until the target is met; mode fixed: a fixed number of rounds); only
            meaningful (and only allowed) for gossip phases.
    """

    index: int
    start: int
    end: int
    mode: PhaseMode
    topology: str | None
    controlled: bool

    def __post_init__(self) -> None:
        if not _is_int(self.index) or self.index < 1:
            raise ValueError(f"phase index = {self.index!r}; must be an integer ≥ 1")
        where = f"phase {self.index}"
        if not (_is_int(self.start) and _is_int(self.end) and 0 <= self.start < self.end):
            raise ValueError(
                f"{where}: steps [start, end) = [{self.start!r}, {self.end!r}); need integers "
                "with 0 ≤ start < end"
            )
        if self.mode not in PHASE_MODES:
            raise ValueError(f"{where}: mode = {self.mode!r}; valid: {', '.join(PHASE_MODES)}")
        if self.topology is not None and not (isinstance(self.topology, str) and self.topology):
            raise ValueError(
                f"{where}: topology = {self.topology!r}; must be a non-empty name or None"
            )
        if self.mode == "exact" and self.topology is not None:
            raise ValueError(
                f"{where} is 'exact' (all-reduce averaging) and takes no topology, "
                f"got topology = {self.topology!r}"
            )
        if not isinstance(self.controlled, bool):
            raise ValueError(f"{where}: controlled = {self.controlled!r}; must be a bool")
        if self.controlled and self.mode == "exact":
            raise ValueError(
                f"{where} is 'exact' (all-reduce averaging, Ξ = 0 after every step): consensus "
                "control there is meaningless; control only gossip phases"
            )

    def to_dict(self) -> dict[str, JSON]:
        """JSON form: {index, start, end, mode, topology, controlled}."""
        return {
            "index": self.index,
            "start": self.start,
            "end": self.end,
            "mode": self.mode,
            "topology": self.topology,
            "controlled": self.controlled,
        }


_PHASE_KEYS = frozenset(("index", "start", "end", "mode", "topology", "controlled"))


@dataclass(frozen=True)
class PhasePlan:
    """Contiguous phases 1 … K covering steps [0, total_steps); see the module docstring."""

    phases: tuple[Phase, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "phases", tuple(self.phases))
        if not self.phases:
            raise ValueError("phases is empty; a plan needs at least one phase")
        expected_start = 0
        for k, ph in enumerate(self.phases, start=1):
            if not isinstance(ph, Phase):
                raise ValueError(f"phases[{k - 1}] is a {type(ph).__name__}, expected Phase")
            if ph.index != k:
                raise ValueError(f"phases[{k - 1}] has index {ph.index}; indices must be 1 … K")
            if ph.start != expected_start:
                raise ValueError(
                    f"phase {k} starts at step {ph.start} but must start at {expected_start} "
                    "(phases must be contiguous from step 0)"
                )
            expected_start = ph.end

    @property
    def total_steps(self) -> int:
        return self.phases[-1].end

    @property
    def controlled_indices(self) -> tuple[int, ...]:
        return tuple(ph.index for ph in self.phases if ph.controlled)

    def phase(self, index: int) -> Phase:
        """The phase with 1-based ``index``."""
        if not _is_int(index) or not 1 <= index <= len(self.phases):
            raise ValueError(f"phase index = {index!r}; valid: 1 … {len(self.phases)}")
        return self.phases[index - 1]

    def phase_at(self, step: int) -> Phase:
        """The phase containing ``step`` (0 ≤ step < total_steps)."""
        if not _is_int(step) or not 0 <= step < self.total_steps:
            raise ValueError(f"step = {step!r}; must be an integer in [0, {self.total_steps})")
        starts = [ph.start for ph in self.phases]  # K is small (≤ a handful of phases)
        return self.phases[bisect_right(starts, step) - 1]

    def to_dict(self) -> dict[str, JSON]:
        """JSON form (a run manifest's ``plan``, the plan message's ``phases``):
        {"version": 1, "phases": [{index, start, end, mode, topology, controlled}, …]}."""
        phases: list[JSON] = [ph.to_dict() for ph in self.phases]
        return {"version": _PLAN_VERSION, "phases": phases}

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> PhasePlan:
        """Inverse of `to_dict`; validates keys, types and contiguity with specific errors."""
        if not isinstance(d, Mapping):
            raise ValueError(f"phase plan must be a mapping, got {type(d).__name__}")
        if d.get("version") != _PLAN_VERSION:
            raise ValueError(
                f"phase plan version = {d.get('version')!r}; this code reads version "
                f"{_PLAN_VERSION}"
            )
        extra = sorted(set(d) - {"version", "phases"})
        if extra:
            raise ValueError(f"phase plan has unknown key(s) {extra}; valid: version, phases")
        raw = d.get("phases")
        if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
            raise ValueError(f"phase plan 'phases' must be a list, got {type(raw).__name__}")
        phases = []
        for i, p in enumerate(raw):
            if not isinstance(p, Mapping):
                raise ValueError(f"phases[{i}] must be a mapping, got {type(p).__name__}")
            missing = sorted(_PHASE_KEYS - set(p))
            unknown = sorted(set(p) - _PHASE_KEYS)
            if missing or unknown:
                raise ValueError(
                    f"phases[{i}]: missing key(s) {missing}, unknown key(s) {unknown}; "
                    f"valid keys: {', '.join(sorted(_PHASE_KEYS))}"
                )
            phases.append(Phase(**{k: p[k] for k in _PHASE_KEYS}))
        return cls(tuple(phases))


def _resolve_modes(modes: Sequence[str] | str | None, k: int) -> list[str]:
    if modes is None:
        return ["gossip"] * k
    if isinstance(modes, str):
        if modes in PHASE_MODES:
            return [modes] * k
        m = _DEC_PHASE.fullmatch(modes)
        if m is None:
            raise ValueError(
                f"modes preset {modes!r} is unknown; valid presets: {', '.join(MODE_PRESETS)} "
                f"(K = 1 … {k}), or a list of {k} of {PHASE_MODES}"
            )
        target = int(m.group(1))
        if not 1 <= target <= k:
            raise ValueError(
                f"modes preset {modes!r} names phase {target}, but the schedule has {k} "
                f"phase(s) (valid: dec-phase-1 … dec-phase-{k})"
            )
        return ["gossip" if i == target else "exact" for i in range(1, k + 1)]
    out = list(modes)
    if len(out) != k:
        raise ValueError(
            f"modes has {len(out)} entries but the schedule has {k} phase(s) (len(milestones) + 1)"
        )
    for i, mode in enumerate(out, start=1):
        if mode not in PHASE_MODES:
            raise ValueError(f"modes[{i - 1}] (phase {i}) = {mode!r}; valid: {PHASE_MODES}")
    return out


def build_plan(
    schedule: LRSchedule,
    *,
    modes: Sequence[str] | str | None = None,
    topologies: Sequence[str | None] | None = None,
    controlled_phases: Sequence[int] = (),
    control_mode: str = "none",
) -> PhasePlan:
    """Phase plan for ``schedule``: one phase per constant-LR stretch (len(milestones) + 1).

    Args:
        modes: None (all "gossip"), one entry per phase ("exact" | "gossip"), or a preset:
            "gossip", "exact", "dec-phase-K" (gossip only in phase K, exact elsewhere).
        topologies: one entry per phase (None = the run's topology); must be None for exact
            phases.
        controlled_phases: 1-based indices of gossip phases whose rounds the controller sets
            (consensus control, or a fixed number of rounds). Empty with ``control_mode`` ≠
            "none" means every gossip phase is controlled.
        control_mode: "none", "constant", "adaptive" or "fixed" (see
            `concord.core.control.controller`); "none" with a non-empty ``controlled_phases``
            is an error.
    """
    bounds = schedule.phase_bounds()
    k = len(bounds)
    mode_list = _resolve_modes(modes, k)
    if topologies is None:
        topo_list: list[str | None] = [None] * k
    else:
        topo_list = list(topologies)
        if len(topo_list) != k:
            raise ValueError(
                f"topologies has {len(topo_list)} entries but the schedule has {k} phase(s)"
            )
    if control_mode not in CONTROL_MODES:
        raise ValueError(f"control_mode = {control_mode!r}; valid: {', '.join(CONTROL_MODES)}")
    ctrl = list(controlled_phases)
    for c in ctrl:
        if not _is_int(c) or not 1 <= c <= k:
            raise ValueError(
                f"controlled_phases contains {c!r}, out of range: the schedule has phases 1 … {k}"
            )
        if mode_list[c - 1] == "exact":
            raise ValueError(
                f"controlled_phases contains phase {c}, which is 'exact' (all-reduce averaging, "
                "Ξ = 0): consensus control there is meaningless; control only gossip phases"
            )
    if len(set(ctrl)) != len(ctrl):
        raise ValueError(f"controlled_phases = {tuple(ctrl)!r} lists a phase twice")
    if control_mode == "none" and ctrl:
        raise ValueError(
            f"controlled_phases = {tuple(ctrl)!r} needs control_mode 'constant' or 'adaptive' "
            "(consensus control) or 'fixed' (a fixed number of rounds), got 'none'"
        )
    if control_mode != "none" and not ctrl:
        ctrl = [i for i in range(1, k + 1) if mode_list[i - 1] == "gossip"]
        if not ctrl:
            raise ValueError(
                f"control_mode = {control_mode!r} but no phase gossips (all 'exact'): "
                "there is nothing to control"
            )
    phases = tuple(
        Phase(
            index=i,
            start=start,
            end=end,
            mode="gossip" if mode_list[i - 1] == "gossip" else "exact",
            topology=topo_list[i - 1],
            controlled=i in ctrl,
        )
        for i, (start, end) in enumerate(bounds, start=1)
    )
    return PhasePlan(phases)
