"""Client ids bound to identities, against real brokers (Mosquitto with `concord certs broker`'s
files and the embedded amqtt broker): a login cannot take over the session of another identity
by connecting with its client id, and the embedded broker keeps delivering while subscriptions
change under its broadcast (amqtt 0.12 stopped delivering for good: "dictionary changed size
during iteration")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiomqtt
import pytest
import structlog

from concord.orchestrator.broker import EmbeddedBroker, MosquittoBroker, mosquitto_binary
from concord.peer.broker_creds import BrokerFiles, issue_broker
from concord.peer.certs import init_ca
from concord.protos.control_plane import (
    Decision,
    Heartbeat,
    Presence,
    Topics,
    decode,
    encode,
)
from concord.protos.mqtt import BrokerAuth, Bus, client, client_id_allowed, session_client_id

RUN = "takeover"
TOPICS = Topics(RUN)


@pytest.fixture(scope="module")
def creds(tmp_path_factory: pytest.TempPathFactory) -> BrokerFiles:
    d = tmp_path_factory.mktemp("certs")
    init_ca(d, run_id=RUN)
    return issue_broker(d, run_id=RUN, peers=2, hosts=["127.0.0.1", "localhost"])


def auth(creds: BrokerFiles, who: str) -> BrokerAuth:
    return BrokerAuth.resolve(
        who,
        username="{identity}",
        password_file=creds.passwords[who].parent / "{identity}.password",
        ca=creds.ca,
    )


@asynccontextmanager
async def _broker(kind: str, creds: BrokerFiles) -> AsyncIterator[str]:
    if kind == "mosquitto":
        if mosquitto_binary() is None:
            pytest.skip("mosquitto missing")
        async with MosquittoBroker(
            password_file=creds.passwd, acl_file=creds.acl, tls=(creds.ca, creds.cert, creds.key)
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


def test_client_ids_belong_to_their_username() -> None:
    assert client_id_allowed("peer-1", "peer-1")
    assert client_id_allowed("peer-1", "peer-1@peer-run-1-ab12")
    assert not client_id_allowed("peer-1", "peer-10@x")
    assert not client_id_allowed("peer-1", "peer-run-1")
    assert not client_id_allowed("monitor", "orchestrator-run")
    a = session_client_id("peer-run-3", BrokerAuth(username="peer-3"))
    assert a.startswith("peer-3@peer-run-3-")
    assert client_id_allowed("peer-3", a)
    assert a != session_client_id("peer-run-3", BrokerAuth(username="peer-3"))  # unguessable
    assert session_client_id("peer-run-3", None).startswith("peer-run-3-")


@pytest.mark.parametrize("kind", ["mosquitto", "embedded"])
def test_another_identitys_client_id_cannot_take_a_session_over(
    kind: str, creds: BrokerFiles
) -> None:
    """Peer 0's login and the read-only monitor login connect with the orchestrator's client id
    (the one its Bus uses, and the predictable ``orchestrator-<run>`` of earlier versions). The
    orchestrator's session stays up (no reconnect), its Last-Will ("offline") is never published,
    and it keeps receiving; the embedded broker refuses such a CONNECT and logs it as a takeover
    (Mosquitto gives the intruder a session under its own username instead)."""
    got: list[tuple[str, int | None]] = []

    async def main() -> None:
        async with _broker(kind, creds) as url:
            will = ("orchestrator", None, Presence(state="offline", reason="connection lost"))
            orch = Bus(
                url,
                f"orchestrator-{RUN}",
                TOPICS,
                subscribe=["heartbeat"],
                handler=lambda kind_, peer, m: got.append((kind_, peer)),
                will=will,
                auth=auth(creds, "orchestrator"),
            )
            async with orch:
                assert await orch.wait_connected(10)
                wills: list[Presence] = []
                # peer 1 watches the orchestrator's topic (on Mosquitto a session per identity)
                async with client(url, "peer-1@watch", auth=auth(creds, "peer-1")) as watcher:
                    await watcher.subscribe(TOPICS.topic("orchestrator"), qos=1)
                    for who in ("peer-0", "monitor"):
                        password = creds.passwords[who].read_text(encoding="utf-8").strip()
                        a = BrokerAuth(username=who, password=password, ca=creds.ca)
                        for victim in (orch.client_id, f"orchestrator-{RUN}"):
                            with contextlib.suppress(aiomqtt.MqttError):
                                async with client(url, victim, auth=a, timeout=5) as intruder:
                                    assert kind == "mosquitto", "the embedded broker let it in"
                                    await asyncio.sleep(0.3)
                                    await intruder.publish(
                                        TOPICS.topic("decision"),
                                        encode(Decision(step=1, round=0, repeat=False)),
                                    )
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1.0):
                            async for m in watcher.messages:
                                payload = m.payload
                                assert isinstance(payload, bytes | bytearray)
                                if payload:
                                    p = decode(str(m.topic), bytes(payload))
                                    assert isinstance(p, Presence)
                                    wills.append(p)
                peer = Bus(url, f"peer-{RUN}-1", TOPICS, subscribe=[], handler=lambda *_: None,
                           auth=auth(creds, "peer-1"))  # fmt: skip
                async with peer:
                    assert await peer.wait_connected(10)
                    await peer.publish("heartbeat", Heartbeat(peer=1, step=3, ts=1.0), 1)
                    for _ in range(50):
                        if got:
                            break
                        await asyncio.sleep(0.1)
                assert orch.connects == 1, "the orchestrator's session was taken over"
                assert [w for w in wills if w.state == "offline"] == []
                assert got == [("heartbeat", 1)]

    with structlog.testing.capture_logs() as logs:
        asyncio.run(asyncio.wait_for(main(), 60))
    if kind == "embedded":
        refused = [e for e in logs if e["event"] == "broker.takeover_refused"]
        assert {e["username"] for e in refused} == {"peer-0", "monitor"}


def test_the_embedded_broker_keeps_delivering_while_subscriptions_change(
    creds: BrokerFiles, tmp_path: Path
) -> None:
    """Clients subscribe and leave (their filters deleted) while a publisher floods a topic that
    the ACL checks for each subscriber: every broadcast walks the subscriptions across awaits.
    amqtt 0.12's broadcast raised "dictionary changed size during iteration" when they changed
    meanwhile, and the message never reached the subscribers of the filters after that point
    (5 of 5 runs of this test against amqtt's own broadcast lost messages); now every one
    arrives."""
    sent = 400

    async def main() -> int:
        async with _broker("embedded", creds) as url:
            peer0, monitor = auth(creds, "peer-0"), auth(creds, "monitor")
            topic = TOPICS.topic("heartbeat", 0)
            churned = asyncio.Event()

            async def flood() -> None:
                async with client(url, "peer-0@flood", auth=peer0) as pub:
                    for n in range(sent):
                        await pub.publish(topic, b"%d" % n, qos=1)
                        if churned.is_set() and n > sent // 2:
                            continue
                        await asyncio.sleep(0.002)

            async def churn(i: int) -> None:
                for j in range(10):
                    async with client(url, f"monitor@churn-{i}-{j}", auth=monitor) as c:
                        await c.subscribe(f"concord/v1/{RUN}/status/{i * 10 + j}", qos=0)

            # the first filter the broadcast checks (then awaits the ACL), then the counted one
            async with (
                client(url, "monitor@first", auth=monitor) as first,
                client(url, "monitor@count", auth=monitor) as counted,
            ):
                await first.subscribe(topic, qos=0)
                await counted.subscribe(TOPICS.wildcard("heartbeat"), qos=1)
                flooding = asyncio.create_task(flood())
                await asyncio.gather(*(churn(i) for i in range(6)))
                churned.set()
                await flooding
                seen: set[bytes] = set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(3):
                        async for m in counted.messages:
                            assert isinstance(m.payload, bytes | bytearray)
                            seen.add(bytes(m.payload))
                            if len(seen) == sent:
                                break
                return len(seen)

    assert asyncio.run(asyncio.wait_for(main(), 60)) == sent


def test_on_mosquitto_a_second_session_of_the_same_login_is_reported_by_the_first(
    creds: BrokerFiles,
) -> None:
    """Mosquitto keeps one session per login: another connection with peer 0's credentials
    closes peer 0's Bus, which says so (``mqtt.session_closed``: its credentials may be in use
    elsewhere) and reconnects."""

    async def main() -> Bus:
        async with _broker("mosquitto", creds) as url:
            bus = Bus(url, f"peer-{RUN}-0", TOPICS, subscribe=[], handler=lambda *_: None,
                      auth=auth(creds, "peer-0"), backoff=(0.2, 0.5))  # fmt: skip
            async with bus:
                assert await bus.wait_connected(10)
                async with client(url, "anything", auth=auth(creds, "peer-0"), timeout=5):
                    await asyncio.sleep(0.5)
                for _ in range(50):
                    if bus.connects >= 2 and bus.connected.is_set():
                        break
                    await asyncio.sleep(0.1)
            return bus

    with structlog.testing.capture_logs() as logs:
        bus = asyncio.run(asyncio.wait_for(main(), 60))
    assert bus.closed == 1
    assert bus.connects >= 2
    (said,) = [e for e in logs if e["event"] == "mqtt.session_closed"]
    assert said["username"] == "peer-0"
    assert "in use elsewhere" in said["hint"]
