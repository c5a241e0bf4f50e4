"""``control.mode = "fixed"`` on the real system: orchestrator + peer processes over MQTT and gRPC
against the vectorized engine on the same config and seed (the pattern and tolerances of
tests/integration/test_orchestrated.py: parameters to 1e-5, rounds per step exactly).

Every peer runs the two rounds of each step on its own: no calibration stage, no fallback, and
the orchestrator records every round without deciding anything."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.test_orchestrated import _cfg, _compare, _steps


def test_two_fixed_rounds_per_step_match_the_vectorized_engine(tmp_path: Path) -> None:
    cfg = _cfg("epochs=0.5", "control.mode=fixed", "control.rounds=2", "control.phases=[1, 2, 3]")
    summary = _compare(cfg, tmp_path)  # same rounds per step and parameters as vectorized
    steps = _steps(tmp_path / "processes" / "metrics.jsonl")
    assert [r["rounds"] for r in steps] == [2] * summary["steps"]
    assert summary["gossip_rounds_total"] == 2 * summary["steps"]
    vectorized = json.loads((tmp_path / "vectorized" / "summary.json").read_text())
    assert summary["bytes_sent_total"] == vectorized["bytes_sent_total"]  # raw float32 frames
    for engine in ("vectorized", "processes"):
        assert not (tmp_path / engine / "calibration.json").exists(), engine
    for i in range(cfg.peers):
        peer = _steps(tmp_path / "processes" / "peers" / f"peer-{i}" / "metrics.jsonl")
        assert {r["control"] for r in peer} == {"fixed"}  # decided by the config, not a fallback
    rounds = [json.loads(x) for x in (tmp_path / "processes" / "control.jsonl").open()]
    rounds = [r for r in rounds if r.get("kind") == "round"]
    assert [(r["round"], r["repeat"]) for r in rounds] == [(1, True), (2, False)] * summary["steps"]
    assert {(r["stage"], r["reason"], r["target"]) for r in rounds} == {
        ("train", "fixed-rounds", None)
    }
    assert not any(r["partial"] for r in rounds)
