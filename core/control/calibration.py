"""The calibration pass of consensus control's constant targets (torch-free): the per-phase
maximum of the statistic in an *uncontrolled* run (`CalibrationRecorder`) and its result
(`Calibration`), which `concord.core.control.controller.ConsensusController` turns into targets
(target = factor × max of the phase; Kong et al. 2021, Table 2). Calibrate on the same statistic
the controller is fed (Θ or the exact Ξ).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard, get_args

__all__ = ["STATISTICS", "Calibration", "CalibrationRecorder", "Statistic"]

Statistic = Literal["theta", "xi"]
STATISTICS: tuple[str, ...] = get_args(Statistic)
_VERSION = 1  # calibration files


def is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def check_stat(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} = {v!r}; must be a finite number ≥ 0")
    return float(v)


@dataclass
class Calibration:
    """Result of the uncontrolled calibration pass (input of the constant target).

    max_statistic: phase index (1-based) → max Θ (or Ξ) observed during that phase, ≥ 0.
    statistic: "theta" or "xi", the kind of statistic recorded.
    """

    max_statistic: dict[int, float]
    statistic: str

    def __post_init__(self) -> None:
        if self.statistic not in STATISTICS:
            raise ValueError(f"calibration statistic = {self.statistic!r}; valid: {STATISTICS}")
        for k, v in self.max_statistic.items():
            if not is_int(k) or k < 1:
                raise ValueError(f"calibration phase index {k!r}; must be an integer ≥ 1")
            check_stat(f"calibration max_statistic[{k}]", v)

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict (phase keys become strings, as JSON requires)."""
        return {
            "version": _VERSION,
            "statistic": self.statistic,
            "max_statistic": {str(k): float(v) for k, v in sorted(self.max_statistic.items())},
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Calibration:
        if not isinstance(d, Mapping) or d.get("version") != _VERSION:
            raise ValueError(f"calibration must be a mapping with version {_VERSION}, got {d!r}")
        raw = d.get("max_statistic")
        if not isinstance(raw, Mapping):
            raise ValueError(f"calibration max_statistic must be a mapping, got {raw!r}")
        out: dict[int, float] = {}
        for k, v in raw.items():
            try:
                idx = int(k)
            except (TypeError, ValueError):
                raise ValueError(f"calibration phase key {k!r} is not an integer") from None
            out[idx] = check_stat(f"calibration max_statistic[{k}]", v)
        return cls(out, str(d.get("statistic")))


class CalibrationRecorder:
    """Records the per-phase maximum of the statistic during an uncontrolled run."""

    def __init__(self, statistic: str = "theta") -> None:
        if statistic not in STATISTICS:
            raise ValueError(f"statistic = {statistic!r}; valid: {', '.join(STATISTICS)}")
        self.statistic = statistic
        self._max: dict[int, float] = {}

    def observe(self, step: int, phase_index: int, statistic: float) -> None:
        """Record one round's statistic; a non-finite value (diverged run) is an error."""
        if not is_int(step) or step < 0:
            raise ValueError(f"step = {step!r}; must be an integer ≥ 0")
        if not is_int(phase_index) or phase_index < 1:
            raise ValueError(f"phase_index = {phase_index!r}; must be an integer ≥ 1")
        s = check_stat(f"statistic at step {step}", statistic)
        self._max[phase_index] = max(s, self._max.get(phase_index, s))

    def result(self) -> Calibration:
        return Calibration(dict(self._max), self.statistic)
