"""Signed control messages through a real broker (the embedded amqtt one, anonymous: the
signatures alone must stop forgeries): `Bus` signs what it publishes and its Last-Will, verifies
what it receives, and drops unsigned, forged, replayed and misattributed messages — counted,
logged once per sender and reason, never handed to the handler. A Bus without a verifier refuses
signed envelopes with a reason that says so."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog

from concord.orchestrator.broker import EmbeddedBroker
from concord.peer.certs import init_ca, issue_orchestrator, issue_peer
from concord.protos.control_plane import (
    Heartbeat,
    Message,
    Schedule,
    Status,
    Topics,
    encode,
)
from concord.protos.mqtt import Bus, client
from concord.protos.signing import Signer, Signing, Verifier

T = 10.0  # seconds: upper bound on anything that must happen (loaded 2-core machine)
RUN = "signedbus"
TOPICS = Topics(RUN)
STATES = ["starting", "ready"]
SCHEDULE = Schedule(
    version=1, peers=[0, 1], topology="ring", weights=None, kappa=1.0, seed=0, phases=[]
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    init_ca(d, run_id=RUN)
    for i in range(3):
        issue_peer(d, i)
    issue_orchestrator(d)
    return d


def signing(pki: Path, who: str) -> Signing:
    verifier = Verifier.load(pki / "ca.crt", RUN)
    return Signing(Signer.load(who, pki / f"{who}.key", pki / f"{who}.crt", RUN), verifier)


async def _until(predicate: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + T
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class Inbox:
    def __init__(self) -> None:
        self.got: list[tuple[str, int | None, Message]] = []

    def __call__(self, kind: str, peer: int | None, message: Message) -> None:
        self.got.append((kind, peer, message))

    def states(self, peer: int) -> list[str]:
        return [m.state for k, p, m in self.got if isinstance(m, Status) and p == peer]


def _break(bus: Bus) -> None:
    """Cut the bus's TCP connection without an MQTT DISCONNECT: the broker publishes its will."""
    assert bus._client is not None
    sock = bus._client._client.socket()
    sock.shutdown(socket.SHUT_RDWR)


def test_signed_messages_flow_and_forgeries_are_dropped(pki: Path) -> None:
    async def scenario() -> None:
        orch_in, peer_in, plain_in = Inbox(), Inbox(), Inbox()
        async with EmbeddedBroker() as broker:
            url = broker.url
            orch = Bus(
                url, f"orchestrator-{RUN}", TOPICS, handler=orch_in,
                subscribe=["status", "heartbeat", "orchestrator"],
                signing=signing(pki, "orchestrator"),
            )  # fmt: skip
            peer = Bus(
                url, f"peer-{RUN}-1", TOPICS, handler=peer_in, subscribe=["schedule"],
                will=("status", 1, Status(peer=1, state="offline")),
                signing=signing(pki, "peer-1"), backoff=(0.05, 0.2),
            )  # fmt: skip
            liar = Bus(
                url, f"peer-{RUN}-2", TOPICS, handler=Inbox(), subscribe=[],
                signing=signing(pki, "peer-2"),
            )  # fmt: skip
            plain = Bus(url, "plain", TOPICS, handler=plain_in, subscribe=["schedule"])
            captured: list[bytes] = []
            async with orch, peer, liar, plain, client(url, "rogue") as rogue:
                await rogue.subscribe(TOPICS.wildcard("status"), qos=1)

                async def capture() -> None:
                    async for m in rogue.messages:
                        payload = m.payload
                        if isinstance(payload, bytes) and payload:
                            captured.append(payload)

                tap = asyncio.create_task(capture())
                for b in (orch, peer, liar, plain):
                    assert await b.wait_connected(T)
                with structlog.testing.capture_logs() as logs:
                    # the real thing, both ways
                    await peer.publish("status", Status(peer=1, state="starting"), 1)
                    await peer.publish("status", Status(peer=1, state="ready"), 1)
                    await orch.publish("schedule", SCHEDULE)
                    await _until(lambda: orch_in.states(1) == STATES, "peer 1's statuses")
                    await _until(lambda: len(peer_in.got) == 1, "the schedule")
                    assert peer_in.got[0][2] == SCHEDULE
                    await _until(lambda: len(captured) == 2, "the captured statuses")
                    # unsigned, twice: refused, counted twice, logged once
                    for _ in range(2):
                        await rogue.publish(
                            TOPICS.topic("heartbeat", 1),
                            encode(Heartbeat(peer=1, step=1, ts=1.0)),
                            qos=1,
                        )
                    # a replay of peer 1's first signed status ("starting"), and a second copy
                    # of its last (a duplicate: dropped without a complaint)
                    await rogue.publish(TOPICS.topic("status", 1), captured[0], qos=1)
                    await rogue.publish(TOPICS.topic("status", 1), captured[1], qos=1)
                    await _until(lambda: orch.duplicates >= 1, "the duplicate")
                    # peer 2, signing correctly with its own key, on peer 1's topic
                    await liar.publish("heartbeat", Heartbeat(peer=1, step=1, ts=1.0), 1)
                    await _until(lambda: orch.rejected >= 4, "four refusals")
                    # a receiver without a verifier refuses the signed schedule, saying why
                    await _until(lambda: plain.rejected >= 1, "the plain bus's refusal")
                assert plain_in.got == []
                assert [k for k, _, _ in orch_in.got if k == "heartbeat"] == []
                assert orch_in.states(1) == STATES
                assert orch.handler_errors == 0
                refusals = [
                    (e.get("sender"), e.get("claimed"), e.get("reason"))
                    for e in logs
                    if e["event"] == "control.rejected" and e.get("client") == orch.identifier
                ]
                # logged once per (the identity the topic requires, reason), with the claim
                assert sorted(refusals, key=str) == sorted(
                    [
                        ("peer-1", "peer-1", "unsigned"),
                        ("peer-1", "peer-1", "replay"),
                        ("peer-1", "peer-2", "identity"),
                    ],
                    key=str,
                )
                plain_problems = [e["problem"] for e in logs if e.get("client") == plain.identifier]
                assert any("no run CA to verify it" in p for p in plain_problems)

                # Last-Will: signed at each connect, accepted after the later messages; the
                # retained status re-published after the reconnect is signed anew and accepted
                for round_ in (1, 2):
                    connects, expected = peer.connects, [*STATES, *["offline", "ready"] * round_]
                    _break(peer)
                    await _until(
                        lambda e=expected: orch_in.states(1) == e,  # type: ignore[misc]
                        f"will and re-published status, round {round_}",
                    )
                    assert peer.connects == connects + 1
                tap.cancel()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_handler_exception_is_counted_by_the_bus_and_the_session_goes_on(pki: Path) -> None:
    async def scenario() -> None:
        seen: list[Message] = []

        def handler(kind: str, peer: int | None, message: Any) -> None:
            if message.step == 1:
                raise RuntimeError("boom")
            seen.append(message)

        async with EmbeddedBroker() as broker:
            orch = Bus(
                broker.url, "o", TOPICS, handler=handler, subscribe=["heartbeat"],
                signing=signing(pki, "orchestrator"),
            )  # fmt: skip
            peer = Bus(broker.url, "p", TOPICS, handler=Inbox(), subscribe=[],
                       signing=signing(pki, "peer-0"))  # fmt: skip
            async with orch, peer:
                assert await orch.wait_connected(T)
                assert await peer.wait_connected(T)
                await asyncio.sleep(0.2)  # the subscription is in place
                with structlog.testing.capture_logs() as logs:
                    await peer.publish("heartbeat", Heartbeat(peer=0, step=1, ts=1.0), 0)
                    await peer.publish("heartbeat", Heartbeat(peer=0, step=2, ts=1.0), 0)
                    await _until(lambda: len(seen) == 1, "the message after the failure")
                assert orch.handler_errors == 1
                assert orch.rejected == 0
                failed = [e for e in logs if e["event"] == "control.handler_failed"]
                assert failed[0]["topic"] == TOPICS.topic("heartbeat", 0)

    asyncio.run(asyncio.wait_for(scenario(), 60))
