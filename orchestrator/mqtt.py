"""aiomqtt 2.x clients for the control plane, configured as TRANSPORT.md prescribes.

* TCP_NODELAY on every client socket: paho (under aiomqtt) never sets it, and with Nagle plus
  delayed ACKs every QoS 1 hop costs 44 ms;
* an optional Last-Will (the broker publishes it if the client vanishes);
* `Client` must be created inside the running loop; it is reusable but not reentrant.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from urllib.parse import urlparse

import aiomqtt

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
