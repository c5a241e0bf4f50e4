"""``control.statistic = "sketch"`` on the real system: peers send their sketches s_i with every
round's statistics, the orchestrator reduces them to Ξ̂ (`concord.orchestrator.rounds`), against
the vectorized engine on the same config and seed (the pattern and tolerances of
tests/integration/test_orchestrated.py: parameters to 1e-5, rounds per step exactly — the same
repeat/stop decisions — and the calibrated max statistic to a relative 1e-5, as the models
differ in their float32 reduction order)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_orchestrated import _cfg, _compare, _steps


def test_a_constant_target_on_the_sketch_matches_the_vectorized_engine(tmp_path: Path) -> None:
    cfg = _cfg(
        "epochs=0.5",
        "control.mode=constant",
        "control.factor=0.25",
        "control.statistic=sketch",
        "optim.milestones=[0.5]",
    )
    summary = _compare(cfg, tmp_path)  # same rounds per step and parameters as vectorized
    assert summary["gossip_rounds_total"] > summary["steps"]  # the target made rounds repeat
    cal = {
        engine: json.loads((tmp_path / engine / "calibration.json").read_text())
        for engine in ("vectorized", "processes")
    }
    assert cal["processes"]["statistic"] == "sketch"
    for phase, value in cal["vectorized"]["max_statistic"].items():
        assert cal["processes"]["max_statistic"][phase] == pytest.approx(value, rel=1e-5)
    assert len(_steps(tmp_path / "processes" / "metrics.jsonl")) == summary["steps"]
