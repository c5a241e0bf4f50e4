"""Consensus control: decide, round by round, whether to gossip again (torch-free).

The same controller also runs the one controlled mode that is *not* consensus control, ``fixed``
(below): a fixed number of gossip rounds per step.

Procedure of Kong et al., "Consensus Control for Decentralized Deep Learning" (ICML 2021, §3.3
"more gossip iterations", §4.2 "consensus distance control", Appendix A.2;
docs/algorithms.md#consensus-control): in a controlled phase, after the local optimizer step every
node gossips once; while the consensus statistic (Θ from `concord.core.control.consensus.theta`, or
the exact Ξ in simulation) is above the target and fewer than ``max_rounds`` rounds were done,
gossip again with the same topology.

Targets (``ControlConfig.mode``):

* ``"constant"`` — target = factor × Ξ_max(phase), the maximum statistic seen during that phase
  in an *uncontrolled* run (the paper's main approach; factor ∈ {1, ½, ¼} in its Table 2). The
  engine runs that calibration pass; this module only records (`CalibrationRecorder`) and
  consumes (`Calibration`) it. Calibrate on the same statistic the controller is fed: Θ can
  under-state Ξ by up to 1/(1 − λ₂) (see `concord.core.control.consensus`).
* ``"adaptive"`` — target_t = factor × φ̂_t, φ̂ an EMA of the mean local gradient norm
  (1/n) Σ_i ‖g_i‖ (paper Appendix E.3.1 / A.2; the EMA constant is not given in the paper):
  φ̂ ← ema · φ̂ + (1 − ema) · φ_t, reset at the first step of each phase and initialised with
  that step's value.
* ``"fixed"`` — not consensus control: every step of a controlled phase runs exactly
  ``ControlConfig.rounds`` gossip rounds (the phase's topology as for the repeat rounds above: the
  same W each round on a static graph), whatever the statistic; no target and no calibration. It
  exists to compare gossip algorithms at an equal communication budget (SGP with 2 rounds per step
  as in its paper, D-SGD with as many rounds as DeTAG sends). Barrier protocol: ``after_round``
  answers repeat while ``round_index < rounds``; lagged: ``begin_step`` plans ``rounds`` for every
  step (also the first ``lag`` of a phase: nothing needs to be learned). The statistics are still
  fed in order, for the records.
* ``"none"`` — never repeat.

With overlap (``overlap = true``, `concord.core.algorithms.overlap`) the first round of a step
runs while its gradient is computed and mixes the model before the local update; the controller
is asked after that update, and the repeat rounds it asks for mix the updated model. Nothing
here changes: it sees one statistic per round, in order.

Two protocols (``ControlConfig.lagged``):

* **barrier** (default): after every round the orchestrator feeds the round's statistic to
  `ConsensusController.after_round`, which answers repeat/stop; at most ``max_rounds`` rounds.
* **lagged** (no per-round barrier): the number of rounds R of step t is fixed when the step
  begins, decided from the statistics of step t − L of the same controlled phase (L =
  ``ControlConfig.lag``, default 1: the previous step) by `lagged_rounds`: with s_r the
  statistic after round r of that step (R rounds done), R + 1 if s_R > target; R − 1 if R ≥ 2
  and s_{R−1} ≤ target (one round fewer would already have sufficed); R otherwise; clamped to
  [1, max_rounds]. The first L steps of every controlled phase use R = 1; if step t − L was never
  closed (an orchestrator that lost its statistics), the newest plan due is used. The target
  used is that of the step whose statistics are judged.
  With L = 1 a peer's step t needs the slowest peer to have finished step t − 1 — a global
  per-step barrier that plain gossip does not have (a peer only waits for its neighbours). Every
  step runs at least one round, so a peer asks for its plan only after round 1 of step t
  (`concord.peer.control`): the barrier then overlaps the local update and the first round, and is
  rarely felt. With L ≥ 2 the statistics a decision needs are in long before anyone asks (a peer
  can run at most about diam(G) steps ahead of the slowest one), at the price of a feedback
  delay of L steps: with L = 2 steps of even and odd index form two interleaved sequences, each
  adjusted as with L = 1.

The orchestrator imports this module, so it must never import torch.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from concord.core.control.calibration import (
    STATISTICS,
    Calibration,
    CalibrationRecorder,
    Statistic,
    check_stat,
    is_int,
)
from concord.core.control.plan import CONTROL_MODES, ControlMode, PhasePlan
from concord.core.records import JSON
from concord.core.registry import Registry

__all__ = [
    "CONTROL_MODES",
    "STATISTICS",
    "TARGET_POLICIES",
    "Calibration",
    "CalibrationRecorder",
    "ConsensusController",
    "ControlConfig",
    "ControlMode",
    "Decision",
    "lagged_rounds",
]

_STATE_VERSION = 2  # controller state (2: lagged plans keyed by step, for any lag)


@dataclass(frozen=True)
class ControlConfig:
    """Consensus-control hyperparameters.

    mode: "none" | "constant" | "adaptive" | "fixed" (see module docstring).
    factor: > 0; multiplies Ξ_max (constant) or the gradient-norm EMA (adaptive).
    max_rounds: ≥ 1; hard bound on gossip rounds per step.
    lagged: False = per-round barrier; True = rounds of step t from statistics of step t − lag.
    lag: ≥ 1; lagged mode only (must be 1 otherwise): the feedback delay L in steps.
    ema: EMA coefficient in [0, 1) of the adaptive target (0 = no smoothing).
    statistic: "theta" (estimator Θ), "sketch" (Ξ̂ from shared random sketches of the models,
        `concord.core.control.sketch`) or "xi" (exact Ξ, simulation only): what is fed to the
        controller; a constant-target calibration must be of the same kind.
    rounds: in [1, max_rounds]; mode "fixed" only (must be 1 otherwise): the gossip rounds of
        every controlled step.
    """

    mode: ControlMode = "none"
    factor: float = 1.0
    max_rounds: int = 20
    lagged: bool = False
    ema: float = 0.9
    statistic: Statistic = "theta"
    lag: int = 1
    rounds: int = 1

    def __post_init__(self) -> None:
        if self.mode not in CONTROL_MODES:
            raise ValueError(f"control mode = {self.mode!r}; valid: {', '.join(CONTROL_MODES)}")
        if not isinstance(self.factor, int | float) or not (
            math.isfinite(self.factor) and self.factor > 0
        ):
            raise ValueError(f"control factor = {self.factor!r}; must be a finite number > 0")
        if not is_int(self.max_rounds) or self.max_rounds < 1:
            raise ValueError(f"max_rounds = {self.max_rounds!r}; must be an integer ≥ 1")
        if not isinstance(self.lagged, bool):
            raise ValueError(f"lagged = {self.lagged!r}; must be a bool")
        if not is_int(self.lag) or self.lag < 1:
            raise ValueError(f"lag = {self.lag!r}; must be an integer ≥ 1")
        if self.lag != 1 and not self.lagged:
            raise ValueError(
                f"lag = {self.lag} only applies to lagged control (lagged = true); the barrier "
                "protocol decides every round of the current step"
            )
        if not isinstance(self.ema, int | float) or not 0.0 <= self.ema < 1.0:
            raise ValueError(f"ema = {self.ema!r}; the EMA coefficient must be in [0, 1)")
        if self.statistic not in STATISTICS:
            raise ValueError(f"statistic = {self.statistic!r}; valid: {', '.join(STATISTICS)}")
        if not is_int(self.rounds) or not 1 <= self.rounds <= self.max_rounds:
            raise ValueError(
                f"rounds = {self.rounds!r}; must be an integer in [1, max_rounds = "
                f"{self.max_rounds}]"
            )
        if self.rounds != 1 and self.mode != "fixed":
            raise ValueError(
                f"rounds = {self.rounds} only applies to control mode 'fixed' (the mode is "
                f"{self.mode!r}, whose rounds per step come from the statistic)"
            )


@dataclass(frozen=True)
class Decision:
    """Answer after one gossip round.

    repeat: do another round in this step. target: the target compared against (None when the
    phase is uncontrolled). rounds_next: lagged mode only, on the step's last round — the
    rounds planned for step ``step + lag``. reason: "above-target", "at-target", "max-rounds",
    "uncontrolled", "lagged-plan" or "fixed-rounds" (mode fixed).
    """

    repeat: bool
    target: float | None
    rounds_next: int | None = None
    reason: str = ""


def lagged_rounds(statistics: Sequence[float], target: float, max_rounds: int) -> int:
    """Rounds for the next step from the statistics after each of this step's R rounds.

    R + 1 if statistics[R−1] > target; R − 1 if R ≥ 2 and statistics[R−2] ≤ target; else R;
    clamped to [1, max_rounds].
    """
    r = len(statistics)
    if r < 1:
        raise ValueError("statistics is empty; the lagged rule needs ≥ 1 round's statistic")
    if statistics[-1] > target:
        nxt = r + 1
    elif r >= 2 and statistics[-2] <= target:
        nxt = r - 1
    else:
        nxt = r
    return min(max(nxt, 1), max_rounds)


class TargetPolicy(ABC):
    """How a controlled phase's target is computed (one implementation per consensus-control
    mode; modes "none" and "fixed" have no target)."""

    def __init__(self, config: ControlConfig, calibration: Calibration | None) -> None:
        self.config = config
        self.calibration = calibration

    def observe(self, phase_index: int, mean_grad_norm: float) -> None:  # noqa: B027
        """Called at the start of each step of a controlled phase (optional hook)."""

    @abstractmethod
    def target(self, phase_index: int) -> float: ...

    def state_dict(self) -> dict[str, JSON]:
        """The policy's state for checkpoints, as JSON (stateless by default: empty)."""
        return {}

    def load_state_dict(self, d: Mapping[str, JSON]) -> None:  # noqa: B027
        """Restore the policy state (stateless by default)."""


TARGET_POLICIES: Registry[type[TargetPolicy]] = Registry("consensus target")


@TARGET_POLICIES.register("constant")
class ConstantTarget(TargetPolicy):
    """target = factor × Calibration.max_statistic[phase]."""

    def target(self, phase_index: int) -> float:
        cal = self.calibration
        if cal is None or phase_index not in cal.max_statistic:
            raise ValueError(f"constant target: no calibration for phase {phase_index}")
        return self.config.factor * cal.max_statistic[phase_index]


@TARGET_POLICIES.register("adaptive")
class AdaptiveTarget(TargetPolicy):
    """target = factor × EMA of the mean local gradient norm, reset at each phase start."""

    def __init__(self, config: ControlConfig, calibration: Calibration | None) -> None:
        super().__init__(config, calibration)
        self.value: float | None = None
        self.phase: int | None = None

    def observe(self, phase_index: int, mean_grad_norm: float) -> None:
        if self.phase != phase_index or self.value is None:
            self.value, self.phase = mean_grad_norm, phase_index
        else:
            self.value = self.config.ema * self.value + (1.0 - self.config.ema) * mean_grad_norm

    def target(self, phase_index: int) -> float:
        if self.value is None or self.phase != phase_index:
            raise ValueError(
                f"adaptive target of phase {phase_index} asked before begin_step fed a "
                "gradient norm in that phase"
            )
        return self.config.factor * self.value

    def state_dict(self) -> dict[str, JSON]:
        return {"value": self.value, "phase": self.phase}

    def load_state_dict(self, d: Mapping[str, JSON]) -> None:
        value, phase = d.get("value"), d.get("phase")
        if phase is not None and (not is_int(phase) or phase < 1):
            raise ValueError(f"adaptive target state 'phase' = {phase!r}; must be ≥ 1 or None")
        self.value = None if value is None else check_stat("adaptive target state 'value'", value)
        self.phase = phase


class ConsensusController:
    """Per-run state machine deciding gossip repeat/stop (see the module docstring).

    Call order per step: ``begin_step`` → ``after_round`` for rounds 1, 2, … (barrier mode; in
    lagged mode optional, it then follows the plan) → ``end_step`` (needed in lagged mode).
    """

    def __init__(
        self, config: ControlConfig, plan: PhasePlan, calibration: Calibration | None = None
    ) -> None:
        self.config = config
        self.plan = plan
        controlled = plan.controlled_indices
        if config.mode == "none" and controlled:
            raise ValueError(
                f"the plan controls phase(s) {controlled} but the control mode is 'none'; "
                "use 'constant' or 'adaptive' (consensus control) or 'fixed'"
            )
        if config.mode == "constant":
            if calibration is None:
                raise ValueError(
                    f"control mode 'constant' needs a Calibration for phase(s) {controlled}"
                )
            missing = [k for k in controlled if k not in calibration.max_statistic]
            if missing:
                raise ValueError(
                    f"calibration has no max statistic for controlled phase(s) {missing} "
                    f"(it has {sorted(calibration.max_statistic)})"
                )
            if calibration.statistic != config.statistic:
                raise ValueError(
                    f"calibration recorded {calibration.statistic!r} but the controller is fed "
                    f"{config.statistic!r}; calibrate on the statistic you control"
                )
        self.calibration = calibration
        # mode fixed: the rounds of every controlled step (no target policy); None otherwise
        self._fixed: int | None = config.rounds if config.mode == "fixed" else None
        self._policy: TargetPolicy | None = (
            None
            if config.mode in ("none", "fixed")
            else TARGET_POLICIES.get(config.mode)(config, calibration)
        )
        self._step: int | None = None  # step begun and not yet ended
        self._planned = 1  # rounds planned for the current step (lagged)
        self._stats: list[float] = []  # statistics reported by after_round in this step
        self._stopped = False  # after_round already answered stop in this step
        # lagged: step → (rounds planned for it, phase index of the step it was judged on)
        self._next: dict[int, tuple[int, int]] = {}

    def begin_step(self, step: int, mean_grad_norm: float) -> int:
        """Start ``step``; feed the mean local gradient norm (pass 0.0 if unused).

        Returns the rounds planned for this step: mode fixed in a controlled phase → ``rounds``
        (both protocols: it is known in advance); lagged mode in a controlled phase → the lagged
        rule's R; otherwise 1 (barrier mode: more rounds come from ``after_round``).
        """
        g = check_stat("mean_grad_norm", mean_grad_norm)
        phase = self.plan.phase_at(step)
        planned = 1
        if self._fixed is not None and phase.controlled:
            planned = self._fixed
        elif self._policy is not None and phase.controlled:
            self._policy.observe(phase.index, g)
            due = [k for k in self._next if k <= step]
            if self.config.lagged and due:  # the newest plan due (a skipped step's, if any)
                rounds, judged = self._next[max(due)]
                planned = rounds if judged == phase.index else 1
        for old in [k for k in self._next if k <= step]:
            del self._next[old]
        self._step, self._planned, self._stats, self._stopped = step, planned, [], False
        return planned

    def planned(self, step: int) -> int | None:
        """Lagged mode: the rounds already planned for a future ``step`` (None if none yet)."""
        entry = self._next.get(step)
        return None if entry is None else entry[0]

    def target(self, step: int) -> float | None:
        """Target of ``step`` (None when its phase is uncontrolled)."""
        phase = self.plan.phase_at(step)
        if self._policy is None or not phase.controlled:
            return None
        return self._policy.target(phase.index)

    def _check_current(self, step: int, what: str) -> None:
        if self._step != step:
            raise ValueError(
                f"{what}(step={step!r}) but the current step is {self._step!r}; "
                f"call begin_step({step!r}) first"
            )

    def after_round(self, step: int, round_index: int, statistic: float) -> Decision:
        """Decide after round ``round_index`` (1-based, consecutive) of ``step``."""
        self._check_current(step, "after_round")
        if self._stopped:
            raise ValueError(f"after_round: step {step} was already told to stop")
        if round_index != len(self._stats) + 1:
            raise ValueError(
                f"round_index = {round_index!r}; expected {len(self._stats) + 1} (rounds are "
                "1-based and reported in order)"
            )
        s = check_stat(f"statistic (step {step}, round {round_index})", statistic)
        self._stats.append(s)
        phase = self.plan.phase_at(step)
        if self._fixed is not None and phase.controlled:
            repeat = round_index < self._fixed
            self._stopped = not repeat
            nxt = self._fixed if self.config.lagged and not repeat else None
            return Decision(repeat, None, rounds_next=nxt, reason="fixed-rounds")
        if self._policy is None or not phase.controlled:
            self._stopped = True
            return Decision(False, None, reason="uncontrolled")
        tgt = self._policy.target(phase.index)
        if self.config.lagged:
            repeat = round_index < self._planned
            self._stopped = not repeat
            nxt = None if repeat else lagged_rounds(self._stats, tgt, self.config.max_rounds)
            return Decision(repeat, tgt, rounds_next=nxt, reason="lagged-plan")
        if s <= tgt:
            decision = Decision(False, tgt, reason="at-target")
        elif round_index >= self.config.max_rounds:
            decision = Decision(False, tgt, reason="max-rounds")
        else:
            decision = Decision(True, tgt, reason="above-target")
        self._stopped = not decision.repeat
        return decision

    def end_step(self, step: int, statistics: Sequence[float]) -> None:
        """Close ``step`` given the statistic after each of its rounds (lagged bookkeeping)."""
        self._check_current(step, "end_step")
        stats = [check_stat(f"statistics[{i}]", v) for i, v in enumerate(statistics)]
        if self._stats and stats != self._stats:
            raise ValueError(
                f"end_step(step={step}) statistics {stats} differ from those reported by "
                f"after_round {self._stats}"
            )
        phase = self.plan.phase_at(step)
        if self.config.lagged and self._policy is not None and phase.controlled:
            if not 1 <= len(stats) <= self.config.max_rounds:
                raise ValueError(
                    f"end_step(step={step}) got {len(stats)} statistics; a controlled step has "
                    f"1 … max_rounds = {self.config.max_rounds} rounds"
                )
            tgt = self._policy.target(phase.index)
            self._next[step + self.config.lag] = (
                lagged_rounds(stats, tgt, self.config.max_rounds),
                phase.index,
            )
        self._step, self._stats, self._stopped = None, [], False

    def state_dict(self) -> dict[str, JSON]:
        """The state for checkpoints, as JSON (config, plan and calibration are not included)."""
        return {
            "version": _STATE_VERSION,
            "mode": self.config.mode,
            "lagged": self.config.lagged,
            "lag": self.config.lag,
            "policy": self._policy.state_dict() if self._policy is not None else {},
            "step": self._step,
            "planned": self._planned,
            "stats": list(self._stats),
            "stopped": self._stopped,
            "next": [[k, r, p] for k, (r, p) in sorted(self._next.items())],
        }

    def load_state_dict(self, d: Mapping[str, JSON]) -> None:
        """Continue from a `state_dict` of a controller of the same mode, protocol and lag.
        Raises ValueError naming the field that does not match."""
        if not isinstance(d, Mapping) or d.get("version") != _STATE_VERSION:
            raise ValueError(f"controller state must be a mapping with version {_STATE_VERSION}")
        c = self.config
        if (d.get("mode"), d.get("lagged"), d.get("lag")) != (c.mode, c.lagged, c.lag):
            raise ValueError(
                f"controller state is for mode={d.get('mode')!r}, lagged={d.get('lagged')!r}, "
                f"lag={d.get('lag')!r}; this controller has mode={c.mode!r}, "
                f"lagged={c.lagged!r}, lag={c.lag!r}"
            )
        step = d.get("step")
        if step is not None and (not is_int(step) or step < 0):
            raise ValueError(f"controller state 'step' = {step!r}; must be ≥ 0 or None")
        planned = self._rounds_field(d, "planned")
        nxt = dict(self._next_entry(entry) for entry in _json_list(d, "next"))
        stats = [check_stat("controller state 'stats'", v) for v in _json_list(d, "stats")]
        if self._policy is not None:
            policy = d.get("policy", {})
            if not isinstance(policy, dict):
                raise ValueError(f"controller state 'policy' = {policy!r}; must be a table")
            self._policy.load_state_dict(policy)
        self._step, self._planned, self._stats = step, planned, stats
        self._stopped = bool(d.get("stopped", False))
        self._next = nxt

    def _next_entry(self, entry: JSON) -> tuple[int, tuple[int, int]]:
        """An entry [step, rounds, phase] of the state's ``next`` as step → (rounds, phase)."""
        values = entry if isinstance(entry, list) else []
        ints = [v for v in values if is_int(v)]
        if (
            len(values) != 3
            or len(ints) != 3
            or ints[0] < 0
            or ints[2] < 1
            or not (1 <= ints[1] <= self.config.max_rounds)
        ):
            raise ValueError(
                f"controller state 'next' entry {entry!r}; must be [step ≥ 0, rounds in "
                f"1 … {self.config.max_rounds}, phase ≥ 1]"
            )
        step, rounds, phase = ints
        return step, (rounds, phase)

    def _rounds_field(self, d: Mapping[str, JSON], name: str) -> int:
        v = d.get(name)
        if not is_int(v) or not 1 <= v <= self.config.max_rounds:
            raise ValueError(
                f"controller state {name!r} = {v!r}; must be in 1 … {self.config.max_rounds}"
            )
        return int(v)


def _json_list(d: Mapping[str, JSON], name: str) -> list[JSON]:
    """The list ``d[name]`` of a controller state (empty when absent)."""
    value = d.get(name, [])
    if not isinstance(value, list):
        raise ValueError(f"controller state {name!r} = {value!r}; must be a list")
    return value
