"""Step records for the tests of the peer's hooks: every field a peer's record has."""

from __future__ import annotations

from concord.core.records import JSON, StepRecord


def step_record(
    step: int = 0, *, extra: dict[str, JSON] | None = None, **fields: float
) -> StepRecord:
    """A peer's step record of ``step``: neutral values, ``fields`` and ``extra`` over them."""
    values: dict[str, float | int | None] = {
        "epoch": 0.1,
        "phase": 1,
        "lr": 0.1,
        "loss": 1.0,
        "train_acc": 0.5,
        "rounds": 1,
        "theta": None,
        "target": None,
        "grad_norm": 1.0,
        "bytes_sent": 0,
        "rounds_total": step + 1,
    }
    values.update(fields)
    return StepRecord.from_json(
        {"kind": "step", "version": 1, "step": step, "peer": 0, **values, **(extra or {})},
        where="test record",
    )
