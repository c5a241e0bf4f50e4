"""Identities at the broker, against real brokers and real files: `concord certs broker`'s
password + ACL files and broker certificate loaded into Mosquitto (TLS listener) and into the
embedded amqtt broker; each identity may publish only its own topics, wrong passwords and wrong
CAs are refused, and no secret reaches a log."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
import structlog

from concord.errors import ConfigError
from concord.orchestrator.broker import EmbeddedBroker, MosquittoBroker, mosquitto_binary
from concord.peer.broker_creds import BrokerFiles, issue_broker
from concord.peer.certs import init_ca
from concord.protos.control_plane import Decision, Topics, encode
from concord.protos.mqtt import (
    BrokerAuth,
    Bus,
    client,
    connection,
    session_client_id,
    tls_context,
)

RUN = "authrun"
TOPICS = Topics(RUN)


@pytest.fixture(scope="module")
def creds(tmp_path_factory: pytest.TempPathFactory) -> BrokerFiles:
    d = tmp_path_factory.mktemp("certs")
    init_ca(d, run_id=RUN)
    return issue_broker(d, run_id=RUN, peers=2, hosts=["127.0.0.1", "localhost"])


def auth(creds: BrokerFiles, who: str, *, ca: Path | None = None) -> BrokerAuth:
    return BrokerAuth.resolve(
        who,
        username="{identity}",
        password_file=creds.passwords[who].parent / "{identity}.password",
        ca=ca,
    )


def _decision() -> bytes:
    return encode(Decision(step=1, round=0, repeat=False))


async def _delivered(
    url: str, publisher: BrokerAuth, topic: str, *, listener: BrokerAuth, wait: float = 1.0
) -> bool:
    """Whether a message ``publisher`` sends on ``topic`` reaches a subscriber."""
    async with client(url, session_client_id("listener", listener), auth=listener) as sub:
        await sub.subscribe(TOPICS.all(), qos=1)
        async with client(url, session_client_id("pub", publisher), auth=publisher) as pub:
            await pub.publish(topic, _decision(), qos=1)
        try:
            async with asyncio.timeout(wait):
                async for m in sub.messages:
                    if str(m.topic) == topic:
                        return True
        except TimeoutError:
            return False
    return False


KINDS = ["mosquitto", "embedded"]


@asynccontextmanager
async def _broker(kind: str, creds: BrokerFiles) -> AsyncIterator[str]:
    """An authenticating broker with TLS (the run CA verifies it); yields its URL."""
    if kind == "mosquitto":
        if mosquitto_binary() is None:
            pytest.skip("mosquitto missing")
        async with MosquittoBroker(
            password_file=creds.passwd,
            acl_file=creds.acl,
            tls=(creds.ca, creds.cert, creds.key),
        ) as m:
            yield m.url
    else:
        async with EmbeddedBroker(
            password_file=creds.passwd,
            acl_file=creds.acl,
            certfile=creds.cert,
            keyfile=creds.key,
        ) as b:
            yield b.url


def _run(kind: str, creds: BrokerFiles, body: Callable[[str], Awaitable[None]]) -> None:
    async def main() -> None:
        async with _broker(kind, creds) as url:
            await body(url)

    asyncio.run(asyncio.wait_for(main(), 60))


@pytest.mark.parametrize("kind", KINDS)
def test_the_orchestrator_may_publish_a_decision_and_a_peer_may_not(
    kind: str, creds: BrokerFiles
) -> None:
    async def body(url: str) -> None:
        assert url.startswith("mqtts://")
        monitor = auth(creds, "monitor", ca=creds.ca)
        topic = TOPICS.topic("decision")
        orchestrator, peer = (
            auth(creds, "orchestrator", ca=creds.ca),
            auth(creds, "peer-0", ca=creds.ca),
        )
        assert await _delivered(url, orchestrator, topic, listener=monitor)
        assert not await _delivered(url, peer, topic, listener=monitor)

    _run(kind, creds, body)


def _raw_client(url: str, creds: BrokerFiles, identifier: str, **kw: Any) -> aiomqtt.Client:
    """A client with every CONNECT field under the test's control (clean session, will)."""
    address, _ = connection(url)
    return aiomqtt.Client(
        address.host,
        address.port,
        identifier=identifier,
        protocol=aiomqtt.ProtocolVersion.V311,
        tls_context=tls_context(BrokerAuth(ca=creds.ca)),
        timeout=5,
        **kw,
    )


async def _next_payload(c: aiomqtt.Client, wait: float = 5.0) -> bytes | None:
    try:
        async with asyncio.timeout(wait):
            async for m in c.messages:
                return bytes(m.payload) if isinstance(m.payload, bytes | bytearray) else b""
    except TimeoutError:
        return None
    return None


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_client_cannot_touch_the_session_of_the_id_it_claims(
    kind: str, creds: BrokerFiles
) -> None:
    """A CONNECT with peer 0's client id, a wrong password, clean_session = 0 and a Last-Will on
    the orchestrator's control topic is refused before the broker looks at the id: peer 0 stays
    connected and subscribed, and no will is published. (amqtt 0.12 updated and took over the
    session first: the attacker's will then spoke for peer 0, its subscriptions vanished.)"""

    async def body(url: str) -> None:
        victim_id, control = f"peer-0@peer-{RUN}-0", TOPICS.topic("control")
        async with client(url, victim_id, auth=auth(creds, "peer-0", ca=creds.ca)) as victim:
            await victim.subscribe(control, qos=1)
            forged = aiomqtt.Will(control, b"FORGED", qos=1, retain=True)
            for clean in (False, True):
                attacker = _raw_client(
                    url, creds, victim_id, username="peer-0", password="wrong",
                    clean_session=clean, will=forged,
                )  # fmt: skip
                with pytest.raises(aiomqtt.MqttError):
                    async with attacker:
                        pass
            await asyncio.sleep(0.5)
            orchestrator = auth(creds, "orchestrator", ca=creds.ca)
            async with client(url, "orchestrator@x", auth=orchestrator) as orch:
                await orch.publish(control, b"REAL", qos=1)
            assert await _next_payload(victim) == b"REAL"  # still subscribed; no forged will

    _run(kind, creds, body)


@pytest.mark.parametrize("kind", KINDS)
def test_a_last_will_is_published_only_on_a_topic_the_identity_may_write(
    kind: str, creds: BrokerFiles
) -> None:
    """A will is a publication the broker makes later on the client's behalf: one on a topic the
    identity may not write never reaches anyone (the embedded broker refuses such a CONNECT;
    Mosquitto drops the will when it would publish it; amqtt published them unchecked), one on
    its own topic does."""

    async def vanish(c: aiomqtt.Client) -> None:
        """Connect, then drop the TCP connection without DISCONNECT: the broker owes the will."""
        with contextlib.suppress(aiomqtt.MqttError):
            async with c:
                c._client.socket().shutdown(socket.SHUT_RDWR)

    async def body(url: str) -> None:
        monitor = auth(creds, "monitor", ca=creds.ca)
        async with client(url, "monitor@watcher", auth=monitor) as watcher:
            await watcher.subscribe(TOPICS.all(), qos=1)
            await watcher.subscribe("concord/v1/other-run/#", qos=1)
            # peer 0 (not the watcher's identity: Mosquitto keeps one session per identity)
            password = creds.passwords["peer-0"].read_text(encoding="utf-8").strip()
            for topic in (TOPICS.topic("control"), "concord/v1/other-run/control"):
                will = aiomqtt.Will(topic, b"FORGED", qos=1, retain=True)
                await vanish(
                    _raw_client(
                        url, creds, "peer-0@w", username="peer-0", password=password, will=will
                    )
                )
            assert await _next_payload(watcher, 2.0) is None
            password = creds.passwords["peer-1"].read_text(encoding="utf-8").strip()
            own = aiomqtt.Will(TOPICS.topic("status", 1), b"OWN", qos=1, retain=False)
            await vanish(
                _raw_client(url, creds, "peer-1@w", username="peer-1", password=password, will=own)
            )
            assert await _next_payload(watcher) == b"OWN"

    _run(kind, creds, body)


def test_refused_connections_leave_no_session_in_the_embedded_broker(creds: BrokerFiles) -> None:
    async def main() -> None:
        async with EmbeddedBroker(
            password_file=creds.passwd, acl_file=creds.acl, certfile=creds.cert, keyfile=creds.key
        ) as b:
            before = len(b._broker._sessions)
            for i in range(20):
                c = _raw_client(b.url, creds, f"junk-{i}", username="nobody", password="x")
                with pytest.raises(aiomqtt.MqttError):
                    async with c:
                        pass
            assert len(b._broker._sessions) == before

    asyncio.run(asyncio.wait_for(main(), 60))


@pytest.mark.parametrize("kind", KINDS)
def test_a_peer_publishes_its_own_stats_only(kind: str, creds: BrokerFiles) -> None:
    async def body(url: str) -> None:
        monitor = auth(creds, "monitor", ca=creds.ca)
        peer0 = auth(creds, "peer-0", ca=creds.ca)
        assert await _delivered(url, peer0, TOPICS.topic("stats", 0), listener=monitor)
        assert not await _delivered(url, peer0, TOPICS.topic("stats", 1), listener=monitor)
        assert not await _delivered(url, peer0, TOPICS.topic("status", 1), listener=monitor)
        # the read-only monitor publishes nothing (heard by peer 1: Mosquitto keeps one session
        # per identity, a second monitor connection would close the listening one)
        peer1 = auth(creds, "peer-1", ca=creds.ca)
        assert not await _delivered(url, monitor, TOPICS.topic("stats", 0), listener=peer1)

    _run(kind, creds, body)


@pytest.mark.parametrize("kind", KINDS)
def test_a_wrong_password_and_no_password_are_refused_at_connect(
    kind: str, creds: BrokerFiles, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    bad = BrokerAuth.resolve("peer-0", username="peer-0", password_file=wrong, ca=creds.ca)

    async def body(url: str) -> None:
        with pytest.raises(aiomqtt.MqttError):
            async with client(url, "intruder", auth=bad, timeout=5):
                pass
        with pytest.raises(aiomqtt.MqttError):  # no credentials at all
            async with client(url, "anonymous", auth=BrokerAuth(ca=creds.ca), timeout=5):
                pass

    _run(kind, creds, body)


@pytest.mark.parametrize("kind", KINDS)
def test_mqtts_needs_the_right_ca(kind: str, creds: BrokerFiles, tmp_path: Path) -> None:
    other = init_ca(tmp_path / "other", run_id="other")

    async def body(url: str) -> None:
        async with client(url, "peer-0@ok", auth=auth(creds, "peer-0", ca=creds.ca), timeout=5):
            pass
        with pytest.raises((aiomqtt.MqttError, ssl.SSLError)):
            async with client(url, "x", auth=auth(creds, "peer-0", ca=other.cert), timeout=5):
                pass

    _run(kind, creds, body)


@pytest.mark.parametrize("kind", KINDS)
def test_a_bus_with_a_wrong_password_counts_refusals_and_never_logs_the_secret(
    kind: str, creds: BrokerFiles, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "s3cret-that-must-not-leak"
    wrong = tmp_path / "wrong.password"
    wrong.write_text(secret + "\n")
    bad = BrokerAuth.resolve("peer-0", username="peer-0", password_file=wrong, ca=creds.ca)
    good = auth(creds, "orchestrator", ca=creds.ca)
    assert good.password is not None
    caplog.set_level(logging.DEBUG)

    def ignore(*_: Any) -> None:
        return None

    async def body(url: str) -> None:
        async with Bus(
            url,
            f"peer-{RUN}-0",
            TOPICS,
            subscribe=["decision"],
            handler=ignore,
            auth=bad,
            backoff=(0.05, 0.1),
        ) as bus:
            assert not await bus.wait_connected(1.5)
            assert bus.refusals >= 1
        async with Bus(
            url, f"orchestrator-{RUN}", TOPICS, subscribe=["stats"], handler=ignore, auth=good
        ) as bus:
            assert await bus.wait_connected(5)

    with structlog.testing.capture_logs() as logs:
        _run(kind, creds, body)
    assert any(e["event"] == "mqtt.refused" for e in logs)
    everything = caplog.text + repr(logs) + repr(bad) + repr(good)
    assert secret not in everything
    assert good.password not in everything


# --------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("mqtt://user:pw@127.0.0.1:1883", "password"),
        ("mqtts://user:pw@broker.lab", "password"),
        ("http://broker:1883", "mqtt://HOST"),
        ("mqtt://broker:1883/path", "path"),
        ("mqtts://broker?ca=/x", "query"),
        ("mqtt://broker#frag", "fragment"),
        ("mqtt://broker:99999", "port"),
    ],
)
def test_urls_that_cannot_be_honoured_are_refused(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match="broker URL") as err:
        client(url, "x")
    assert problem in str(err.value)
    assert "pw@" not in str(err.value)  # the password is not echoed


def test_credentials_over_plain_mqtt_to_another_host_are_refused(creds: BrokerFiles) -> None:
    a = auth(creds, "peer-0")
    with pytest.raises(ConfigError, match="unencrypted"):
        client("mqtt://10.0.0.9:1883", "x", auth=a)
    with pytest.raises(ConfigError, match="unencrypted"):
        client("mqtt://peer-0@broker.lab", "x")
    assert connection("mqtt://127.0.0.1:1883", a)[1].password == a.password  # loopback: allowed
    address, resolved = connection("mqtts://broker.lab", a)  # TLS, on the default port
    assert (address.host, address.port, address.tls) == ("broker.lab", 8883, True)
    assert resolved.username == "peer-0"
    address, resolved = connection("mqtts://peer-1@broker.lab:9883", None)  # user in the URL
    assert (address.port, resolved.username, resolved.password) == (9883, "peer-1", None)
    with pytest.raises(ConfigError, match="need TLS"):
        client("mqtt://127.0.0.1", "x", auth=BrokerAuth(ca=creds.ca))


def test_credential_settings_are_checked(
    creds: BrokerFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="not both"):
        BrokerAuth.resolve("x", username="x", password_file="f", password_env="E")
    with pytest.raises(ConfigError, match="cannot read"):
        BrokerAuth.resolve("x", username="x", password_file=tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        BrokerAuth.resolve("x", username="x", password_file=empty)
    with pytest.raises(ConfigError, match="unset or empty"):
        BrokerAuth.resolve("peer-3", username="u", password_env="CONCORD_PW_{identity}")
    monkeypatch.setenv("CONCORD_PW_PEER_3", "from-env")
    a = BrokerAuth.resolve("peer-3", username="{identity}", password_env="CONCORD_PW_{identity}")
    assert (a.username, a.password) == ("peer-3", "from-env")
    assert "from-env" not in repr(a)
    with pytest.raises(ConfigError, match="needs a username"):
        BrokerAuth.resolve("x", password_env="CONCORD_PW_PEER_3")
    with pytest.raises(ConfigError, match="go together"):
        BrokerAuth.resolve("x", cert=creds.cert)
    with pytest.raises(ConfigError, match="not a file"):
        BrokerAuth.resolve("x", ca=tmp_path / "nope.crt")
    with pytest.raises(ConfigError, match="give it in one place"):
        client("mqtts://someone@broker", "x", auth=auth(creds, "peer-0"))


def test_the_embedded_broker_refuses_a_public_bind_without_authentication() -> None:
    with pytest.raises(ConfigError, match="without authentication"):
        EmbeddedBroker("0.0.0.0")
    with pytest.raises(ConfigError, match="both"):
        EmbeddedBroker(password_file="passwd")


def test_the_run_config_carries_the_settings_and_refuses_a_password_in_the_url(
    creds: BrokerFiles,
) -> None:
    from concord.core.config import load_config

    folder = creds.passwords["peer-0"].parent
    cfg = load_config(
        None,
        [
            "orchestrator.broker=mqtts://broker.lab",
            "orchestrator.broker_username={identity}",
            f"orchestrator.broker_password_file={folder}/{{identity}}.password",
            f"orchestrator.broker_ca={creds.ca}",
        ],
        environ={},
    )
    a = BrokerAuth.from_config(cfg.orchestrator, "peer-1")
    assert a.username == "peer-1"
    assert a.password == creds.passwords["peer-1"].read_text().strip()
    assert a.ca == creds.ca
    with pytest.raises(ConfigError, match="password") as err:
        load_config(None, ["orchestrator.broker=mqtts://u:hunter2@broker.lab"], environ={})
    assert "hunter2" not in str(err.value)


def test_the_generated_mosquitto_conf_runs(creds: BrokerFiles, tmp_path: Path) -> None:
    """`concord certs broker`'s example configuration, moved to a free loopback port, starts a
    Mosquitto that takes the peers' credentials over TLS (and nothing anonymous)."""
    import getpass
    import socket
    import subprocess
    import time

    from concord.orchestrator.broker import free_port

    binary = mosquitto_binary()
    if binary is None:
        pytest.skip("mosquitto missing")
    port = free_port()
    text = creds.conf.read_text().replace("listener 8883 0.0.0.0", f"listener {port} 127.0.0.1")
    assert f"listener {port} 127.0.0.1" in text
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(text + f"user {getpass.getuser()}\n")
    proc = subprocess.Popen([binary, "-c", str(conf)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.05)

        async def main() -> None:
            url = f"mqtts://127.0.0.1:{port}"
            listener = auth(creds, "monitor", ca=creds.ca)
            peer = auth(creds, "peer-1", ca=creds.ca)
            assert await _delivered(url, peer, TOPICS.topic("heartbeat", 1), listener=listener)
            assert not await _delivered(url, peer, TOPICS.topic("heartbeat", 0), listener=listener)
            with pytest.raises(aiomqtt.MqttError):
                async with client(url, "anonymous", auth=BrokerAuth(ca=creds.ca), timeout=5):
                    pass

        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()


def test_identities_of_client_ids() -> None:
    from concord.protos.mqtt import identity_of

    assert identity_of("orchestrator-run1") == "orchestrator"
    assert identity_of("peer-run-1-7") == "peer-7"
    assert identity_of("monitor-run1") == "monitor"


@pytest.mark.parametrize("kind", KINDS)
def test_an_observer_watches_beside_the_launcher_s_monitor(kind: str, creds: BrokerFiles) -> None:
    """`concord status` logs in as "observer", `concord sim`'s live view as "monitor": on a
    broker that binds client ids to logins, two sessions of one login would close each other;
    these two hold theirs side by side, both read the run, neither may write."""
    from concord.protos.mqtt import Bus

    async def body(url: str) -> None:
        seen: dict[str, int] = {"monitor": 0, "observer": 0}

        def counter(who: str) -> Callable[[str, int | None, Any], None]:
            def handle(kind: str, peer: int | None, message: Any) -> None:
                seen[who] += 1

            return handle

        buses = [
            Bus(url, f"{who}-{RUN}", TOPICS, subscribe=["decision"], handler=counter(who),
                auth=auth(creds, who, ca=creds.ca))
            for who in ("monitor", "observer")
        ]  # fmt: skip
        async with buses[0], buses[1]:
            for bus in buses:
                assert await bus.wait_connected(10)
            publisher = auth(creds, "orchestrator", ca=creds.ca)
            async with client(url, session_client_id("o", publisher), auth=publisher) as pub:
                await pub.publish(TOPICS.topic("decision"), _decision(), qos=1)
            for _ in range(50):
                if all(seen.values()):
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # a session closed by the other would reconnect by now
            assert seen == {"monitor": 1, "observer": 1}
            assert [bus.connects for bus in buses] == [1, 1]
        observer = auth(creds, "observer", ca=creds.ca)
        assert not await _delivered(url, observer, TOPICS.topic("decision"),
                                    listener=auth(creds, "monitor", ca=creds.ca))  # fmt: skip

    _run(kind, creds, body)


@pytest.mark.parametrize("kind", KINDS)
def test_a_connecting_client_gets_no_retained_message_it_may_not_read(
    kind: str, creds: BrokerFiles, tmp_path: Path
) -> None:
    """amqtt 0.12 hands a connecting client the retained messages of every filter anybody
    subscribed to, without the ACL: here peer-0 and peer-1 are confined to their own subtrees
    (two tenants of one broker), peer-0 keeps a retained message under its subtree subscribed,
    and peer-1, connecting afterwards, must hear nothing of it — while it still receives its
    own retained message."""
    acl = tmp_path / "acl"
    acl.write_text(
        "user peer-0\ntopic readwrite tenant/a/#\n\nuser peer-1\ntopic readwrite tenant/b/#\n"
    )
    confined = dataclasses.replace(creds, acl=acl)

    async def body(url: str) -> None:
        peer0 = auth(creds, "peer-0", ca=creds.ca)
        peer1 = auth(creds, "peer-1", ca=creds.ca)
        async with client(url, session_client_id("p0", peer0), auth=peer0) as owner:
            await owner.publish("tenant/a/secret", b"a", qos=1, retain=True)
            await owner.subscribe("tenant/a/#", qos=1)
            async with client(url, session_client_id("p1", peer1), auth=peer1) as other:
                await other.publish("tenant/b/own", b"b", qos=1, retain=True)
            async with client(url, session_client_id("p1", peer1), auth=peer1) as other:
                await other.subscribe("tenant/b/#", qos=1)
                heard: list[str] = []
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.5):
                        async for m in other.messages:
                            heard.append(str(m.topic))  # noqa: PERF401 - ended by the timeout
                assert heard == ["tenant/b/own"]

    async def main() -> None:
        async with _broker(kind, confined) as url:
            await body(url)

    asyncio.run(asyncio.wait_for(main(), 60))
