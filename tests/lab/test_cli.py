"""The `concord` command: specific errors for bad input, JSON topology output, a real sim run."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from concord.lab.cli import main


def test_topology_json() -> None:
    r = CliRunner().invoke(main, ["topology", "ring", "--peers", "16", "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["name"] == "ring"
    assert info["peers"] == 16
    assert info["max_degree"] == 2
    assert abs(info["spectral_gap"] - 0.0507) < 5e-5  # 4-decimal reference value
    assert abs(info["p"] - 0.0989) < 5e-5


def test_topology_bad_input() -> None:
    r = CliRunner().invoke(main, ["topology", "hypercube", "--peers", "12"])
    assert r.exit_code == 2
    assert "power of 2" in r.output
    r = CliRunner().invoke(main, ["topology", "rign", "--peers", "8"])
    assert r.exit_code == 2
    assert "ring" in r.output
    r = CliRunner().invoke(main, ["topology", "ring", "--peers", "0"])
    assert r.exit_code == 2
    assert "--peers" in r.output


def test_sim_reports_config_errors_by_key() -> None:
    r = CliRunner().invoke(main, ["sim", "--set", "peers=0", "--set", "control.factor=-2"])
    assert r.exit_code == 2
    assert "peers" in r.output
    assert "control.factor" in r.output


def test_sim_runs_and_prints_final_table(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = CliRunner().invoke(
        main,
        [
            "sim",
            "--engine",
            "vectorized",
            "--quiet",
            "--out",
            str(out),
            "--set",
            "peers=4",
            "--set",
            "dataset.samples=600",
            "--set",
            "epochs=1",
            "--set",
            "model=mlp",
        ],
    )
    assert r.exit_code == 0, r.output
    assert (out / "summary.json").is_file()
    assert "accuracy" in r.output.lower()


def test_certs_commands(tmp_path: Path) -> None:
    d = str(tmp_path / "certs")
    r = CliRunner().invoke(main, ["certs", "init", "--dir", d, "--run-id", "x"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(
        main, ["certs", "issue", "--dir", d, "--peer", "2", "--host", "10.1.1.1"]
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "certs" / "peer-2.crt").is_file()
    r = CliRunner().invoke(main, ["certs", "init", "--dir", d])
    assert r.exit_code == 2
    assert "--force" in r.output
    r = CliRunner().invoke(main, ["certs", "issue", "--dir", str(tmp_path / "none"), "--peer", "0"])
    assert r.exit_code == 2
    assert "concord certs init" in r.output


def test_peer_command_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text('peers = 2\n[control]\nmode = "none"\n')
    r = CliRunner().invoke(main, ["peer", "--config", str(cfg), "--id", "0"])
    assert r.exit_code == 2
    assert "network.addresses" in r.output
    cfg.write_text('peers = 2\n[control]\nmode = "none"\n[network]\naddresses = ["a:1"]\n')
    r = CliRunner().invoke(main, ["peer", "--config", str(cfg), "--id", "0"])
    assert r.exit_code == 2
    assert "lists 1 addresses for 2 peers" in r.output
