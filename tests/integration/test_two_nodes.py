"""Two hosts, emulated (`bench/two_nodes.py`): 4 peers on each of two network-namespace "nodes"
joined by a capped link, each node's peers started by one ``scripts/srun-local`` command (ids
from ``SLURM_PROCID``, addresses announced through the orchestrator), Mosquitto and the
orchestrator on the first node — the same final parameters as the same run on one host."""

from __future__ import annotations

from pathlib import Path

import pytest

import concord.lab.net as netns
from bench.two_nodes import DEFAULT_SETS, compare, run_one_host, run_two_nodes, write_config
from concord.orchestrator.broker import mosquitto_binary

_ok, _why = netns.available()
pytestmark = [
    pytest.mark.slow,  # ~25 s: the separate CI step
    pytest.mark.skipif(not _ok, reason=f"emulated network unavailable: {_why}"),
    pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto is not installed"),
]


def test_a_run_over_two_emulated_nodes_ends_where_the_one_host_run_does(tmp_path: Path) -> None:
    sets = [*(s for s in DEFAULT_SETS if not s.startswith("epochs=")), "epochs=1"]
    config = write_config(tmp_path / "run.toml", 8, sets)
    run_two_nodes(tmp_path / "two", config, per_node=4, cap_mbit=100.0)
    run_one_host(tmp_path / "one", config)
    for i in range(8):  # each peer took its id from SLURM_PROCID and wrote its own directory
        log = (tmp_path / "two" / "peers" / f"peer-{i}" / "log.jsonl").read_text()
        assert '"source": "SLURM_PROCID"' in log
    # deterministic on both sides (barrier decisions, the same float32 arithmetic in the same
    # order): 1e-5 allows for nothing but a reordered sum, and 0 is what it measures
    assert compare(tmp_path / "one", tmp_path / "two", 8) <= 1e-5
