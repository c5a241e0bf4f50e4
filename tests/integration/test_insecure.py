"""Secure by default: `concord peer` and `concord orchestrator` refuse to expose a run on an open
network — a data plane on 0.0.0.0 without TLS, a broker beyond loopback with neither credentials
nor signing — with a message that says how to turn the protection on and how to accept the risk;
with ``--insecure`` (``network.insecure = true``) they start and warn once on stderr and in
log.jsonl. Loopback needs nothing. The torch plane's store listens on loopback in a local run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from concord.core.config import load_config
from concord.errors import ConfigError
from concord.protos.exposure import Exposure, check_exposure, exposure_of, listen_host


def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "concord.lab.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_a_peer_on_every_interface_without_tls_is_refused_with_the_way_out(
    tmp_path: Path,
) -> None:
    config = tmp_path / "run.toml"
    config.write_text('name = "open"\npeers = 2\n[control]\nmode = "none"\n')
    p = _cli(
        "peer", "--config", str(config), "--id", "0", "--broker", "mqtt://127.0.0.1:1",
        "--listen", "0.0.0.0:0", "--advertise", "10.0.0.1:5000", "--out", str(tmp_path / "p"),
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert "network.insecure" in p.stderr
    assert "0.0.0.0:0" in p.stderr
    assert "concord certs init" in p.stderr  # how to turn TLS on
    assert "--insecure" in p.stderr  # how to accept the risk
    assert not (tmp_path / "p" / "log.jsonl").exists()  # refused before it wrote a log


def test_an_orchestrator_on_an_open_broker_without_protection_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('name = "open"\npeers = 2\n')
    p = _cli(
        "orchestrator", "--config", str(config), "--broker", "mqtt://10.255.255.1:1883",
        "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    assert "mqtt://10.255.255.1:1883" in p.stderr
    assert "concord certs broker" in p.stderr
    assert "sign_control" in p.stderr
    assert "--insecure" in p.stderr


def test_with_insecure_a_static_peer_starts_and_warns_once_on_stderr_and_in_its_log(
    tmp_path: Path,
) -> None:
    """Two static peers on every interface, without TLS, with --insecure: they run to the end;
    each warns once on stderr and once in log.jsonl."""
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    config = tmp_path / "run.toml"
    config.write_text(
        'name = "open"\npeers = 2\ntopology = "ring"\nepochs = 1\n[dataset]\nsamples = 200\n'
        '[model]\nname = "mlp"\nhidden = [8]\n[control]\nmode = "none"\n[network]\n'
        f'addresses = ["127.0.0.1:{ports[0]}", "127.0.0.1:{ports[1]}"]\n'
    )
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "concord.lab.cli",
                "peer",
                "--config",
                str(config),
                "--id",
                str(i),
                "--listen",
                f"0.0.0.0:{ports[i]}",
                "--insecure",
                "--log-format",
                "none",
                "--out",
                str(tmp_path / f"p{i}"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    for i, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, err[-2000:]
        assert err.count("WARNING (network.insecure = true)") == 1, err[-2000:]
        assert "without TLS" in err
        lines = (tmp_path / f"p{i}" / "log.jsonl").read_text().splitlines()
        warned = [json.loads(x) for x in lines if '"network.insecure"' in x]
        assert len(warned) == 1
        assert warned[0]["role"] == "peer"


@pytest.mark.parametrize(
    ("exposure", "problems"),
    [
        (Exposure(listen="127.0.0.1:0"), 0),
        (Exposure(listen="[::1]:5000"), 0),
        (Exposure(listen="localhost:5000"), 0),
        (Exposure(listen="0.0.0.0:50051"), 1),
        (Exposure(listen="[::]:50051"), 1),
        (Exposure(listen="10.0.0.1:50051"), 1),
        (Exposure(listen="0.0.0.0:50051", tls=True), 0),
        (Exposure(broker="mqtt://127.0.0.1:1883"), 0),
        (Exposure(broker="mqtt://10.0.0.9:1883"), 1),
        (Exposure(broker="mqtt://10.0.0.9:1883", signing=True), 0),
        (Exposure(broker="mqtts://10.0.0.9", credentials=True), 0),
        (Exposure(listen="0.0.0.0:1", broker="mqtt://broker:1883"), 2),
    ],
)
def test_what_counts_as_open(exposure: Exposure, problems: int) -> None:
    assert len(exposure.problems()) == problems


def test_the_settings_decide_and_insecure_only_warns() -> None:
    assert listen_host(":50051") == "0.0.0.0"
    cfg = load_config(None, ["orchestrator.broker_username={identity}"], environ={})
    assert exposure_of(cfg, listen=None, broker="mqtt://10.0.0.9:1883").problems() == []
    cfg = load_config(None, [], environ={})
    assert exposure_of(cfg, listen=None, broker="mqtt://peer@10.0.0.9:1883").credentials
    open_ = exposure_of(cfg, listen="0.0.0.0:1", broker=None)
    with pytest.raises(ConfigError) as err:
        check_exposure(open_, insecure=False, role="peer")
    assert err.value.problems[0][0] == "network.insecure"
    assert check_exposure(open_, insecure=True, role="peer", warn=False) != []
    insecure = load_config(None, ["network.insecure=true"], environ={})
    assert insecure.network.insecure


def test_the_torch_store_of_a_local_run_listens_on_loopback_only() -> None:
    pytest.importorskip("torch.distributed")
    from concord.orchestrator.store import TorchStore, bind_address

    cfg = load_config(None, ["network.transport=torch", "network.torch.init=orchestrator"],
                      environ={})  # fmt: skip
    store = TorchStore(cfg, "mqtt://127.0.0.1:1883")
    assert store.bind == "127.0.0.1"
    assert len(store.prefix) == 32
    port = int(store.address.rpartition(":")[2])
    listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True,
                               text=True, check=False).stdout  # fmt: skip
    local = [line.split()[3] for line in listening.splitlines() if line.strip()]
    if local:  # ss is there: every listening socket of that port is on loopback
        assert all(a.startswith("127.0.0.1:") for a in local), local
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        pytest.fail("the store does not answer on loopback")
    assert bind_address("localhost") == "127.0.0.1"
    assert bind_address("no-such-host.invalid") == "0.0.0.0"


def test_concord_sim_on_an_open_broker_without_protection_is_refused(tmp_path: Path) -> None:
    p = _cli(
        "sim", "--engine", "processes", "--broker", "mqtt://10.255.255.1:1883", "--quiet",
        "--reference", "none", "--set", "peers=2", "--set", "dataset.samples=200",
        "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert p.returncode != 0
    assert "network.insecure" in p.stderr, p.stderr[-2000:]
    assert "--insecure" in p.stderr
    assert not (tmp_path / "run").exists()  # refused before the run directory was made
