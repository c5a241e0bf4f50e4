"""``network.transport = "torch"``: the same run over torch.distributed (gloo) as over gRPC.

Equivalence: orchestrator + 4 peer processes, each config run twice — gRPC, then gloo with the
orchestrator's store — and every peer's final parameters compared to 1e-5 (both planes feed the
same `RoundComm` arithmetic the same float32 bytes, so they agree far closer; the tolerance is
the project's processes-vs-vectorized one), with the same rounds per step (consensus control makes
the same repeat/stop decisions). A fixed world: a peer killed mid-run ends the run of the others
with a clear error, no hang."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from concord.core.config import load_config
from concord.runtime.rundir import load_checkpoint
from concord.sim.processes import run_processes
from tests.integration.peers import Peers, free_ports, write_config

pytestmark = pytest.mark.slow  # ~60 s: the separate CI step (.ci/run)

SMALL = ["peers=4", "dataset.samples=3000", "eval.every=1"]
CASES = {
    # two stages (the calibration pass, then training) in one process group; repeat rounds
    # decided by the orchestrator; an exact (all-reduce) phase 2; overlapped first rounds
    "dsgd-controlled": [
        "epochs=0.5",
        "control.mode=constant",
        "control.factor=0.5",
        "optim.milestones=[0.5]",
        "plan=dec-phase-1",
        "overlap=true",
    ],
    # per-edge messages (`Comm.exchange`) on a spanning tree
    "relaysgd": ["epochs=0.5", "algorithm=relaysgd", "control.mode=none"],
}


def _steps(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in rows if r["kind"] == "step" and r.get("stage", "train") == "train"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_torch_data_plane_ends_with_the_grpc_parameters(tmp_path: Path, case: str) -> None:
    grpc = load_config(None, [*SMALL, *CASES[case]], environ={})
    gloo = load_config(None, [*SMALL, *CASES[case], "network.transport=torch"], environ={})
    a = run_processes(grpc, tmp_path / "grpc", progress=False)
    b = run_processes(gloo, tmp_path / "torch", progress=False)
    assert a["peers_completed"] == b["peers_completed"] == list(range(4))
    assert b["gossip_rounds_total"] == a["gossip_rounds_total"]
    # every peer process built the partition the parent built, in both runs
    assert a["partition_mismatch"] == b["partition_mismatch"] == []
    assert a["partition_sha256"] == b["partition_sha256"]
    store = json.loads((tmp_path / "torch" / "orchestrator.json").read_text())["torch_store"]
    assert store.startswith("127.0.0.1:")
    for i in range(4):
        dirs = [tmp_path / run / "peers" / f"peer-{i}" for run in ("grpc", "torch")]
        x, y = (load_checkpoint(d / "checkpoint.pt")["params"][0] for d in dirs)
        torch.testing.assert_close(y, x, rtol=0, atol=1e-5)
        sa, sb = (_steps(d / "metrics.jsonl") for d in dirs)
        assert [r["rounds"] for r in sb] == [r["rounds"] for r in sa]
        assert all("wait_ms" in r for r in sb)  # the torch plane reports its breakdown too
        log = (dirs[1] / "log.jsonl").read_text()
        assert '"torch_plane.connected"' in log
        assert '"init": "orchestrator"' in log
    assert b["bytes_sent_total"] == a["bytes_sent_total"]  # the same payload bytes


def test_a_killed_peer_ends_a_torch_run_with_a_clear_error(tmp_path: Path) -> None:
    """Static peers, rendezvous at tcp:// (peer 0 hosts the store): kill peer 3 mid-run; its
    neighbours' next operations fail, theirs' neighbours follow — every survivor exits 1 with
    ``error.json`` naming the torch data plane, long before the run would have ended."""
    (port,) = free_ports(1)
    extra = (
        'epochs = 200\ntopology = "ring"\nalgorithm = "dsgd"\n'
        '[dataset]\nsamples = 800\n[model]\nname = "mlp"\nhidden = [32]\n'
        '[control]\nmode = "none"\n'
    )
    config = write_config(tmp_path / "run.toml", 4, extra)
    text = config.read_text()
    text += f'transport = "torch"\n[network.torch]\ninit = "tcp://127.0.0.1:{port}"\ntimeout = 30\n'
    config.write_text(text)
    with Peers(config, tmp_path, [0, 1, 2, 3]) as peers:
        metrics = tmp_path / "peer-3" / "metrics.jsonl"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= 5:
                break
            time.sleep(0.2)
        else:
            pytest.fail("peer 3 did not start training")
        killed = time.monotonic()
        peers.procs[3].send_signal(signal.SIGKILL)
        codes = {i: peers.procs[i].wait(timeout=60) for i in (0, 1, 2)}
        took = time.monotonic() - killed
    assert codes == {0: 1, 1: 1, 2: 1}
    assert took < 45  # the operations' timeout is 30 s; a closed connection fails at once
    for i in (0, 1, 2):
        error = json.loads((tmp_path / f"peer-{i}" / "error.json").read_text())
        assert "torch" in error["error"]
        assert error["completed"] is False
