"""``concord sim`` (processes engine) with every control-plane safeguard on, as a user sets it
up: `concord certs init|issue|broker` material, the orchestrator's embedded broker enforcing the
password and ACL files on an mqtts:// listener, and every control message signed by its sender
and verified by every receiver. The run completes; meanwhile a client without credentials is
refused at the broker, and a client holding a peer's valid broker credentials can neither
publish the orchestrator's topics (ACL) nor pose as that peer on its own topics (unsigned:
dropped by the orchestrator, which says so in its log)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import aiomqtt
import pytest
from click.testing import CliRunner

from concord.core.config import load_config
from concord.errors import ConfigError
from concord.lab.cli import main
from concord.orchestrator.broker import EmbeddedBroker
from concord.protos.control_plane import Decision, Status, Topics, encode
from concord.protos.mqtt import BrokerAuth, client
from concord.sim.processes import make_run_id

RUN = "signed-sim"
PEERS = 3


def _certs(tmp_path: Path) -> Path:
    d = tmp_path / "certs"
    cli = CliRunner()
    r = cli.invoke(main, ["certs", "init", "--dir", str(d), "--run-id", RUN])
    assert r.exit_code == 0, r.output
    assert "orchestrator.key" in r.output
    for i in range(PEERS):
        r = cli.invoke(main, ["certs", "issue", "--dir", str(d), "--peer", str(i)])
        assert r.exit_code == 0, r.output
    r = cli.invoke(main, ["certs", "broker", "--dir", str(d), "--run-id", RUN, "--peers", "3"])
    assert r.exit_code == 0, r.output
    assert "embedded_broker_passwd" in r.output
    r = cli.invoke(main, ["certs", "issue", "--dir", str(d), "--orchestrator", "--peer", "1"])
    assert r.exit_code == 2
    assert "exactly one of --peer ID and --orchestrator" in r.output
    return d


def _settings(d: Path) -> list[str]:
    return [
        f"name={RUN}",
        f"peers={PEERS}",
        "epochs=2",
        "dataset.samples=600",
        "model=mlp",
        "eval.every=1",
        "control.mode=adaptive",
        "orchestrator.heartbeat=0.5",
        f"network.tls.ca={d}/ca.crt",
        f"network.tls.cert={d}/peer-{{id}}.crt",
        f"network.tls.key={d}/peer-{{id}}.key",
        f"orchestrator.embedded_broker_passwd={d}/broker/passwd",
        f"orchestrator.embedded_broker_acl={d}/broker/acl",
        f"orchestrator.embedded_broker_cert={d}/broker.crt",
        f"orchestrator.embedded_broker_key={d}/broker.key",
        "orchestrator.broker_username={identity}",
        f"orchestrator.broker_password_file={d}/broker/{{identity}}.password",
        f"orchestrator.broker_ca={d}/ca.crt",
    ]


async def _intrude(url: str, d: Path) -> dict[str, str]:
    """What happened to each intrusion attempt."""
    topics = Topics(RUN)
    seen: dict[str, str] = {}
    try:  # no credentials at all
        async with client(url, "anonymous", auth=BrokerAuth(ca=d / "ca.crt"), timeout=5):
            seen["anonymous"] = "connected"
    except aiomqtt.MqttError as exc:
        seen["anonymous"] = f"refused: {exc}"
    peer0 = BrokerAuth.resolve(
        "peer-0",
        username="{identity}",
        password_file=d / "broker" / "{identity}.password",
        ca=d / "ca.crt",
    )
    async with client(url, "peer-0@rogue", auth=peer0, timeout=5) as rogue:
        seen["peer-0 credentials"] = "connected"
        # the orchestrator's topic: the broker's ACL drops it
        forged = Decision(step=0, round=1, repeat=True, reason="forged")
        await rogue.publish(topics.topic("decision"), encode(forged), qos=1)
        # its own topic, unsigned: the broker lets it through, the orchestrator drops it
        failed = Status(peer=0, state="failed", reason="forged by a credentials holder")
        for _ in range(3):
            await rogue.publish(topics.topic("status", 0), encode(failed), qos=1)
            await asyncio.sleep(0.5)
    return seen


def test_an_authenticated_signed_sim_completes_and_intruders_get_nowhere(
    tmp_path: Path,
) -> None:
    d = _certs(tmp_path)
    out = tmp_path / "run"
    args = [sys.executable, "-m", "concord.lab.cli", "sim", "--engine", "processes", "--quiet"]
    args += ["--reference", "none", "--out", str(out)]
    for item in _settings(d):
        args += ["--set", item]
    started = time.monotonic()
    with open(tmp_path / "launcher.out", "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            end = time.monotonic() + 90
            while not (out / "orchestrator.json").is_file():
                assert proc.poll() is None, (tmp_path / "launcher.out").read_text()[-3000:]
                assert time.monotonic() < end, "the orchestrator did not start"
                time.sleep(0.1)
            info = json.loads((out / "orchestrator.json").read_text())
            assert info["broker"].startswith("mqtts://127.0.0.1:")
            assert info["run"] == RUN
            seen = asyncio.run(asyncio.wait_for(_intrude(info["broker"], d), 60))
            code = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    print(f"\nauthenticated signed sim: {time.monotonic() - started:.1f} s")
    assert code == 0, (tmp_path / "launcher.out").read_text()[-3000:]
    assert seen["anonymous"].startswith("refused"), seen
    assert seen["peer-0 credentials"] == "connected"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["peers_completed"] == list(range(PEERS))
    assert summary["peers_dropped"] == []
    orch_log = [json.loads(x) for x in (out / "log.jsonl").open()]
    events = {e["event"] for e in orch_log}
    assert "broker.auth_refused" in events
    refused_topics = {e.get("topic") for e in orch_log if e["event"] == "broker.topic_refused"}
    assert Topics(RUN).topic("decision") in refused_topics
    unsigned = [
        e for e in orch_log if e["event"] == "control.rejected" and e.get("reason") == "unsigned"
    ]
    assert [(e["sender"], e["topic"]) for e in unsigned] == [
        ("peer-0", Topics(RUN).topic("status", 0))
    ]  # three forgeries, logged once
    # the signed messages of the run were all accepted: the orchestrator refused nothing else,
    # no peer refused anything of the orchestrator's
    others = [e for e in orch_log if e["event"] == "control.rejected" and e not in unsigned]
    assert others == []
    for i in range(PEERS):
        peer_log = out / "peers" / f"peer-{i}" / "log.jsonl"
        bad = [e for e in map(json.loads, peer_log.open()) if e["event"] == "control.rejected"]
        assert bad == [], f"peer {i}: {bad}"
    # the launcher's progress view (the read-only "monitor" identity) verifies too: it refused
    # the forged status, and nothing else
    launcher = [json.loads(x) for x in (out / "logs" / "launcher.jsonl").open()]
    assert any(e["event"] == "mqtt.connected" for e in launcher)
    assert [
        (e["sender"], e["reason"], e["topic"]) for e in launcher if e["event"] == "control.rejected"
    ] == [("peer-0", "unsigned", Topics(RUN).topic("status", 0))]
    orchestrator = json.loads((out / "orchestrator-summary.json").read_text())
    assert orchestrator.get("control_handler_errors", 0) == 0


def test_embedded_broker_settings_are_checked_and_name_the_key(tmp_path: Path) -> None:
    def problems(*sets: str) -> list[tuple[str, str]]:
        with pytest.raises(ConfigError) as info:
            EmbeddedBroker.from_config(load_config(None, list(sets), environ={}).orchestrator)
        return info.value.problems

    missing = f"{tmp_path}/none"
    found = problems(
        f"orchestrator.embedded_broker_passwd={missing}",
        f"orchestrator.embedded_broker_acl={missing}",
    )
    assert found[0] == ("orchestrator.embedded_broker_passwd", f"{missing} is not a file")
    key, text = problems("orchestrator.embedded_broker_listen=0.0.0.0:8883")[0]
    assert key == "orchestrator.embedded_broker_listen"
    assert "without authentication" in text
    with pytest.raises(ConfigError, match="embedded_broker_cert and embedded_broker_key go"):
        load_config(None, ["orchestrator.embedded_broker_cert=x"], environ={})
    with pytest.raises(ConfigError, match="must be 'host:port'"):
        load_config(None, ["orchestrator.embedded_broker_listen=localhost"], environ={})
    broker = EmbeddedBroker.from_config(
        load_config(None, ["orchestrator.embedded_broker_listen=127.0.0.1:18883"], environ={})
        .orchestrator
    )  # fmt: skip
    assert broker.url == "mqtt://127.0.0.1:18883"


def test_with_broker_credentials_the_sim_run_id_is_the_config_name() -> None:
    creds = ["orchestrator.broker_username={identity}"]
    assert make_run_id(load_config(None, [f"name={RUN}", *creds], environ={})) == RUN
    with pytest.raises(ConfigError, match="the run id is the config's name") as info:
        make_run_id(load_config(None, creds, environ={}))
    assert info.value.problems[0][0] == "name"
    fresh = make_run_id(load_config(None, [f"name={RUN}"], environ={}))
    assert fresh.startswith(f"{RUN}-")
    assert len(fresh) == len(RUN) + 9
