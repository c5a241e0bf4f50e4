"""Peers started the way torchrun and srun start them — no ``--id``, the launcher's variables
in the environment — train together and say where their ids came from."""

from __future__ import annotations

import json
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
