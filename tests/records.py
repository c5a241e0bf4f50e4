"""Records for tests: a step record with every field a peer's record has, an orchestrator
summary with neutral counters."""

from __future__ import annotations

from typing import Any

from concord.core.records import JSON, OrchestratorSummary, StepRecord


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


def orchestrator_summary(**fields: Any) -> OrchestratorSummary:
    """An ``orchestrator-summary.json`` record of run "r": no peer done or dropped, counters 0,
    ``fields`` over them."""
    values: dict[str, Any] = {
        "run": "r",
        "peers_done": [],
        "peers_dropped": [],
        "schedule_versions": 1,
        "rejected_payloads": 0,
        "stats_ignored": 0,
        "stats_refused": 0,
        "control_handler_errors": 0,
        "graph_decisions": None,
        "graph_steps_partial": None,
        "wall_seconds": 1.0,
        "cpu_seconds": 0.5,
    }
    return OrchestratorSummary(**{**values, **fields})
