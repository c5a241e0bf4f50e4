"""The MQTT binding of the control contract (`concord.protos.control_plane`): aiomqtt 2.x clients
configured as docs/transport.md#mqtt-clients describes, and `Bus`, the reconnecting session every
participant (orchestrator, peer, the sim's progress view) runs.

* TCP_NODELAY on every client socket: paho (under aiomqtt) never sets it, and with Nagle plus
  delayed ACKs every QoS 1 hop costs 44 ms;
* an optional Last-Will (the broker publishes it if the client vanishes);
* `Client` must be created inside the running loop; it is reusable but not reentrant;
* every message is published with its topic's QoS and retain flag, and every received payload is
  validated (`decode`): a malformed or wrong-version message is logged with its topic and the
  problem, counted, and dropped — never a crash;
* after a broker blip the session reconnects with backoff, re-subscribes and re-publishes its
  retained messages (a restarted broker has lost them).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import aiomqtt
import structlog

from concord.protos.control_plane import TOPICS, Message, PayloadError, Topics, decode, encode

log = structlog.get_logger("concord.protos.mqtt")

NODELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        """``mqtt://host:port`` (port defaults to 1883)."""
        parsed = urlparse(url if "://" in url else f"mqtt://{url}")
        if parsed.scheme != "mqtt" or not parsed.hostname:
            raise ValueError(f"broker URL {url!r} must look like mqtt://HOST[:PORT]")
        try:
            port = parsed.port or 1883
        except ValueError:
            raise ValueError(f"broker URL {url!r} has an invalid port") from None
        return cls(parsed.hostname, port)


def client(
    url: str,
    identifier: str,
    *,
    will: aiomqtt.Will | None = None,
    keepalive: int = 10,
    timeout: float = 10.0,
) -> aiomqtt.Client:
    """An MQTT 3.1.1 client (amqtt speaks nothing newer) with TCP_NODELAY."""
    address = BrokerAddress.parse(url)
    return aiomqtt.Client(
        address.host,
        address.port,
        identifier=identifier,
        will=will,
        keepalive=keepalive,
        timeout=timeout,
        protocol=aiomqtt.ProtocolVersion.V311,
        socket_options=NODELAY,
        max_queued_incoming_messages=100_000,
    )


Handler = Callable[[str, int | None, Message], Awaitable[None] | None]


class Bus:
    """One participant's control-plane session: ``async with Bus(...) as bus`` runs the owned
    connection task; `publish` sends one message; `retain` also remembers it for re-publication
    after a reconnect. ``handler(kind, peer, message)`` receives every valid message on the
    subscribed topic kinds (``peer`` is the topic's peer id for per-peer topics)."""

    def __init__(
        self,
        url: str,
        identifier: str,
        topics: Topics,
        *,
        subscribe: Sequence[str],
        handler: Handler,
        will: tuple[str, int | None, Message] | None = None,
        backoff: tuple[float, float] = (0.2, 5.0),
        keepalive: int = 10,
    ) -> None:
        self.url = url
        self.identifier = identifier
        self.topics = topics
        self.kinds = list(subscribe)
        self.handler = handler
        self.backoff = backoff
        self.keepalive = keepalive
        self.will: aiomqtt.Will | None = None
        if will is not None:
            kind, peer, message = will
            spec = TOPICS[kind]
            self.will = aiomqtt.Will(
                topics.topic(kind, peer), encode(message), qos=spec.qos, retain=spec.retain
            )
        self.connected = asyncio.Event()
        self.connects = 0  # successful connections so far (1 + reconnects)
        self.rejected = 0  # invalid payloads received
        self._retained: dict[str, bytes] = {}
        self._client: aiomqtt.Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    async def __aenter__(self) -> Bus:
        self._task = asyncio.create_task(self._run(), name=f"mqtt-{self.identifier}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_connected(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.connected.wait(), timeout)
        return self.connected.is_set()

    async def _run(self) -> None:
        delay = self.backoff[0]
        while not self._closing:
            client_ = client(
                self.url, self.identifier, will=self.will, keepalive=self.keepalive, timeout=5.0
            )
            try:
                async with client_:
                    self._client = client_
                    for kind in self.kinds:
                        await client_.subscribe(self.topics.wildcard(kind), qos=TOPICS[kind].qos)
                    for topic, payload in list(self._retained.items()):
                        spec = TOPICS[self.topics.parse(topic)[0]]
                        await client_.publish(topic, payload, qos=spec.qos, retain=True)
                    self.connects += 1
                    self.connected.set()
                    delay = self.backoff[0]
                    log.info("mqtt.connected", client=self.identifier, connects=self.connects)
                    async for m in client_.messages:
                        await self._dispatch(str(m.topic), m.payload)
            except aiomqtt.MqttError as exc:
                if not self._closing:
                    log.warning("mqtt.disconnected", client=self.identifier, error=str(exc))
            finally:
                self._client = None
                self.connected.clear()
            if not self._closing:
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff[1])

    async def _dispatch(self, topic: str, payload: Any) -> None:
        raw = payload if isinstance(payload, bytes | bytearray) else b""
        if not raw:  # a cleared retained message
            return
        try:
            kind, peer = self.topics.parse(topic)
            message = decode(topic, bytes(raw))
        except PayloadError as exc:
            self.rejected += 1
            log.warning(
                "control.rejected", client=self.identifier, topic=topic, problem=exc.problem
            )
            return
        try:
            result = self.handler(kind, peer, message)
            if result is not None:
                await result
        except Exception as exc:  # a handler bug must not end the session; say what and where
            self.rejected += 1
            log.exception(
                "control.handler_failed", client=self.identifier, topic=topic, error=repr(exc)
            )

    async def publish(self, kind: str, message: Message, peer: int | None = None) -> bool:
        """Send one message with its topic's QoS/retain; False (and logged) if not connected."""
        topic = self.topics.topic(kind, peer)
        spec = TOPICS[kind]
        payload = encode(message)
        if spec.retain:
            self._retained[topic] = payload
        c = self._client
        if c is None or not self.connected.is_set():
            return False
        try:
            await c.publish(topic, payload, qos=spec.qos, retain=spec.retain, timeout=5.0)
        except aiomqtt.MqttError as exc:
            log.warning("mqtt.publish_failed", client=self.identifier, topic=topic, error=str(exc))
            return False
        return True

    async def clear(self, kind: str, peer: int | None = None) -> None:
        """Remove a retained message (an empty retained payload clears it on the broker)."""
        topic = self.topics.topic(kind, peer)
        self._retained.pop(topic, None)
        c = self._client
        if c is not None and self.connected.is_set():
            with contextlib.suppress(aiomqtt.MqttError):
                await c.publish(topic, b"", qos=1, retain=True, timeout=5.0)

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                await self._task
            self._task = None
