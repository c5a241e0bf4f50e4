"""What an operator sees of a live 8-peer run (`concord sim`, the processes engine): `concord
status` shows every peer training, every process's metrics endpoint serves exactly the metrics
docs/deployment.md#metrics documents (read with Prometheus's own parser), and each process logs
readable lines to stderr. Marked slow: one 8-peer run, about a minute on 2 cores."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def documented() -> dict[str, set[str]]:
    """role → metric names in the tables of docs/deployment.md's "Metrics" section."""
    text = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    section = text[text.index("\n## Metrics\n") :]
    section = section[: section.index("\n## ", 10)]
    names = set(re.findall(r"^\| `([a-z_]+)` \|", section, re.MULTILINE))
    process = set(re.findall(r"`(process_[a-z_]+)`", section))
    return {
        "peer": {n for n in names if n.startswith("concord_peer_")} | process,
        "orchestrator": {n for n in names if n.startswith("concord_orchestrator_")} | process,
    }


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.status == 200
        text = answer.read().decode("utf-8")
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _wait(
    predicate: Callable[[], bool],
    timeout: float,
    what: str,
    launcher: subprocess.Popen[bytes],
    log: Path,
) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        assert launcher.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def test_a_live_run_is_visible_to_its_operators(tmp_path: Path) -> None:
    docs = documented()
    assert len(docs["peer"]) >= 20
    assert len(docs["orchestrator"]) >= 15
    run_dir = tmp_path / "run"
    cli = [sys.executable, "-m", "concord.lab.cli"]
    sets = ["epochs=12", "metrics.listen=127.0.0.1:0", "eval.every=1"]
    args = [*cli, "sim", "--quiet", "--reference", "none", "--out", str(run_dir)]
    args += [a for s in sets for a in ("--set", s)]
    log = tmp_path / "sim.out"
    with log.open("wb") as out:
        launcher = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        endpoints = [run_dir / "telemetry.json"] + [
            run_dir / "peers" / f"peer-{i}" / "telemetry.json" for i in range(8)
        ]
        peer0 = run_dir / "peers" / "peer-0" / "metrics.jsonl"
        _wait(
            lambda: (
                all(p.is_file() for p in endpoints)
                and peer0.is_file()
                and peer0.read_text().count("\n") > 30
            ),
            240,
            "8 peers training",
            launcher,
            log,
        )
        status = subprocess.run(
            [*cli, "status", str(run_dir), "--json"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        view = json.loads(status.stdout)
        assert view["orchestrator"] == "online"
        assert sorted(view["peers"]) == [str(i) for i in range(8)]
        assert {p["state"] for p in view["peers"].values()} == {"training"}
        assert all(p["step"] > 0 for p in view["peers"].values())
        assert view["total_steps"] > view["step"] > 0

        for i, path in enumerate(endpoints):
            role = "orchestrator" if i == 0 else "peer"
            got = scrape(json.loads(path.read_text())["metrics"])
            names = set(got)
            assert names == docs[role], (
                f"{role}: served but undocumented {sorted(names - docs[role])}, "
                f"documented but not served {sorted(docs[role] - names)}"
            )
            for labels, _ in (s for samples in got.values() for s in samples):
                assert labels["run"] == view["run"]
            if role == "peer":
                assert got["concord_peer_step"][0][0]["peer"] == str(i - 1)
                assert got["concord_peer_step"][0][1] > 0
                assert got["concord_peer_bytes_sent_total"][0][1] > 0
            else:
                assert got["concord_orchestrator_peers_live"][0][1] == 8
                assert len(got["concord_orchestrator_peer_step"]) == 8
        assert launcher.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        if launcher.poll() is None:
            launcher.terminate()
            launcher.wait(timeout=60)
    # what `docker compose logs` / `kubectl logs` would show: readable lines on stderr
    peer_out = (run_dir / "logs" / "peer-3.out").read_text()
    assert re.search(r"^\d\d:\d\d:\d\d\.\d{3}  INFO     peer 3  peer\.listening  ", peer_out, re.M)
    assert re.search(r"  peer 3  peer\.progress  step=\d+ of=\d+ ", peer_out)
    orch_out = (run_dir / "logs" / "orchestrator.out").read_text()
    assert re.search(r"INFO     orchestrator  stage\.start  stage=train", orch_out)
