"""The real system on loopback: orchestrator + peer processes over MQTT (embedded amqtt and a real
Mosquitto) and gRPC, against the vectorized engine on the same config and seed.

Tolerances: the peers' parameters match the vectorized engine's to 1e-5 after a short run —
one replica per process vs n batched replicas changes float32 reduction orders (~1e-7 per step);
consensus control must make the *same* repeat/stop decisions, so the rounds per step are compared
exactly.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from concord.core.config import RunConfig, load_config
from concord.orchestrator.broker import MosquittoBroker, mosquitto_binary
from concord.protos.control_plane import TOPICS, Metrics, PayloadError, decode
from concord.runtime.rundir import load_checkpoint
from concord.sim.engine import run as run_vectorized
from concord.sim.processes import run_processes
from tests.integration.peers import lifecycle

SMALL = [
    "peers=4",
    "dataset.samples=3000",
    "eval.every=1",
    "control.mode=adaptive",
    "control.factor=0.05",  # small target: most steps take several rounds
    "control.max_rounds=6",
]


def _cfg(*extra: str) -> RunConfig:
    return load_config(None, [*SMALL, *extra], environ={})


def _steps(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in rows if r["kind"] == "step" and r.get("stage", "train") == "train"]


def _compare(cfg: RunConfig, tmp: Path, broker: str | None = None) -> dict[str, Any]:
    vec = run_vectorized(cfg, tmp / "vectorized", progress=False)
    proc = run_processes(cfg, tmp / "processes", progress=False, broker=broker)
    expected = [r["rounds"] for r in _steps(tmp / "vectorized" / "metrics.jsonl")]
    params = load_checkpoint(tmp / "vectorized" / "checkpoint.pt")["params"]
    for i in range(cfg.peers):
        peer_dir = tmp / "processes" / "peers" / f"peer-{i}"
        got = [r["rounds"] for r in _steps(peer_dir / "metrics.jsonl")]
        assert got == expected, f"peer {i} rounds per step differ from the vectorized engine"
        assert all(r["step_ms"] > 0 for r in _steps(peer_dir / "metrics.jsonl"))
        assert json.loads((peer_dir / "summary.json").read_text())["cpu_seconds"] > 0
        state = load_checkpoint(peer_dir / "checkpoint.pt")
        torch.testing.assert_close(state["params"][0], params[i], rtol=0, atol=1e-5)
    # the run-level record the orchestrator aggregated says the same
    assert [r["rounds"] for r in _steps(tmp / "processes" / "metrics.jsonl")] == expected
    assert proc["gossip_rounds_total"] == vec["gossip_rounds_total"]
    assert proc["accuracy_avg_model"] == pytest.approx(vec["accuracy_avg_model"], abs=1e-3)
    for key in ("accuracy_worst_peer", "final_consensus_distance", "steps", "wall_seconds"):
        assert key in proc
    assert proc["peers_completed"] == list(range(cfg.peers))
    assert proc["control_fallbacks"] == 0
    orchestrator = json.loads((tmp / "processes" / "orchestrator-summary.json").read_text())
    assert orchestrator["cpu_seconds"] > 0
    for name in ("manifest.json", "control.jsonl", "partition.json", "edges.json", "summary.json"):
        assert (tmp / "processes" / name).is_file(), name
    assert (tmp / "processes" / "rounds.png").is_file()
    return proc


def test_barrier_control_over_the_embedded_broker_matches_the_vectorized_engine(
    tmp_path: Path,
) -> None:
    cfg = _cfg("epochs=0.5")
    summary = _compare(cfg, tmp_path)
    assert summary["gossip_rounds_total"] > summary["steps"]  # control did repeat rounds
    decided = [json.loads(x) for x in (tmp_path / "processes" / "control.jsonl").open()]
    assert any(d["repeat"] for d in decided)
    assert not any(d["partial"] for d in decided)


@pytest.mark.parametrize("lag", [1, 2])
def test_lagged_control_matches_the_vectorized_engine(tmp_path: Path, lag: int) -> None:
    summary = _compare(_cfg("epochs=0.5", "control.lagged=true", f"control.lag={lag}"), tmp_path)
    assert summary["gossip_rounds_total"] > summary["steps"]
    # each published plan closes step t and is for step t + lag: the rounds of step t + lag are
    # that plan (the first `lag` steps of the phase run one round)
    decided = [json.loads(x) for x in (tmp_path / "processes" / "control.jsonl").open()]
    plans = {d["step"] + lag: d["rounds_next"] for d in decided if d["rounds_next"] is not None}
    steps = _steps(tmp_path / "processes" / "metrics.jsonl")
    assert [r["rounds"] for r in steps[:lag]] == [1] * lag
    checked = 0
    for step, planned in plans.items():  # a plan does not cross into another phase
        if step < len(steps) and steps[step]["phase"] == steps[step - lag]["phase"]:
            assert steps[step]["rounds"] == planned, step
            checked += 1
    assert checked >= 6


def test_constant_target_calibration_pass_matches_the_vectorized_engine(tmp_path: Path) -> None:
    cfg = _cfg(
        "epochs=0.5", "control.mode=constant", "control.factor=0.5", "optim.milestones=[0.5]"
    )
    _compare(cfg, tmp_path)
    for i in range(cfg.peers):  # two stages: calibrate, then train from x⁰
        states = lifecycle(tmp_path / "processes" / "peers" / f"peer-{i}")
        assert states == ["joining", *["waiting", "training"] * 2, "leaving", "done"]
    cal = {
        engine: json.loads((tmp_path / engine / "calibration.json").read_text())
        for engine in ("vectorized", "processes")
    }
    for phase, value in cal["vectorized"]["max_statistic"].items():
        # same Θ from the same θ_i up to float32 reduction order in the models
        assert cal["processes"]["max_statistic"][phase] == pytest.approx(value, rel=1e-5)


@pytest.mark.parametrize("target", ["adaptive", "constant"])
def test_overlapped_steps_under_barrier_control_match_the_vectorized_engine(
    tmp_path: Path, target: str
) -> None:
    """``overlap = true``: each step's first round runs while its gradient is computed, the
    repeat rounds the orchestrator asks for follow the local update (docs/algorithms.md#overlap);
    the same repeat/stop decisions and parameters as the vectorized engine, and the peers' first
    rounds were in flight during their computation."""
    extra = ["control.mode=constant", "control.factor=0.5"] if target == "constant" else []
    summary = _compare(_cfg("epochs=0.5", "overlap=true", *extra), tmp_path)
    if target == "adaptive":
        assert summary["gossip_rounds_total"] > summary["steps"]  # control did repeat rounds
    for i in range(4):
        steps = _steps(tmp_path / "processes" / "peers" / f"peer-{i}" / "metrics.jsonl")
        assert all(r["overlap_ms"] > 0 for r in steps), i


@pytest.mark.parametrize("mode", ["barrier", "lagged"])
def test_a_real_mosquitto_carries_the_documented_topics_and_payloads(
    tmp_path: Path, mode: str
) -> None:
    """Barrier: every topic carries traffic. Lagged: the statistics ride on the step records
    (the stats topic stays silent) and the run still matches the vectorized engine."""
    if mosquitto_binary() is None:
        pytest.fail("mosquitto is not installed; scripts/bootstrap installs it (root, Debian)")
    broker = MosquittoBroker()
    broker.start()
    # into a file, line by line: read only after the run, a pipe filled up (64 KiB) and
    # mosquitto_sub stopped reading the broker mid-run; each line is flushed, as the process
    # ends on SIGTERM without flushing its stdout
    captured = tmp_path / "mosquitto_sub.out"
    with captured.open("w") as sink:
        sub = subprocess.Popen(
            [
                "stdbuf",
                "-oL",
                "mosquitto_sub",
                "-h",
                broker.host,
                "-p",
                str(broker.port),
                "-t",
                "concord/v1/#",
                "-F",
                "%t %x",
                "-q",
                "1",
            ],
            stdout=sink,
        )
    try:
        beats = ["orchestrator.heartbeat=0.1", "orchestrator.liveness_timeout=5"]
        lagged = ["control.lagged=true"] if mode == "lagged" else []
        _compare(_cfg("epochs=0.5", *beats, *lagged), tmp_path, broker=broker.url)
    finally:
        sub.terminate()
        sub.wait(timeout=10)
        broker.stop()
    out = captured.read_text()
    seen: dict[str, int] = {}
    carried: list[Metrics] = []  # step records carrying statistics (lagged control)
    for line in out.splitlines():
        topic, _, hexpayload = line.partition(" ")
        if not hexpayload:
            continue  # a cleared retained message
        try:
            message = decode(topic, bytes.fromhex(hexpayload))
        except PayloadError as exc:
            pytest.fail(f"mosquitto_sub saw a payload that does not decode: {exc}")
        kind = topic.split("/")[3]
        assert TOPICS[kind].kind == message.KIND
        seen[kind] = seen.get(kind, 0) + 1
        if isinstance(message, Metrics) and message.stats:
            carried.append(message)
    if mode == "barrier":
        assert set(seen) == set(TOPICS), f"topics seen: {seen}"
        assert not carried
    else:
        assert set(seen) == set(TOPICS) - {"stats"}, f"topics seen: {seen}"
        # every peer's controlled steps: all of them carry their rounds' statistics
        steps = _steps(tmp_path / "processes" / "peers" / "peer-0" / "metrics.jsonl")
        controlled = {r["step"] for r in steps if r["control"] is not None}
        for peer in range(4):
            mine = {m.step: m for m in carried if m.peer == peer}
            assert set(mine) == controlled, f"peer {peer}"
            for step, m in mine.items():
                assert [s.round for s in m.stats] == list(range(1, int(m.values["rounds"]) + 1))
                assert m.values["theta"] >= 0, step
