"""The vectorized engine end to end: run directory, determinism, consensus control."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from concord.core.config import load_config
from concord.sim.engine import run

torch.set_num_threads(1)

SMALL = [
    "peers=4",
    "dataset.samples=800",
    "model=mlp",
    "model.hidden=[32]",
    "epochs=2",
    "optim.batch_size=16",
    "eval.every=1",
    "control.mode=none",
]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_run_writes_everything(tmp_path: Path) -> None:
    cfg = load_config(None, SMALL, environ={})
    summary = run(cfg, tmp_path / "run", progress=False)
    d = tmp_path / "run"
    for name in (
        "config.toml",
        "manifest.json",
        "metrics.jsonl",
        "partition.json",
        "summary.json",
        "log.jsonl",
        "checkpoint.pt",
        "accuracy.png",
        "consensus.png",
        "rounds.png",
    ):
        assert (d / name).is_file(), name
    for key in (
        "engine",
        "algorithm",
        "topology",
        "peers",
        "steps",
        "accuracy_avg_model",
        "accuracy_worst_peer",
        "accuracy_mean_peer",
        "gossip_rounds_total",
        "bytes_sent_total",
        "final_consensus_distance",
        "wall_seconds",
    ):
        assert key in summary, key
    assert summary["engine"] == "vectorized"
    assert summary["gossip_rounds_total"] == summary["steps"]  # uncontrolled: one round per step
    assert 0.0 <= summary["accuracy_worst_peer"] <= summary["accuracy_mean_peer"] <= 1.0
    steps = [m for m in _metrics(d) if m["kind"] == "step"]
    assert len(steps) == summary["steps"]
    assert all(m["xi"] is not None and m["theta"] is not None for m in steps)
    assert json.loads((d / "summary.json").read_text())["steps"] == summary["steps"]
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["topologies"]["ring"]["spectral_gap"] > 0
    edges = json.loads((d / "edges.json").read_text())
    assert {(e["src"], e["dst"]) for e in edges} == {
        (i, (i + s) % 4) for i in range(4) for s in (1, 3)
    }  # the ring, both ways
    assert sum(e["bytes_wire"] for e in edges) == summary["bytes_sent_total"]
    from concord.runtime.rundir import load_checkpoint

    state = load_checkpoint(d / "checkpoint.pt")
    assert state["params"].shape[0] == 4


def test_same_config_and_seed_give_identical_metrics(tmp_path: Path) -> None:
    cfg = load_config(None, SMALL, environ={})
    run(cfg, tmp_path / "a", progress=False)
    run(cfg, tmp_path / "b", progress=False)
    assert (tmp_path / "a" / "metrics.jsonl").read_text() == (
        tmp_path / "b" / "metrics.jsonl"
    ).read_text()
    other = load_config(None, [*SMALL, "seed=1"], environ={})
    run(other, tmp_path / "c", progress=False)
    assert (tmp_path / "a" / "metrics.jsonl").read_text() != (
        tmp_path / "c" / "metrics.jsonl"
    ).read_text()


@pytest.mark.parametrize("statistic", ["theta", "xi"])
def test_adaptive_control_meets_target_or_max_rounds(tmp_path: Path, statistic: str) -> None:
    cfg = load_config(
        None,
        [
            *SMALL,
            "control.mode=adaptive",
            "control.factor=0.02",
            "control.max_rounds=6",
            f"control.statistic={statistic}",
            "engine=vectorized",  # exact Ξ is known in the vectorized engine only
            "control.phases=[1]",
        ],
        environ={},
    )
    run(cfg, tmp_path / "r", progress=False)
    steps = [m for m in _metrics(tmp_path / "r") if m["kind"] == "step"]
    controlled = [m for m in steps if m["phase"] == 1]
    assert controlled
    assert all(m["target"] is not None for m in controlled)
    for m in controlled:
        value = m["theta"] if statistic == "theta" else m["xi"]
        assert m["rounds"] == 6 or value <= m["target"] * (1 + 1e-9), m
    assert any(m["rounds"] > 1 for m in controlled)  # a tight target forces repeats
    assert all(m["rounds"] == 1 and m["target"] is None for m in steps if m["phase"] > 1)


def test_constant_control_calibrates_automatically(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        [*SMALL, "control.mode=constant", "control.factor=0.25", "control.max_rounds=10"],
        environ={},
    )
    cache = tmp_path / "cache"
    run(cfg, tmp_path / "r", progress=False, calibration_cache=cache)
    cal = json.loads((tmp_path / "r" / "calibration.json").read_text())
    assert len(list(cache.glob("calibration-*.json"))) == 1
    (phase1_max,) = [v for k, v in cal["max_statistic"].items() if int(k) == 1]
    steps = [m for m in _metrics(tmp_path / "r") if m["kind"] == "step" and m["phase"] == 1]
    assert all(m["target"] == pytest.approx(0.25 * phase1_max) for m in steps)
    assert all(m["rounds"] == 10 or m["theta"] <= m["target"] * (1 + 1e-9) for m in steps)
    # the calibration is cached: a second run reuses it (same numbers, file untouched)
    mtime = next(cache.glob("calibration-*.json")).stat().st_mtime_ns
    run(cfg, tmp_path / "r2", progress=False, calibration_cache=cache)
    assert next(cache.glob("calibration-*.json")).stat().st_mtime_ns == mtime


def test_dec_phase_plan_uses_exact_averaging_elsewhere(tmp_path: Path) -> None:
    cfg = load_config(None, [*SMALL, "plan=dec-phase-2"], environ={})
    run(cfg, tmp_path / "r", progress=False)
    steps = [m for m in _metrics(tmp_path / "r") if m["kind"] == "step"]
    for m in steps:
        if m["phase"] == 2:
            assert m["rounds"] == 1
        else:
            assert m["rounds"] == 0
            assert m["xi"] < 1e-4  # exact averaging leaves float32 round-off only
