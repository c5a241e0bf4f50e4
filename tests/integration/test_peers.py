"""Real peer processes over loopback gRPC: equivalence with the vectorized engine, a neighbour
killed mid-run, and a clean SIGTERM shutdown."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch

from concord.core.config import load_config
from concord.sim.engine import Trainer
from tests.integration.peers import Peers, lifecycle, write_config

TINY = """
topology = "ring"
algorithm = "dsgd"
seed = 3
[dataset]
samples = 800
[model]
name = "mlp"
hidden = [32]
[optim]
momentum = 0.9
nesterov = true
[control]
mode = "none"
"""


# the lifecycle of a static peer that starts afresh and ends with exit code 0
FRESH_RUN = ["joining", "waiting", "training", "leaving", "done"]


@pytest.fixture
def peers_cleanup() -> Iterator[list[Peers]]:
    started: list[Peers] = []
    yield started
    for p in started:
        p.kill_all()


def _metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_four_peers_end_with_the_vectorized_engines_parameters(
    tmp_path: Path, peers_cleanup: list[Peers]
) -> None:
    # 800 samples → 640 training samples, 160 per peer, batch 16: 10 steps/epoch → 50 steps
    config = write_config(tmp_path / "run.toml", 4, "epochs = 5\n" + TINY)
    peers = Peers(config, tmp_path, [0, 1, 2, 3])
    peers_cleanup.append(peers)
    assert peers.wait() == {0: 0, 1: 0, 2: 0, 3: 0}
    torch.set_num_threads(1)
    trainer = Trainer(load_config(config, environ={}))
    assert trainer.total_steps == 50
    for step in range(trainer.total_steps):
        trainer.train_step(step)
    for i in range(4):
        state = torch.load(tmp_path / f"peer-{i}" / "checkpoint.pt", weights_only=True)
        # float32: a one-replica model vs the 4-replica batched one and a different summation
        # order in the mix give ~1e-7 differences per step; 50 steps of SGD keep them < 1e-5
        torch.testing.assert_close(state["params"][0], trainer.task.x[i], rtol=0, atol=1e-5)
        summary = json.loads((tmp_path / f"peer-{i}" / "summary.json").read_text())
        assert summary["completed"]
        assert summary["gossip_rounds_total"] == 50
        assert lifecycle(tmp_path / f"peer-{i}") == FRESH_RUN
        resolved = load_config(tmp_path / f"peer-{i}" / "config.toml", environ={})
        assert resolved == trainer.cfg  # the run directory keeps the resolved config
        assert summary["frames_rejected"] == {}
        d = int(state["params"].shape[1])
        assert {(e["src"], e["dst"]): e["bytes_wire"] for e in summary["bytes_per_edge"]} == {
            (i, (i + 1) % 4): 50 * d * 4,
            (i, (i + 3) % 4): 50 * d * 4,
        }


def test_static_peers_run_fixed_rounds_like_the_vectorized_engine(
    tmp_path: Path, peers_cleanup: list[Peers]
) -> None:
    # control.mode = "fixed" needs no orchestrator: 3 rounds per step of phase 1 (steps 0-24 of
    # 50 with the default milestones 0.5, 0.75), one round after
    extra = "epochs = 5\n" + TINY.replace('mode = "none"', 'mode = "fixed"\nrounds = 3')
    config = write_config(tmp_path / "run.toml", 4, extra)
    peers = Peers(config, tmp_path, [0, 1, 2, 3])
    peers_cleanup.append(peers)
    assert peers.wait() == {0: 0, 1: 0, 2: 0, 3: 0}
    torch.set_num_threads(1)
    trainer = Trainer(load_config(config, environ={}))
    for step in range(trainer.total_steps):
        trainer.train_step(step)
    assert trainer.runner.rounds_total == 25 * 3 + 25
    for i in range(4):
        state = torch.load(tmp_path / f"peer-{i}" / "checkpoint.pt", weights_only=True)
        # as above: float32 differences of ~1e-7 per step, kept < 1e-5 over 50 steps
        torch.testing.assert_close(state["params"][0], trainer.task.x[i], rtol=0, atol=1e-5)
        summary = json.loads((tmp_path / f"peer-{i}" / "summary.json").read_text())
        assert summary["gossip_rounds_total"] == 100
        rounds = [r["rounds"] for r in _metrics(tmp_path / f"peer-{i}" / "metrics.jsonl")
                  if r.get("kind") == "step"]  # fmt: skip
        assert rounds == [3] * 25 + [1] * 25


def test_peers_survive_a_neighbour_killed_mid_run(
    tmp_path: Path, peers_cleanup: list[Peers]
) -> None:
    config = write_config(tmp_path / "run.toml", 4, "epochs = 60\n" + TINY, deadline=2.0)
    peers = Peers(config, tmp_path, [0, 1, 2, 3])
    peers_cleanup.append(peers)
    metrics = tmp_path / "peer-3" / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until training is under way
        if metrics.is_file() and len(metrics.read_text().splitlines()) > 20:
            break
        time.sleep(0.1)
    peers.procs[3].send_signal(signal.SIGKILL)
    codes = {i: peers.procs[i].wait(timeout=180) for i in (0, 1, 2)}
    assert codes == {0: 0, 1: 0, 2: 0}
    for i in (0, 2):  # peer 3's ring neighbours
        summary = json.loads((tmp_path / f"peer-{i}" / "summary.json").read_text())
        assert summary["completed"]
        steps = [
            m for m in _metrics(tmp_path / f"peer-{i}" / "metrics.jsonl") if m["kind"] == "step"
        ]
        assert len(steps) == 600
        assert any(3 in m["missing"] for m in steps)  # the outcome records the dead neighbour
        assert steps[-1]["missing"] == [3]
        assert all(m["loss"] == m["loss"] for m in steps)  # renormalised mixing stays finite
    summary1 = json.loads((tmp_path / "peer-1" / "summary.json").read_text())
    assert summary1["completed"]  # peer 1 is not a neighbour of 3 on the ring


def test_sigterm_stops_a_peer_cleanly(tmp_path: Path, peers_cleanup: list[Peers]) -> None:
    config = write_config(tmp_path / "run.toml", 2, "epochs = 500\n" + TINY)
    peers = Peers(config, tmp_path, [0, 1])
    peers_cleanup.append(peers)
    metrics = tmp_path / "peer-0" / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
        metrics.is_file() and len(metrics.read_text().splitlines()) > 5
    ):
        time.sleep(0.1)
    family = [psutil.Process(p.pid) for p in peers.procs.values()]
    family += [c for proc in list(family) for c in proc.children(recursive=True)]
    for p in peers.procs.values():
        p.send_signal(signal.SIGTERM)
    assert peers.wait(timeout=60) == {0: 0, 1: 0}
    _, alive = psutil.wait_procs(family, timeout=10)
    assert alive == []  # no orphans (threads only: the peer spawns no processes)
    for i in (0, 1):
        lines = (tmp_path / f"peer-{i}" / "metrics.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]  # every line complete JSON
        assert all(r["kind"] in ("step", "eval") for r in records)
        summary = json.loads((tmp_path / f"peer-{i}" / "summary.json").read_text())
        assert not summary["completed"]
        assert 0 < summary["steps"] < 500 * 20
        # stopped at a step boundary: one record per step that ran, in order
        assert [r["step"] for r in records if r["kind"] == "step"] == list(range(summary["steps"]))
        state = torch.load(tmp_path / f"peer-{i}" / "checkpoint.pt", weights_only=True)
        assert int(state["step"]) == summary["steps"] - 1  # checkpointed on the way out
        assert lifecycle(tmp_path / f"peer-{i}") == FRESH_RUN  # a clean stop is "done"


def test_choco_with_topk_matches_the_vectorized_engine(
    tmp_path: Path, peers_cleanup: list[Peers]
) -> None:
    """Compressed tensors on the wire: 4 peers, CHOCO-SGD with top-10 % (values + int32
    indices in the frames), 30 steps, against the vectorized engine."""
    extra = TINY.replace('algorithm = "dsgd"', 'algorithm = "choco"') + (
        '[compression]\ncodec = "topk"\nratio = 0.1\ngamma = 0.4\n'
    )
    config = write_config(tmp_path / "run.toml", 4, "epochs = 3\n" + extra)
    peers = Peers(config, tmp_path, [0, 1, 2, 3])
    peers_cleanup.append(peers)
    assert peers.wait() == {0: 0, 1: 0, 2: 0, 3: 0}
    torch.set_num_threads(1)
    trainer = Trainer(load_config(config, environ={}))
    for step in range(trainer.total_steps):
        trainer.train_step(step)
    dsgd_bytes = 0
    for i in range(4):
        state = torch.load(tmp_path / f"peer-{i}" / "checkpoint.pt", weights_only=True)
        # as above; top-k selection could flip on a near-tie between the engines' float32
        # values, which would show as a large error — it does not at this tolerance
        torch.testing.assert_close(state["params"][0], trainer.task.x[i], rtol=0, atol=1e-5)
        summary = json.loads((tmp_path / f"peer-{i}" / "summary.json").read_text())
        dsgd_bytes = 2 * summary["steps"] * int(state["params"].shape[1]) * 4
        assert summary["bytes_sent_total"] < 0.25 * dsgd_bytes  # 10 % values + indices
