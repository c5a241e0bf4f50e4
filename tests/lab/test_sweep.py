"""`concord sweep`: grid expansion, scheduling around calibrations, failures, Table-2 output.

The runs are fakes (module-level, so they pickle into spawned workers); configs are plain dicts
of the run's overrides, except in the test that validates every override with the real config.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from concord.core.config import apply_overrides, load_config
from concord.core.records import RunSummary
from concord.lab.sweep import Sweep, parse_factor, sweep_main

BASE_ACC = {"dec-phase-1": 0.90, "dec-phase-2": 0.93}


def fake_accuracy(cfg: Mapping[str, Any]) -> float:
    if cfg.get("algorithm") == "allreduce":
        return 0.95 + 0.01 * int(cfg["seed"])
    factor = 0.0 if cfg["control.mode"] == "none" else float(cfg["control.factor"])
    return BASE_ACC[str(cfg["plan"])] + 0.01 * factor + 0.01 * int(cfg["seed"])


def summary(cfg: Mapping[str, Any], **values: object) -> dict[str, Any]:
    """A run summary's document (`RunSummary`) with ``values`` for its measured fields."""
    fields: dict[str, Any] = {
        "engine": "vectorized", "algorithm": str(cfg.get("algorithm", "dsgd")),
        "topology": str(cfg.get("topology", "ring")), "peers": 4, "steps": 10, "epochs": 1.0,
        "seed": int(cfg.get("seed", 0)), "plan": str(cfg.get("plan", "gossip")),
        "control_mode": str(cfg.get("control.mode", "none")), "control_factor": None,
        "accuracy_avg_model": None, "accuracy_worst_peer": None, "accuracy_mean_peer": None,
        "gossip_rounds_total": 0, "bytes_sent_total": 0, "bytes_raw_total": 0,
        "final_consensus_distance": None, "partition_sha256": None, "wall_seconds": 0.0,
        "run_dir": "runs/x",
    }  # fmt: skip
    return RunSummary(**{**fields, **values}).to_json()


def fake_run(
    cfg: Mapping[str, Any],
    out_dir: Path,
    *,
    progress: bool = True,
    calibration_cache: Path | None = None,
) -> dict[str, Any]:
    """Succeeds except dec-phase-2 × 0.5 × seed 1; checks calibration is never computed twice."""
    assert calibration_cache is not None
    conflict = False
    if cfg["control.mode"] == "constant":
        marker = calibration_cache / f"{cfg['plan']}-{cfg['topology']}-{cfg['seed']}"
        try:
            with open(marker, "x") as f:  # first one computes the calibration
                f.write("computing")
            time.sleep(0.3)
            marker.write_text("done")
        except FileExistsError:
            conflict = marker.read_text() != "done"  # another run is computing it right now
    (out_dir / "fake.json").write_text(json.dumps({"progress": progress, "conflict": conflict}))
    if cfg.get("plan") == "dec-phase-2" and cfg.get("control.factor") == 0.5 and cfg["seed"] == 1:
        raise RuntimeError("boom")
    return summary(
        cfg,
        accuracy_avg_model=fake_accuracy(cfg),
        accuracy_worst_peer=fake_accuracy(cfg) - 0.05,
        accuracy_mean_peer=fake_accuracy(cfg) - 0.02,
        gossip_rounds_total=100 * (1 + int(cfg["seed"])),
        bytes_sent_total=4096,
        final_consensus_distance=0.01,
        wall_seconds=1.5,
    )


def crashing_run(
    cfg: Mapping[str, Any],
    out_dir: Path,
    *,
    progress: bool = True,
    calibration_cache: Path | None = None,
) -> dict[str, Any]:
    """Kills its worker process for seed 1 (like the OOM killer would)."""
    if cfg["seed"] == 1:
        os._exit(3)
    return summary(cfg, accuracy_avg_model=0.9, gossip_rounds_total=10)


def malformed_run(
    cfg: Mapping[str, Any],
    out_dir: Path,
    *,
    progress: bool = True,
    calibration_cache: Path | None = None,
) -> dict[str, Any]:
    """Returns a summary whose ``peers`` is not a number for seed 1."""
    doc = summary(cfg, accuracy_avg_model=0.9)
    if cfg["seed"] == 1:
        doc["peers"] = "four"
    return doc


def _dict_config(overrides: Mapping[str, object]) -> dict[str, object]:
    return dict(overrides)


GRID = Sweep(
    plans=("dec-phase-1", "dec-phase-2"),
    factors=(None, 0.5, 0.25),
    topologies=("ring", "torus"),
    seeds=(0, 1),
    baselines=("allreduce", "gossip"),
)


def test_grid_expansion() -> None:
    runs = GRID.runs()
    # 2 plans × 3 factors × 2 topologies × 2 seeds, all-reduce per seed, gossip per topology×seed
    assert len(runs) == 24 + 2 + 4
    names = [r.name for r in runs]
    assert len(set(names)) == len(names)
    assert names[:3] == ["dec-phase-1_none_ring_s0", "dec-phase-1_none_ring_s1",
                         "dec-phase-1_c0.5_ring_s0"]  # fmt: skip
    assert names[24:] == ["allreduce_s0", "allreduce_s1", "gossip_ring_s0", "gossip_ring_s1",
                          "gossip_torus_s0", "gossip_torus_s1"]  # fmt: skip
    by_name = {r.name: r for r in runs}
    assert dict(by_name["dec-phase-2_c0.25_torus_s1"].overrides) == {
        "plan": "dec-phase-2", "topology": "torus", "seed": 1, "control.mode": "constant",
        "control.factor": 0.25, "control.phases": [2],
    }  # fmt: skip
    assert dict(by_name["dec-phase-1_none_ring_s0"].overrides) == {
        "plan": "dec-phase-1", "topology": "ring", "seed": 0, "control.mode": "none",
    }  # fmt: skip
    assert dict(by_name["allreduce_s1"].overrides) == {
        "algorithm": "allreduce", "control.mode": "none", "seed": 1,
    }  # fmt: skip
    assert by_name["gossip_torus_s0"].overrides["plan"] == "gossip"
    adaptive = Sweep(("dec-phase-1",), (2.0,), ("ring",), (0,), control_mode="adaptive").runs()
    assert adaptive[0].name == "dec-phase-1_a2_ring_s0"
    assert adaptive[0].overrides["control.mode"] == "adaptive"
    assert adaptive[0].calibration_group is None


def test_overrides_validate_with_the_real_config() -> None:
    base = load_config(None, ["topology=ring", "peers=8"])
    for run in GRID.runs():
        cfg = apply_overrides(base, run.overrides)
        assert cfg.seed == run.seed
        if run.factor is not None:
            assert cfg.controlled_phases() == [int(run.row[-1])]


def test_schedule_holds_back_runs_that_reuse_a_calibration() -> None:
    first, held = GRID.schedule()
    groups = {(p, t, s) for p in GRID.plans for t in GRID.topologies for s in GRID.seeds}
    assert set(held) == groups
    calibrating = [r for r in first if r.calibration_group is not None]
    assert {r.calibration_group for r in calibrating} == groups
    assert len(calibrating) == len(groups)
    assert first[: len(groups)] == calibrating  # the longest runs start first
    assert all(r.factor == 0.25 and r.calibration_group == g for g, rs in held.items() for r in rs)
    assert len(first) + sum(len(v) for v in held.values()) == len(GRID.runs())


def test_parse_factor_and_validation() -> None:
    assert parse_factor("none") is None
    assert parse_factor("1/4") == 0.25
    assert parse_factor(" 0.5 ") == 0.5
    for bad in ("0", "-1", "abc", "nan"):
        with pytest.raises(ValueError, match="factor"):
            parse_factor(bad)
    with pytest.raises(ValueError, match="seeds has duplicates"):
        Sweep(("dec-phase-1",), (None,), ("ring",), (0, 0))
    with pytest.raises(ValueError, match="valid: allreduce, gossip"):
        Sweep(("dec-phase-1",), (None,), ("ring",), (0,), baselines=("centralized",))


def test_sweep_main_tables(tmp_path: Path) -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=200)
    out = sweep_main(
        None, [], ["dec-phase-1,dec-phase-2"], ["none", "0.5"], ["ring"], ["0,1,2"],
        ["allreduce"], 2, tmp_path / "sweep", "avg", fake_run,
        configure=_dict_config, console=console,
    )  # fmt: skip
    assert out == tmp_path / "sweep"
    with open(out / "table.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2 * 3 + 3
    failed = [r for r in rows if r["status"] != "ok"]
    assert [r["name"] for r in failed] == ["dec-phase-2_c0.5_ring_s1"]
    assert "RuntimeError: boom" in failed[0]["error"]
    assert failed[0]["accuracy_avg_model"] == ""
    assert (out / "runs" / "dec-phase-2_c0.5_ring_s1" / "error.txt").read_text().count("boom")
    ok = {r["name"]: r for r in rows if r["status"] == "ok"}
    assert float(ok["dec-phase-1_c0.5_ring_s2"]["accuracy_avg_model"]) == pytest.approx(0.925)
    assert ok["allreduce_s0"]["factor"] == "none"
    assert ok["allreduce_s0"]["topology"] == ""
    for name in ok:  # each run got its own dir, no progress bar, and never met a half calibration
        fake = json.loads((out / "runs" / name / "fake.json").read_text())
        assert fake == {"progress": False, "conflict": False}
    assert sorted(p.name for p in (out / "calibration").iterdir()) == [
        f"{p}-ring-{s}" for p in ("dec-phase-1", "dec-phase-2") for s in (0, 1, 2)
    ]
    text = buffer.getvalue()
    # dec-phase-1, uncontrolled: 0.90, 0.91, 0.92 → 91.00 ± 1.00 (sample std); with 0.5·Ξ_max
    # every value is 0.005 higher. dec-phase-2 × ½Ξ_max lost seed 1: 93.50, 95.50 → (2/3).
    # all-reduce: 0.95, 0.96, 0.97. Rounds: 100, 200, 300 → 200.
    for cell in ("91.00 ± 1.00", "91.50 ± 1.00", "94.50 ± 1.41 (2/3)", "96.00 ± 1.00"):
        assert cell in text, cell
    lines = text.splitlines()
    header = next(line for line in lines if "uncontrolled" in line)
    assert header.index("plan") < header.index("uncontrolled") < header.index("½Ξ_max")
    order = [next(i for i, line in enumerate(lines) if label in line)
             for label in ("dec-phase-1", "dec-phase-2", "all-reduce")]  # fmt: skip
    assert order == sorted(order)
    assert "Gossip rounds" in text
    assert "200" in text
    markdown = (out / "table.md").read_text()
    assert "| dec-phase-1 | 91.00 ± 1.00 | 91.50 ± 1.00 |" in markdown
    assert "| all-reduce | 96.00 ± 1.00 |  |" in markdown
    grid = json.loads((out / "sweep.json").read_text())
    assert grid["factors"] == ["none", 0.5]
    assert len(grid["runs"]) == len(rows)


def test_worker_crash_fails_only_its_run(tmp_path: Path) -> None:
    out = sweep_main(
        None, [], ["dec-phase-1"], ["none"], ["ring"], [0, 1, 2], [], 2, tmp_path, "worst",
        crashing_run, configure=_dict_config, console=Console(file=io.StringIO()),
    )  # fmt: skip
    with open(out / "table.csv", newline="") as f:
        status = {r["seed"]: (r["status"], r["error"]) for r in csv.DictReader(f)}
    assert status["0"] == ("ok", "")
    assert status["2"] == ("ok", "")
    assert status["1"][0] == "error"
    assert "worker process died" in status["1"][1]


def test_bad_config_fails_one_run_not_the_sweep(tmp_path: Path) -> None:
    base = load_config(None, [])

    def configure(overrides: Mapping[str, object]) -> dict[str, object]:
        apply_overrides(base, overrides)  # raises ConfigError for the unknown topology
        return dict(overrides)

    out = sweep_main(
        None, [], ["dec-phase-1"], ["none"], ["ring", "no-such-graph"], [0], [], 1, tmp_path,
        "avg", fake_run, configure=configure, console=Console(file=io.StringIO()),
    )  # fmt: skip
    with open(out / "table.csv", newline="") as f:
        rows = {r["topology"]: r for r in csv.DictReader(f)}
    assert rows["ring"]["status"] == "ok"
    assert rows["no-such-graph"]["status"] == "error"
    assert "config:" in rows["no-such-graph"]["error"]
    assert "topology" in rows["no-such-graph"]["error"]


def test_a_summary_that_is_no_run_summary_fails_its_run_naming_the_field(tmp_path: Path) -> None:
    out = sweep_main(
        None, [], ["dec-phase-1"], ["none"], ["ring"], [0, 1], [], 1, tmp_path, "avg",
        malformed_run, configure=_dict_config, console=Console(file=io.StringIO()),
    )  # fmt: skip
    with open(out / "table.csv", newline="") as f:
        rows = {r["seed"]: r for r in csv.DictReader(f)}
    assert (rows["0"]["status"], rows["0"]["accuracy_avg_model"]) == ("ok", "0.9")
    assert rows["1"]["status"] == "error"
    assert "RecordError" in rows["1"]["error"]
    assert "summary.json: field 'peers'" in rows["1"]["error"]
    assert rows["1"]["wall_seconds"] != ""  # measured in the worker
