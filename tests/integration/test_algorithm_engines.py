"""One algorithm, two engines: every registered algorithm run by real peer processes (orchestrator,
gRPC on loopback) ends with the vectorized engine's parameters.

Tolerance 1e-5 (absolute, on parameters of magnitude ~0.1–1): one replica per process against n
batched replicas changes float32 reduction orders, ~1e-7 per step, over a 19-step run; an
algorithm whose messages or state diverged between engines differs by orders of magnitude more.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.algorithms import ALGORITHMS
from core.config import load_config
from sim.engine import run as run_vectorized
from sim.processes import run_processes
from sim.rundir import load_checkpoint

BASE = ["peers=4", "dataset.samples=3000", "epochs=0.5", "eval.every=1", "control.mode=none"]

# name → extra config for a short run that exercises the algorithm's messages
CASES: dict[str, list[str]] = {
    "dsgd": [],
    "allreduce": [],
    "choco": ["compression.codec=topk", "compression.ratio=0.1", "compression.gamma=0.5"],
    # both trees of the double binary tree: coordinates split by parity, one message per edge
    "relaysgd": ["topology=double-binary-tree"],
    "relaysgd-grad": ["topology=ring", "hyper.tree=chain"],  # the chain spanning the ring
    "sgp": ["topology=exponential-one-peer-directed"],
}


def test_every_registered_algorithm_has_a_case() -> None:
    assert set(CASES) == set(ALGORITHMS.names())


@pytest.mark.parametrize("name", sorted(CASES))
def test_processes_end_with_the_vectorized_parameters(tmp_path: Path, name: str) -> None:
    cfg = load_config(None, [*BASE, f"algorithm={name}", *CASES[name]], environ={})
    vec = run_vectorized(cfg, tmp_path / "vectorized", progress=False)
    proc = run_processes(cfg, tmp_path / "processes", progress=False)
    expected = load_checkpoint(tmp_path / "vectorized" / "checkpoint.pt")["params"]
    for i in range(cfg.peers):
        state = load_checkpoint(tmp_path / "processes" / "peers" / f"peer-{i}" / "checkpoint.pt")
        torch.testing.assert_close(state["params"][0], expected[i], rtol=0, atol=1e-5)
    assert proc["gossip_rounds_total"] == vec["gossip_rounds_total"]
    if ALGORITHMS.get(name).uses_gossip:  # all-reduce: the vectorized engine accounts a ring
        assert proc["bytes_sent_total"] == vec["bytes_sent_total"]  # all-reduce, peers all-to-all
