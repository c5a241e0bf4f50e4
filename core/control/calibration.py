"""The calibration pass of consensus control's constant targets (torch-free): the per-phase
maximum of the statistic in an *uncontrolled* run (`CalibrationRecorder`) and its result
(`Calibration`), which `concord.core.control.controller.ConsensusController` turns into targets
(target = factor × max of the phase; Kong et al. 2021, Table 2). Calibrate on the same statistic
the controller is fed (Θ or the exact Ξ). A calibration is written and read as its record,
`concord.core.records.CalibrationRecord` (``calibration.json``, `read_calibration`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeGuard, get_args

from concord.core.records import JSON, CalibrationRecord, RecordError

__all__ = ["STATISTICS", "Calibration", "CalibrationRecorder", "Statistic", "read_calibration"]

Statistic = Literal["theta", "xi", "sketch"]
STATISTICS: tuple[str, ...] = get_args(Statistic)


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
    statistic: "theta", "xi" or "sketch", the kind of statistic recorded.
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

    def record(self) -> CalibrationRecord:
        """This calibration as its record (phase keys become decimal strings, as JSON requires)."""
        return CalibrationRecord(
            statistic=self.statistic,
            max_statistic={str(k): float(v) for k, v in sorted(self.max_statistic.items())},
        )

    def to_json(self) -> dict[str, JSON]:
        """Its record's document (`record`)."""
        return self.record().to_json()

    @classmethod
    def from_json(cls, obj: object, *, where: str) -> Calibration:
        """A calibration record's document (``obj``, read from ``where``) as a `Calibration`.
        Raises `RecordError` naming ``where`` and the field that does not match."""
        record = CalibrationRecord.from_json(obj, where=where)
        out: dict[int, float] = {}
        for key, value in record.max_statistic.items():
            field = f"max_statistic.{key}"
            if not key.isdecimal() or int(key) < 1:
                raise RecordError(where, field, "a phase index must be an integer ≥ 1")
            if not math.isfinite(value) or value < 0:
                raise RecordError(where, field, f"{value!r}; must be a finite number ≥ 0")
            out[int(key)] = value
        try:
            return cls(out, record.statistic)
        except ValueError as exc:
            raise RecordError(where, "statistic", str(exc)) from None


def read_calibration(path: Path) -> Calibration:
    """The calibration in ``path`` (a ``calibration.json``). Raises OSError when it cannot be
    read, `RecordError` (a ValueError) naming the file and the field that does not match."""
    text = path.read_text(encoding="utf-8")
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}:{exc.lineno}", "", f"not JSON ({exc.msg})") from None
    return Calibration.from_json(body, where=str(path))


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
