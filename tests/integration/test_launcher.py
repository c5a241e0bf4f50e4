"""Peers started the way torchrun and srun start them — no ``--id``, the launcher's variables
in the environment — train together and say where their ids came from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.peers import Peers, write_config

SMALL = """
topology = "ring"
epochs = 2
[dataset]
samples = 400
[model]
name = "mlp"
hidden = [16]
[control]
mode = "none"
"""


def test_peers_take_their_ids_from_the_launchers_environment(tmp_path: Path) -> None:
    config = write_config(tmp_path / "run.toml", 2, SMALL)
    launcher = {
        0: {"RANK": "0", "LOCAL_RANK": "0"},  # torchrun
        1: {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "RANK": ""},  # srun (RANK unset)
    }
    with Peers(config, tmp_path, [0, 1], launcher=launcher) as peers:
        assert peers.wait(timeout=300) == {0: 0, 1: 0}
    for i, source, local in ((0, "RANK", "LOCAL_RANK"), (1, "SLURM_PROCID", "SLURM_LOCALID")):
        run = tmp_path / f"peer-{i}"
        summary = json.loads((run / "summary.json").read_text())
        assert summary["completed"]
        assert summary["peer"] == i
        logs = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        (identity,) = [r for r in logs if r["event"] == "peer.identity"]
        assert (identity["source"], identity["local_index"], identity["local_source"]) == (
            source,
            i,
            local,
        )


def test_torchrun_starts_peers_on_the_torch_data_plane(tmp_path: Path) -> None:
    """``torchrun --standalone --nproc-per-node 2`` starts two static peers without ``--id``;
    with ``network.transport = "torch"`` (init ``auto``) they join torchrun's own store by
    env:// (MASTER_ADDR / MASTER_PORT) and train to the end."""
    config = write_config(tmp_path / "run.toml", 2, SMALL)
    config.write_text(config.read_text() + 'transport = "torch"\n')
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            "--no-python",
            sys.executable,
            "-m",
            "concord.lab.cli",
            "peer",
            "--config",
            str(config),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for i in (0, 1):
        run = tmp_path / "runs" / f"peer-{i}"
        assert json.loads((run / "summary.json").read_text())["completed"]
        logs = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        (plane,) = [r for r in logs if r["event"] == "torch_plane.connected"]
        assert (plane["init"], plane["backend"]) == ("env", "gloo")
        (identity,) = [r for r in logs if r["event"] == "peer.identity"]
        assert identity["source"] == "RANK"
