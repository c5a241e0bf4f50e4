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
  retained messages (a restarted broker has lost them);
* identities at the broker (`BrokerAuth`): ``mqtts://`` (TLS, port 8883, the broker verified
  against a CA file), a username (URL or ``orchestrator.broker_username``) and a password read
  only from a file or an environment variable. A password in the URL, credentials over plain
  ``mqtt://`` to a non-loopback host, TLS files with ``mqtt://`` or any URL part that cannot be
  honoured is a ValueError/ConfigError before anything connects; passwords are never logged
  (nor shown in a repr) and a broker's refusal is logged once per attempt as ``mqtt.refused``;
* signed control messages (`concord.protos.signing`), independent of the broker: with the
  ``signing``'s signer every published message and the Last-Will (signed again at each connect:
  it takes a fresh sequence number) is sealed; with its verifier every received payload must be
  an envelope that verifies before it is decoded. A refused envelope is counted in ``rejected`` and
  logged (``control.rejected``) once per claimed sender and reason;
* the handler is guarded here, once for every participant: an exception is logged with the
  topic (``control.handler_failed``), counted in ``handler_errors`` and never ends the session;
* client ids belong to identities (`session_client_id`): ``<username>@<role>-<random>`` with a
  broker login — the embedded broker refuses any other (`client_id_allowed`), Mosquitto replaces
  it with the username (`MOSQUITTO_CLIENT_ID_BINDING`) — and ``<role>-<random>`` without one, so
  no other login can take a session over by connecting with its id;
* the orchestrator's Bus stamps its run nonce (``incarnation``) on every message that has the
  field, its Last-Will included (`concord.protos.control_plane.Presence`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiomqtt
import structlog

from concord.errors import ConfigError
from concord.protos.control_plane import TOPICS, Message, PayloadError, Topics, decode, encode
from concord.protos.signing import (
    SignatureError,
    Signer,
    Signing,
    Verifier,
    required_identity,
)

log = structlog.get_logger("concord.protos.mqtt")


def _config_error(message: str) -> ConfigError:
    return ConfigError([("orchestrator", message)])


NODELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)


DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883}
# The identity template: ``{identity}`` in a username, password file, environment variable name,
# certificate or key path becomes "orchestrator", "peer-<id>" or "monitor" (`identity_of`).
IDENTITY = "{identity}"


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or "localhost": traffic that never leaves the machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool = False
    username: str | None = None

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        """``mqtt://HOST[:PORT]`` (port 1883) or ``mqtts://[USER@]HOST[:PORT]`` (TLS, port 8883;
        a username is also allowed with ``mqtt://`` to a loopback host). ValueError, naming the
        part, for anything that cannot be honoured: another scheme, a password in the URL (it
        would end up in logs, `ps` and records: use a password file or environment variable),
        a path, query or fragment, a bad port."""
        parsed = urlparse(url if "://" in url else f"mqtt://{url}")
        shown = _redact(url)
        if parsed.scheme not in DEFAULT_PORTS or not parsed.hostname:
            raise ValueError(
                f"broker URL {shown!r} must look like mqtt://HOST[:PORT] or mqtts://[USER@]HOST[:PORT]"
            )
        if parsed.password is not None:
            raise ValueError(
                f"broker URL {shown!r} carries a password: never put it in the URL; give "
                "orchestrator.broker_password_file or orchestrator.broker_password_env instead"
            )
        for part, value in (
            ("path", parsed.path.strip("/")),
            ("parameters", parsed.params),
            ("query", parsed.query),
            ("fragment", parsed.fragment),
        ):
            if value:
                raise ValueError(
                    f"broker URL {shown!r} has a {part} ({value!r}), which an MQTT connection "
                    "cannot honour; use mqtt[s]://[USER@]HOST[:PORT] and the orchestrator.broker_* "
                    "settings for credentials and TLS files"
                )
        try:
            port = parsed.port or DEFAULT_PORTS[parsed.scheme]
        except ValueError:
            raise ValueError(f"broker URL {shown!r} has an invalid port") from None
        if parsed.username == "":
            raise ValueError(f"broker URL {shown!r} has an empty username before '@'")
        return cls(parsed.hostname, port, parsed.scheme == "mqtts", parsed.username)


def _redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for error messages and logs)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, hostpart = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.split(':', 1)[0]}:***@{hostpart}"
    return f"{scheme}{sep}{rest}"


# The one line of a Mosquitto listener's configuration that binds client ids to identities: the
# client id of an authenticated client becomes its username, whatever its CONNECT says. Without
# it any login could connect with another identity's client id and take that session over
# (Mosquitto closes the live connection and publishes its Last-Will). Every generated
# mosquitto.conf with a password file carries it (`concord certs broker`'s example,
# `concord.orchestrator.broker.MosquittoBroker`).
MOSQUITTO_CLIENT_ID_BINDING = "use_username_as_clientid true"
CLIENT_ID_SEPARATOR = "@"


def client_id_allowed(username: str, client_id: str) -> bool:
    """Whether an authenticated ``username`` may connect as ``client_id`` on the embedded broker:
    its own name, or its name followed by ``@`` and anything (``peer-3@peer-run-3-9f2c``), so one
    identity may hold several sessions but never one of another identity."""
    return client_id == username or client_id.startswith(username + CLIENT_ID_SEPARATOR)


def session_client_id(identifier: str, auth: BrokerAuth | None) -> str:
    """The MQTT client id a Concord client connects with: ``<username>@<identifier>-<random>``
    with a broker login (the id belongs to the login: `client_id_allowed`; Mosquitto replaces it
    with the username anyway, `MOSQUITTO_CLIENT_ID_BINDING`), ``<identifier>-<random>`` without
    one (an anonymous broker cannot bind ids: an unguessable id is what keeps others from taking
    the session over). The random part is chosen once per `Bus`."""
    tail = f"{identifier}-{secrets.token_hex(4)}"
    if auth is not None and auth.username:
        return f"{auth.username}{CLIENT_ID_SEPARATOR}{tail}"
    return tail


def identity_of(identifier: str) -> str:
    """The broker identity of a client id: ``orchestrator-<run>`` → "orchestrator",
    ``peer-<run>-<id>`` → "peer-<id>", ``monitor-<run>`` → "monitor" (else the id itself)."""
    for role in ("orchestrator", "monitor"):
        if identifier == role or identifier.startswith(f"{role}-"):
            return role
    if identifier.startswith("peer-"):
        tail = identifier.rsplit("-", 1)[1]
        if tail.isdigit():
            return f"peer-{tail}"
    return identifier


@dataclass(frozen=True)
class BrokerAuth:
    """How one identity authenticates to the broker: ``username`` and its ``password`` (read from
    a file or an environment variable, never from the URL; kept out of repr), the ``ca`` file
    that verifies an ``mqtts://`` broker (None: the system's trust store) and an optional client
    ``cert``/``key`` pair."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.username, self.password, self.ca, self.cert))

    @classmethod
    def resolve(
        cls,
        identity: str,
        *,
        username: str | None = None,
        password_file: str | Path | None = None,
        password_env: str | None = None,
        ca: str | Path | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
    ) -> BrokerAuth:
        """Expand ``{identity}`` in every setting (in an environment variable name it becomes
        upper case with ``_`` for ``-``: ``CONCORD_BROKER_PASSWORD_{identity}`` →
        ``CONCORD_BROKER_PASSWORD_PEER_3``) and read the password. ConfigError naming the setting
        for: both or a missing file/variable, an empty password, a password without a username,
        a certificate without its key (or the reverse), a missing CA/certificate/key file."""

        def expand(value: str | Path | None) -> str | None:
            return None if value is None else str(value).replace(IDENTITY, identity)

        password: str | None = None
        if password_file is not None and password_env is not None:
            raise _config_error(
                "give orchestrator.broker_password_file or orchestrator.broker_password_env, "
                "not both"
            )
        if password_file is not None:
            path = Path(expand(password_file) or "")
            try:
                password = path.read_text(encoding="utf-8").rstrip("\r\n")
            except OSError as exc:
                raise _config_error(
                    f"cannot read the broker password file {path} (orchestrator."
                    f"broker_password_file, identity {identity!r}): {exc.strerror or exc}"
                ) from None
            if not password:
                raise _config_error(f"the broker password file {path} is empty")
        elif password_env is not None:
            name = password_env.replace(IDENTITY, identity.upper().replace("-", "_"))
            password = os.environ.get(name)
            if not password:
                raise _config_error(
                    f"the environment variable {name} (orchestrator.broker_password_env, "
                    f"identity {identity!r}) is unset or empty"
                )
        user = expand(username)
        if password is not None and not user:
            raise _config_error(
                "a broker password needs a username: set orchestrator.broker_username "
                "(e.g. '{identity}') or put USER@ in the broker URL"
            )
        files: dict[str, Path | None] = {}
        for setting, value in (("broker_ca", ca), ("broker_cert", cert), ("broker_key", key)):
            text = expand(value)
            files[setting] = None if text is None else Path(text)
            if text is not None and not Path(text).is_file():
                raise _config_error(
                    f"orchestrator.{setting} {text} (identity {identity!r}) is not a file"
                )
        if (files["broker_cert"] is None) != (files["broker_key"] is None):
            raise _config_error(
                "orchestrator.broker_cert and orchestrator.broker_key go together: give both "
                "or neither"
            )
        return cls(user, password, files["broker_ca"], files["broker_cert"], files["broker_key"])

    @classmethod
    def from_config(cls, orchestrator: Any, identity: str) -> BrokerAuth:
        """`resolve` from an `OrchestratorConfig` (its ``broker_*`` settings)."""
        return cls.resolve(
            identity,
            username=orchestrator.broker_username,
            password_file=orchestrator.broker_password_file,
            password_env=orchestrator.broker_password_env,
            ca=orchestrator.broker_ca,
            cert=orchestrator.broker_cert,
            key=orchestrator.broker_key,
        )


def connection(url: str, auth: BrokerAuth | None = None) -> tuple[BrokerAddress, BrokerAuth]:
    """The address and effective credentials of a connection, checked together. ValueError
    (ConfigError) when they cannot be honoured: TLS files or a client certificate with plain
    ``mqtt://``; credentials over plain ``mqtt://`` to a host that is not loopback (they would
    cross the network in clear text: use ``mqtts://``); a username in the URL that differs from
    the configured one."""
    address = BrokerAddress.parse(url)
    auth = auth or BrokerAuth()
    username = auth.username
    if address.username is not None:
        if username is not None and username != address.username:
            raise _config_error(
                f"the broker URL names user {address.username!r} but orchestrator."
                f"broker_username gives {username!r}; give it in one place"
            )
        username = address.username
    auth = replace(auth, username=username)
    if not address.tls:
        if auth.ca is not None or auth.cert is not None:
            raise _config_error(
                f"orchestrator.broker_ca/broker_cert need TLS, but the broker URL "
                f"{_redact(url)!r} is plain mqtt://; use mqtts://"
            )
        if (auth.username is not None or auth.password is not None) and not is_loopback(
            address.host
        ):
            raise _config_error(
                f"broker credentials over plain mqtt:// to {address.host} would cross the "
                "network unencrypted; use mqtts://HOST[:PORT] (and orchestrator.broker_ca)"
            )
    return address, auth


def tls_context(auth: BrokerAuth) -> ssl.SSLContext:
    """Verifies the broker's certificate and host name against ``auth.ca`` (None: the system
    store) and presents ``auth.cert``/``auth.key`` when given."""
    try:
        context = ssl.create_default_context(cafile=str(auth.ca) if auth.ca is not None else None)
        if auth.cert is not None and auth.key is not None:
            context.load_cert_chain(str(auth.cert), str(auth.key))
    except (OSError, ssl.SSLError) as exc:
        raise _config_error(f"cannot load the broker TLS files: {exc}") from None
    return context


def client(
    url: str,
    identifier: str,
    *,
    will: aiomqtt.Will | None = None,
    keepalive: int = 10,
    timeout: float = 10.0,
    auth: BrokerAuth | None = None,
) -> aiomqtt.Client:
    """An MQTT 3.1.1 client (amqtt speaks nothing newer) with TCP_NODELAY; TLS for ``mqtts://``
    and the username/password of ``auth`` (see `connection` for what is refused)."""
    address, auth = connection(url, auth)
    return aiomqtt.Client(
        address.host,
        address.port,
        username=auth.username,
        password=auth.password,
        identifier=identifier,
        will=will,
        keepalive=keepalive,
        timeout=timeout,
        protocol=aiomqtt.ProtocolVersion.V311,
        socket_options=NODELAY,
        max_queued_incoming_messages=100_000,
        tls_context=tls_context(auth) if address.tls else None,
    )


# CONNACK return codes of MQTT 3.1.1 that mean "not you": bad username or password (4), not
# authorised (5); paho also reports them as its reason codes 134/135
_REFUSED = {4, 5, 134, 135}

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
        auth: BrokerAuth | None = None,
        signing: Signing | None = None,
        incarnation: str | None = None,
    ) -> None:
        self.url = url
        # the orchestrator's run nonce: stamped on every message it sends that has the field
        self.incarnation = incarnation
        # checked here, not in the connection task: a setting that cannot be honoured is the
        # caller's ConfigError, not a reconnect loop
        self.address, self.auth = connection(url, auth)
        self.refusals = 0  # connection attempts the broker refused (bad credentials, not allowed)
        self.identifier = identifier
        self.client_id = session_client_id(identifier, self.auth)  # what the broker sees
        self.topics = topics
        self.kinds = list(subscribe)
        self.handler = handler
        self.backoff = backoff
        self.keepalive = keepalive
        self.signer: Signer | None = signing.signer if signing is not None else None
        self.verifier: Verifier | None = signing.verifier if signing is not None else None
        # the Last-Will: topic and encoded message, sealed anew for every connection (`will`)
        self._will: tuple[str, bytes] | None = None
        if will is not None:
            kind, peer, message = will
            self._will = (topics.topic(kind, peer), encode(self._stamp(message)))
        self.connected = asyncio.Event()
        self.connected_at: float | None = None  # time.monotonic() of the current connection
        self.connects = 0  # successful connections so far (1 + reconnects)
        self.closed = 0  # live sessions the broker ended (`_closed_by_broker`)
        self._said_closed = False  # … said for the current session
        self.rejected = 0  # invalid, unsigned or refused payloads received
        self.handler_errors = 0  # messages whose handling raised (logged, never propagated)
        self.duplicates = 0  # second copies of a signed message (dropped, not refusals)
        self._told: set[tuple[str, str]] = set()  # (sender, reason) of refusals logged so far
        self._retained: dict[str, bytes] = {}  # topic → encoded message, re-published
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

    @property
    def will(self) -> aiomqtt.Will | None:
        """The Last-Will of the next connection (signed: with the next sequence number)."""
        if self._will is None:
            return None
        topic, payload = self._will
        if self.signer is not None:
            payload = self.signer.seal(topic, payload, will=True)
        spec = TOPICS[self.topics.parse(topic)[0]]
        return aiomqtt.Will(topic, payload, qos=spec.qos, retain=spec.retain)

    async def _run(self) -> None:
        delay = self.backoff[0]
        while not self._closing:
            client_ = client(
                self.url,
                self.client_id,
                will=self.will,
                keepalive=self.keepalive,
                timeout=5.0,
                auth=self.auth,
            )
            try:
                async with client_:
                    self._client = client_
                    for kind in self.kinds:
                        await client_.subscribe(self.topics.wildcard(kind), qos=TOPICS[kind].qos)
                    await self._republish(client_)
                    self.connects += 1
                    self.connected_at = time.monotonic()
                    self._said_closed = False
                    self.connected.set()
                    delay = self.backoff[0]
                    log.info("mqtt.connected", client=self.identifier, connects=self.connects)
                    async for m in client_.messages:
                        await self._dispatch(str(m.topic), m.payload)
            except aiomqtt.MqttCodeError as exc:
                if not self._closing and getattr(exc.rc, "value", exc.rc) in _REFUSED:
                    self.refusals += 1
                    log.error(
                        "mqtt.refused",
                        client=self.identifier,
                        username=self.auth.username,
                        error=str(exc),
                    )
                elif not self._closing:
                    log.warning("mqtt.disconnected", client=self.identifier, error=str(exc))
                    self._closed_by_broker()
            except aiomqtt.MqttError as exc:
                if not self._closing:
                    log.warning("mqtt.disconnected", client=self.identifier, error=str(exc))
                    self._closed_by_broker()
            finally:
                self._client = None
                self.connected.clear()
            if not self._closing:
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff[1])

    def _closed_by_broker(self) -> None:
        """A live session ended by the broker. With a login that is how Mosquitto answers another
        connection of the same identity (one session per username): said once per session as
        what it may be — this identity's credentials in use elsewhere."""
        if self.auth.username and self.connected_at is not None and not self._said_closed:
            self._said_closed = True
            self.closed += 1
            log.warning(
                "mqtt.session_closed",
                client=self.identifier,
                username=self.auth.username,
                after_s=round(time.monotonic() - self.connected_at, 1),
                hint="if the broker is up, another client logged in as this identity (the "
                "broker keeps one session per login): its credentials may be in use elsewhere",
            )

    async def _dispatch(self, topic: str, payload: Any) -> None:
        raw = payload if isinstance(payload, bytes | bytearray) else b""
        if not raw:  # a cleared retained message
            return
        try:
            kind, peer = self.topics.parse(topic)
            body = bytes(raw) if self.verifier is None else self.verifier.open(topic, bytes(raw))
            message = decode(topic, body)
        except SignatureError as exc:
            if exc.reason == "duplicate":  # delivered twice (at-least-once): nothing wrong
                self.duplicates += 1
                log.debug("control.duplicate", client=self.identifier, topic=topic)
                return
            self.rejected += 1
            # once per (the identity the topic requires, reason): a bounded set that a flood of
            # made-up sender names cannot exhaust; the name the envelope claims is logged as such
            told = (required_identity(topic) or "?", exc.reason)
            if told not in self._told and len(self._told) < 1024:
                self._told.add(told)
                log.warning(
                    "control.rejected",
                    client=self.identifier,
                    topic=topic,
                    sender=required_identity(topic),
                    claimed=exc.sender,
                    reason=exc.reason,
                    problem=exc.problem,
                )
            return
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
            self.handler_errors += 1
            log.exception(
                "control.handler_failed",
                client=self.identifier,
                topic=topic,
                sender=peer,
                error=repr(exc),
            )

    def _seal(self, topic: str, body: bytes) -> bytes:
        """``body`` as sent: signed (with the next sequence number) when this Bus signs. A
        retained message is sealed anew when it is re-published after a reconnect: its
        receivers have seen the old bytes (a replay), and the sender's Last-Will may have been
        published since, which the re-publication must supersede, as it does unsigned."""
        return body if self.signer is None else self.signer.seal(topic, body)

    async def _republish(self, client_: aiomqtt.Client) -> None:
        """Re-publish every retained message on a new connection (the broker may have lost
        them: a restart without persistence). A message `publish` retains meanwhile — it was
        not sent: not connected yet — is caught by the next pass; the last pass finds nothing
        new and the caller sets ``connected`` with no await in between, so from then on
        `publish` sends itself. (Before, a peer's "done" retained during this loop was never
        sent: the orchestrator waited for it until the peer left.)"""
        sent: dict[str, bytes] = {}
        while fresh := [(t, b) for t, b in self._retained.items() if sent.get(t) != b]:
            for topic, body in fresh:
                spec = TOPICS[self.topics.parse(topic)[0]]
                payload = self._seal(topic, body)
                await client_.publish(topic, payload, qos=spec.qos, retain=True)
                sent[topic] = body

    def _stamp(self, message: Message) -> Message:
        if self.incarnation is None or not hasattr(message, "incarnation"):
            return message
        return replace(message, incarnation=self.incarnation)  # type: ignore[call-arg]

    async def publish(self, kind: str, message: Message, peer: int | None = None) -> bool:
        """Send one message with its topic's QoS/retain; False (and logged) if not connected."""
        topic = self.topics.topic(kind, peer)
        spec = TOPICS[kind]
        body = encode(self._stamp(message))
        if spec.retain:
            self._retained[topic] = body
        payload = self._seal(topic, body)
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


# --------------------------------------------------------------- broker files (Mosquitto formats)
# `concord certs broker` writes them (`concord.peer.broker_creds`); the embedded broker and the
# tests read them. Problems are ValueErrors naming the file and line.

_SALT_BYTES = 12  # mosquitto_passwd's salt length for $7$
_HASH = re.compile(r"^\$7\$(\d+)\$([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+)$")


def mosquitto_hash(password: str, *, salt: bytes | None = None, iterations: int = 101) -> str:
    """``$7$<iterations>$<base64 salt>$<base64 PBKDF2-HMAC-SHA512>``, the format of Mosquitto 2's
    password files."""
    salt = salt if salt is not None else os.urandom(_SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    b64 = base64.b64encode
    return f"$7${iterations}${b64(salt).decode()}${b64(digest).decode()}"


def mosquitto_verify(password: str, hashed: str) -> bool:
    """True when ``password`` matches a ``$7$`` hash (constant-time comparison); False for any
    other hash format."""
    m = _HASH.match(hashed.strip())
    if m is None:
        return False
    try:
        salt, expected = base64.b64decode(m[2]), base64.b64decode(m[3])
    except ValueError:
        return False
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, int(m[1]))
    return hmac.compare_digest(digest, expected)


def read_passwd(path: Path) -> dict[str, str]:
    """user → hash from a Mosquitto password file (``user:hash`` lines, ``#`` comments)."""
    users: dict[str, str] = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not user or not hashed:
            raise ValueError(f"{path}:{n}: expected user:hash")
        users[user] = hashed
    return users


def read_acl(path: Path) -> dict[str, dict[str, list[str]]]:
    """The rules of a Mosquitto ACL file in the subset `mosquitto_acl` writes (``user``,
    ``topic read|write|readwrite``); ValueError for anything else (the embedded broker must not
    silently ignore a rule)."""
    rules: dict[str, dict[str, list[str]]] = {}
    user: str | None = None
    for n, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        if words[0] == "user" and len(words) == 2:
            user = words[1]
            rules.setdefault(user, {"write": [], "read": []})
        elif words[0] == "topic" and user is not None and len(words) == 3:
            access, topic = words[1], words[2]
            if access not in ("read", "write", "readwrite"):
                raise ValueError(f"{path}:{n}: unknown access {access!r}")
            for a in ("read", "write"):
                if a in access:
                    rules[user][a].append(topic)
        else:
            raise ValueError(
                f"{path}:{n}: the embedded broker understands only 'user NAME' and "
                f"'topic read|write|readwrite TOPIC' lines after a user; got {line!r}"
            )
    return rules
