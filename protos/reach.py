"""Is the broker there, and does it take our login? One MQTT CONNECT, up front.

`concord sim --broker URL` and `concord status BROKER` ask this before they start anything, so
that a broker that is down, a wrong port or refused credentials is one sentence within
`PROBE_TIMEOUT` seconds instead of n processes that each retry for minutes.
"""

from __future__ import annotations

import asyncio

import aiomqtt

from concord.protos.mqtt import BrokerAuth, _redact, client, session_client_id

__all__ = ["PROBE_TIMEOUT", "BrokerUnreachableError", "probe_broker"]

PROBE_TIMEOUT = 2.0  # seconds: a broker on a LAN answers a CONNECT in milliseconds

# CONNACK return codes of MQTT 3.1.1 (and paho's reason codes for the same refusals)
_REASONS = {
    1: "it does not speak MQTT 3.1.1",
    2: "it refused the client id",
    3: "the broker is unavailable",
    4: "bad username or password",
    5: "not authorised",
    134: "bad username or password",
    135: "not authorised",
}


class BrokerUnreachableError(RuntimeError):
    """The broker did not answer, or refused the connection; the message says which and how to
    go on."""


def probe_broker(
    url: str,
    auth: BrokerAuth | None = None,
    *,
    identifier: str | None = None,
    timeout: float = PROBE_TIMEOUT,
) -> None:
    """Connect to ``url`` once as ``auth`` (None: anonymously; ``identifier``: the client id's
    role part, `concord.protos.mqtt.session_client_id`) and disconnect; raise
    `BrokerUnreachableError` naming the address and the reason when that fails within ``timeout``
    seconds (a configuration that cannot be honoured — TLS files with mqtt:// — is the
    `ConfigError` of `concord.protos.mqtt.connection`)."""
    ident = session_client_id(identifier or "probe", auth)  # an id the broker lets us have
    try:
        asyncio.run(_probe(url, auth, ident, timeout))
    except TimeoutError:
        raise BrokerUnreachableError(
            f"the MQTT broker at {_redact(url)} did not answer within {timeout:g} s; is it "
            "running, and is the address right?"
        ) from None


async def _probe(url: str, auth: BrokerAuth | None, identifier: str, timeout: float) -> None:
    who = f" as {auth.username!r}" if auth is not None and auth.username else ""
    mqtt = client(url, identifier, auth=auth, timeout=timeout, keepalive=max(2, int(timeout) + 1))
    try:
        async with asyncio.timeout(timeout):
            async with mqtt:
                pass
    except aiomqtt.MqttCodeError as exc:
        code = getattr(exc.rc, "value", exc.rc)
        reason = _REASONS.get(code, str(exc)) if isinstance(code, int) else str(exc)
        raise BrokerUnreachableError(
            f"the MQTT broker at {_redact(url)} refused the connection{who}: {reason}; check "
            "orchestrator.broker_username and the password file or variable"
        ) from None
    except aiomqtt.MqttError as exc:
        cause = str(exc.__cause__ or exc) or type(exc).__name__
        raise BrokerUnreachableError(
            f"no MQTT broker answers at {_redact(url)} ({cause}); start it (e.g. `mosquitto "
            "-p PORT`) or drop --broker / orchestrator.broker to use the embedded one"
        ) from None
