"""`concord.protos.mqtt.Bus` on a new connection: a retained message published while the bus
re-publishes its retained state (connected to the broker, not yet ``connected``) is sent too.

Found in ``bench/chaos.py``'s ``broker_lagged`` case: a peer finished training in the instant its
bus reconnected to a restarted Mosquitto; its retained "done" was stored but never sent, and the
orchestrator waited for it until the peer left, then dropped it."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import aiomqtt
import pytest

from concord.orchestrator.broker import EmbeddedBroker
from concord.protos.control_plane import Message, Status, Topics
from concord.protos.mqtt import Bus

T = 10.0  # seconds: upper bound on anything that must happen (loaded 2-core machine)
TOPICS = Topics("reconnect")


def test_a_status_retained_during_the_republish_of_a_reconnect_is_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> None:
        seen: list[str] = []

        def handler(kind: str, peer: int | None, message: Message) -> None:
            if isinstance(message, Status):
                seen.append(message.state)

        async with EmbeddedBroker() as broker:
            watcher = Bus(broker.url, "watcher", TOPICS, handler=handler, subscribe=["status"])
            peer = Bus(broker.url, "peer-0", TOPICS, handler=lambda *_: None, subscribe=[])
            async with watcher, peer:
                assert await watcher.wait_connected(T)
                assert await peer.wait_connected(T)
                await peer.publish("status", Status(peer=0, state="training"), 0)
                await _until(lambda: seen == ["training"])

                # the next connection: while the bus re-publishes "training", training ends
                original = aiomqtt.Client.publish
                injected: list[bool] = []

                async def publish(self: aiomqtt.Client, topic: str, *a: Any, **kw: Any) -> None:
                    await original(self, topic, *a, **kw)
                    if not injected and self is not first:
                        injected.append(await peer.publish("status", done, 0))

                done = Status(peer=0, state="done")
                first = peer._client
                monkeypatch.setattr(aiomqtt.Client, "publish", publish)
                peer.connected.clear()
                assert first is not None
                # the connection drops (no DISCONNECT); the bus reconnects
                first._client.socket().shutdown(socket.SHUT_RDWR)
                await _until(lambda: bool(injected))
                assert injected == [False]  # not sent by `publish` itself: not connected yet
                await _until(lambda: seen[-1:] == ["done"])
                assert peer.connects == 2

    asyncio.run(asyncio.wait_for(scenario(), 60))


async def _until(predicate: Any) -> None:
    end = time.monotonic() + T
    while not predicate():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.02)
