"""MQTT brokers for the control plane.

`EmbeddedBroker` is the zero-setup default: an amqtt broker in the orchestrator's event loop,
bound to 127.0.0.1 on a free port (amqtt's own default would be 0.0.0.0:1883 plus $SYS and
packet-logging plugins — docs/transport.md#embedded-broker — all overridden here). It speaks
MQTT 3.1.1 only. `MosquittoBroker` runs a private Mosquitto (Debian package) on a free loopback
port with ``set_tcp_nodelay true`` (without it QoS 1 control messages take 44 ms per hop,
docs/transport.md#tcp-nodelay); real deployments point everything at their own Mosquitto instead.

amqtt is an optional dependency (``pip install 'concord[broker]'``): it is imported only when an
`EmbeddedBroker` starts, so a run given an external broker (``--broker mqtt://HOST:PORT`` or
``orchestrator.broker``) never needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog

from concord.errors import ConfigError, OrchestratorError

log = structlog.get_logger("concord.orchestrator.broker")


def _config_error(message: str) -> ConfigError:
    return ConfigError([("orchestrator.broker", message)])


_BIND_ATTEMPTS = 5
BROKER_EXTRA_HINT = (
    "the embedded MQTT broker needs amqtt, which is not installed: install it with "
    "pip install 'concord[broker]' (or 'concord[all]'), or use an external MQTT broker instead "
    "(--broker mqtt://HOST:PORT, or orchestrator.broker in the config; e.g. Mosquitto)"
)


class BrokerUnavailableError(OrchestratorError, ImportError):
    """The embedded broker was needed but amqtt (the ``broker`` extra) is not installed.

    An `OrchestratorError` (so a RuntimeError, as the CLI reports) and an ImportError."""


def require_embedded_broker() -> Any:
    """amqtt's ``Broker`` class, imported on first use (amqtt is the optional ``broker`` extra).

    Raises `BrokerUnavailableError` naming the extra and the external-broker alternative; callers
    that will embed a broker later may call this first to fail before starting anything."""
    try:
        from amqtt.broker import Broker
    except ImportError as exc:
        raise BrokerUnavailableError(f"{BROKER_EXTRA_HINT} ({exc})") from exc
    return Broker


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the caller retries if someone takes it meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _plugins() -> tuple[type, type]:
    """amqtt plugins enforcing `concord certs broker`'s files (defined on first use: amqtt is
    optional). `PasswordFileAuth` checks a Mosquitto ``$7$`` password file; `TopicAcl` applies
    the Mosquitto ACL file: PUBLISH only on a ``topic write`` filter of the user, SUBSCRIBE only
    to a filter inside one of its ``topic read`` filters. amqtt's own FileAuthPlugin reads only
    argon2/bcrypt hashes and its ACL plugin needs deprecated options for subscriptions."""
    global _PLUGINS
    if _PLUGINS is not None:
        return _PLUGINS
    from amqtt.contexts import Action
    from amqtt.plugins.base import BaseAuthPlugin, BaseTopicPlugin

    from concord.protos.mqtt import mosquitto_verify, read_acl, read_passwd

    class PasswordFileAuth(BaseAuthPlugin):  # type: ignore[misc]  # amqtt is untyped
        """The password, and (as Mosquitto does) the Last-Will: its topic must be one the user
        may write, since amqtt publishes a will without asking the topic plugin."""

        @dataclass
        class Config:
            password_file: str = ""
            acl_file: str = ""

        def __init__(self, context: Any) -> None:
            super().__init__(context)
            self.users = read_passwd(Path(self.context.config.password_file))
            acl = self.context.config.acl_file
            self.rules = read_acl(Path(acl)) if acl else {}

        async def authenticate(self, *, session: Any) -> bool | None:
            hashed = self.users.get(session.username or "") if session else None
            ok = hashed is not None and mosquitto_verify(session.password or "", hashed)
            if not ok:
                log.warning("broker.auth_refused", username=getattr(session, "username", None))
                return False
            if session.will_flag:
                writes = self.rules.get(session.username, {}).get("write", [])
                if not any(_covers(f, session.will_topic or "") for f in writes):
                    log.warning(
                        "broker.will_refused", username=session.username, topic=session.will_topic
                    )
                    return False
            return True

    class TopicAcl(BaseTopicPlugin):  # type: ignore[misc]
        @dataclass
        class Config:
            acl_file: str = ""

        def __init__(self, context: Any) -> None:
            super().__init__(context)
            self.rules = read_acl(Path(self.context.config.acl_file))

        async def topic_filtering(
            self, *, session: Any = None, topic: str | None = None, action: Any = None
        ) -> bool | None:
            if action == Action.RECEIVE:
                return True  # the subscription was checked
            rules = self.rules.get(getattr(session, "username", None) or "")
            if rules is None or topic is None:
                return False
            if action == Action.PUBLISH:
                ok = any(_covers(f, topic) for f in rules["write"])
            else:
                ok = any(_covers(f, topic) for f in rules["read"])
            if not ok:
                log.warning(
                    "broker.topic_refused",
                    username=session.username,
                    topic=topic,
                    action=str(action),
                )
            return ok

    PasswordFileAuth.__module__ = TopicAcl.__module__ = __name__
    _authenticate_at_connect()
    _PLUGINS = PasswordFileAuth, TopicAcl
    return _PLUGINS


def _authenticate_at_connect() -> None:
    """Make amqtt authenticate a client as soon as its CONNECT is read, before the broker looks
    up its client id. amqtt 0.12 first deletes or updates the session of that client id (its
    subscriptions, its Last-Will) and takes over a live connection, and only then refuses a bad
    password: anyone who could reach the port could silence, disconnect or speak (through a
    will) for any client whose id it guessed, and each refused session stayed in memory. Here a
    refused CONNECT gets CONNACK "not authorised" and the connection is closed with no session
    touched. amqtt's `_initialize_client_session` calls ``BrokerProtocolHandler`` from its module,
    so that is the name replaced (once, process-wide; a broker without authentication plugins
    is unaffected: its anonymous plugin answers yes)."""
    import amqtt.broker
    from amqtt.errors import MQTTError
    from amqtt.mqtt.connack import NOT_AUTHORIZED, ConnackPacket
    from amqtt.mqtt.protocol.broker_handler import BrokerProtocolHandler

    if getattr(amqtt.broker.BrokerProtocolHandler, "concord_authenticates_first", False):
        return

    class AuthenticateFirst(BrokerProtocolHandler):  # type: ignore[misc]  # amqtt is untyped
        concord_authenticates_first = True

        @classmethod
        async def init_from_connect(
            cls, reader: Any, writer: Any, plugins_manager: Any, loop: Any = None
        ) -> tuple[Any, Any]:
            handler, session = await super().init_from_connect(
                reader, writer, plugins_manager, loop
            )
            verdicts = await plugins_manager.map_plugin_auth(session=session)
            said = [v for v in (verdicts or {}).values() if v is not None]
            refused = not said or not all(said)
            if not refused and session.username is not None:
                from concord.protos.mqtt import client_id_allowed

                # an authenticated client may use only a client id of its own identity: with
                # another's it would take over that session (disconnect it, publish its will)
                if not client_id_allowed(session.username, session.client_id or ""):
                    refused = True
                    log.warning(
                        "broker.takeover_refused",
                        username=session.username,
                        client_id=session.client_id,
                        problem="the client id does not belong to this username (a session "
                        "takeover attempt: refused at CONNECT, the session of that id is intact)",
                    )
            if refused:
                await ConnackPacket.build(0, NOT_AUTHORIZED).to_stream(writer)
                await writer.close()
                raise MQTTError(f"client {session.client_id!r} refused at CONNECT")
            return handler, session

    amqtt.broker.BrokerProtocolHandler = AuthenticateFirst


def _broker_class(base: Any) -> Any:
    """amqtt's ``Broker`` with a broadcast that survives subscriptions changing under it.

    amqtt 0.12's ``_run_broadcast`` iterates the broker's subscription dict and, for every
    subscriber, awaits the topic plugins (the ACL): a client that subscribes, or a session that
    is taken over or closed (its filters deleted) during that await raises ``RuntimeError:
    dictionary changed size during iteration``, which ends the broker's broadcast loop for good:
    every client stays connected and nobody receives anything any more (seen as an orchestrator
    that dropped every peer for silence). Here each broadcast walks a snapshot of the filters and
    of each filter's subscribers, and skips a subscriber that left meanwhile."""
    global _BROKER
    if _BROKER is not None and _BROKER[0] is base:
        return _BROKER[1]
    from amqtt.contexts import Action

    class SnapshotBroadcastBroker(base):  # type: ignore[misc]  # amqtt is untyped
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            table: dict[str, Any] = self._subscriptions
            self._subscriptions: dict[str, Any] = _SnapshotFilters(table)

        async def _publish_retained_messages_for_subscription(
            self, subscription: tuple[str, int], session: Any
        ) -> None:
            """amqtt 0.12 sends a connecting client the retained messages of *every* filter
            anybody subscribed to, without asking the ACL: a client of one run would receive
            another run's retained schedule and plan. Here each retained message goes only
            where the ACL lets the session read its topic."""
            topic_filter, qos = subscription
            handler = self._get_handler(session)
            if handler is None:
                return
            tasks = []
            for topic, retained in list(self._retained_messages.items()):
                if not self._matches(topic, topic_filter):
                    continue
                # read access to the topic itself (RECEIVE is granted on a checked subscription,
                # and this session never subscribed to the filter)
                if not await self._topic_filtering(session, topic=topic, action=Action.SUBSCRIBE):
                    continue
                level = min(qos, retained.qos or qos)
                publish = handler.mqtt_publish(retained.topic, retained.data, level, retain=True)
                tasks.append(asyncio.ensure_future(publish))
            if tasks:
                await asyncio.wait(tasks)

        async def _run_broadcast(self, running_tasks: Any) -> None:
            broadcast = await self._broadcast_queue.get()
            topic = broadcast["topic"]
            for k_filter, subscriptions in list(self._subscriptions.items()):
                if not self._matches(topic, k_filter):
                    continue
                for target_session, sub_qos in list(subscriptions):
                    qos = broadcast.get("qos", sub_qos)
                    if not await self._topic_filtering(
                        target_session, topic=topic, action=Action.RECEIVE
                    ):
                        continue
                    if (target_session, sub_qos) not in self._subscriptions.get(k_filter, ()):
                        continue  # unsubscribed (or its session closed) during the await
                    connected = target_session.transitions.state == "connected"
                    if (
                        not connected
                        and not target_session.clean_session
                        and qos in (1, 2)
                        and not target_session.is_anonymous
                    ):
                        await self._retain_broadcast_message(broadcast, qos, target_session)
                        continue
                    if not connected:
                        continue
                    handler = self._get_handler(target_session)
                    if handler:
                        running_tasks.append(
                            asyncio.ensure_future(
                                handler.mqtt_publish(topic, broadcast["data"], qos, retain=False)
                            )
                        )

    SnapshotBroadcastBroker.__module__ = __name__
    _BROKER = (base, SnapshotBroadcastBroker)
    return SnapshotBroadcastBroker


class _SnapshotFilters(dict[str, Any]):
    """amqtt's subscription table (filter → subscribers). Iterating it walks a snapshot of its
    filters: amqtt awaits inside ``for topic in self._subscriptions`` (a connecting client's
    retained messages, per filter), and a client subscribing meanwhile raised ``dictionary
    changed size during iteration`` in the connecting client's handler, which then never
    received anything."""

    def __iter__(self) -> Iterator[str]:
        return iter(list(super().keys()))


_BROKER: tuple[Any, Any] | None = None
_PLUGINS: tuple[type, type] | None = None


def __getattr__(name: str) -> Any:
    """amqtt loads plugins by dotted path: ``concord.orchestrator.broker.PasswordFileAuth``."""
    if name in ("PasswordFileAuth", "TopicAcl"):
        return dict(zip(("PasswordFileAuth", "TopicAcl"), _plugins(), strict=True))[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _covers(allowed: str, requested: str) -> bool:
    """Whether the MQTT filter ``allowed`` covers the topic or filter ``requested`` (a ``+`` or
    ``#`` in ``requested`` is covered only by the same or a wider wildcard)."""
    a, r = allowed.split("/"), requested.split("/")
    for i, level in enumerate(a):
        if level == "#":
            return True
        if i >= len(r) or r[i] == "#":
            return False
        if level != "+" and level != r[i]:
            return False
    return len(a) == len(r)


def embedded_broker_secured(orchestrator: Any) -> bool:
    """Whether the embedded broker of an `OrchestratorConfig` asks its clients for credentials
    or TLS (``embedded_broker_passwd`` or ``embedded_broker_cert``): its clients then use the
    ``broker_*`` settings as with an external broker."""
    return bool(orchestrator.embedded_broker_passwd or orchestrator.embedded_broker_cert)


class EmbeddedBroker:
    """``async with EmbeddedBroker() as broker: broker.url`` → ``mqtt://127.0.0.1:<port>``.

    password_file + acl_file (`concord certs broker`'s ``broker/passwd`` and ``broker/acl``):
    only those identities may connect, each publishing only what the ACL allows; without them
    anyone may, so a non-loopback ``host`` is then refused (ConfigError). certfile + keyfile:
    TLS (``mqtts://``; the broker's certificate from `concord certs broker`)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        password_file: str | Path | None = None,
        acl_file: str | Path | None = None,
        certfile: str | Path | None = None,
        keyfile: str | Path | None = None,
    ) -> None:
        if (password_file is None) != (acl_file is None):
            raise _config_error("the embedded broker needs both a password file and an ACL file")
        if (certfile is None) != (keyfile is None):
            raise _config_error("the embedded broker's TLS needs both certfile and keyfile")
        from concord.protos.mqtt import is_loopback

        if password_file is None and not is_loopback(host):
            raise _config_error(
                f"refusing to bind the embedded MQTT broker to {host} without authentication: "
                "anyone reaching it could steer the run; bind 127.0.0.1, or give it the "
                "password and ACL files of `concord certs broker`"
            )
        for what, f in (
            ("password file", password_file),
            ("ACL file", acl_file),
            ("certificate", certfile),
            ("key", keyfile),
        ):
            if f is not None and not Path(f).is_file():
                raise _config_error(f"the embedded broker's {what} {f} is not a file")
        self.host = host
        self.port = port
        self.password_file = password_file
        self.acl_file = acl_file
        self.certfile = certfile
        self.keyfile = keyfile
        self._broker: Any = None

    @classmethod
    def from_config(cls, orchestrator: Any) -> EmbeddedBroker:
        """The embedded broker an `OrchestratorConfig` asks for (``embedded_broker_*``):
        ConfigError naming the key when a file is missing."""
        o = orchestrator
        host, _, port = o.embedded_broker_listen.rpartition(":")
        from concord.protos.mqtt import is_loopback

        if o.embedded_broker_passwd is None and not is_loopback(host.strip("[]")):
            raise ConfigError(
                [
                    (
                        "orchestrator.embedded_broker_listen",
                        f"refusing to bind the embedded MQTT broker to {host} without "
                        "authentication (anyone reaching it could steer the run): give "
                        "embedded_broker_passwd and embedded_broker_acl, or bind 127.0.0.1",
                    )
                ]
            )
        for key in ("passwd", "acl", "cert", "key"):
            f = getattr(o, f"embedded_broker_{key}")
            if f is not None and not Path(f).is_file():
                raise ConfigError([(f"orchestrator.embedded_broker_{key}", f"{f} is not a file")])
        return cls(
            host.strip("[]"),
            int(port),
            password_file=o.embedded_broker_passwd,
            acl_file=o.embedded_broker_acl,
            certfile=o.embedded_broker_cert,
            keyfile=o.embedded_broker_key,
        )

    @property
    def url(self) -> str:
        """Where this machine's clients reach it: a wildcard bind (0.0.0.0, ::) is dialled on
        loopback (the broker certificate of `concord certs broker` names 127.0.0.1), an IPv6
        host in brackets."""
        scheme = "mqtts" if self.certfile is not None else "mqtt"
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{self.port}"

    def _config(self, port: int) -> dict[str, Any]:
        listener: dict[str, Any] = {"type": "tcp", "bind": f"{self.host}:{port}"}
        if self.certfile is not None:
            listener.update(ssl=True, certfile=str(self.certfile), keyfile=str(self.keyfile))
        plugins: dict[str, Any]
        if self.password_file is None:
            plugins = {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
            }
        else:
            _plugins()
            plugins = {
                f"{__name__}.PasswordFileAuth": {
                    "password_file": str(self.password_file),
                    "acl_file": str(self.acl_file),
                },
                f"{__name__}.TopicAcl": {"acl_file": str(self.acl_file)},
            }
        return {"listeners": {"default": listener}, "plugins": plugins}

    async def start(self) -> None:
        """Bind and start amqtt; `BrokerUnavailableError` (an ImportError naming the ``broker``
        extra and the external-broker alternative) when amqtt is not installed."""
        Broker = require_embedded_broker()
        last: Exception | None = None
        for _ in range(_BIND_ATTEMPTS if self.port == 0 else 1):
            port = self.port or free_port(self.host)
            broker = _broker_class(Broker)(self._config(port))
            try:
                await broker.start()
            except Exception as exc:  # amqtt wraps bind errors in its own BrokerError
                last = exc
                continue
            self._broker, self.port = broker, port
            return
        raise OSError(f"embedded MQTT broker could not bind {self.host}: {last}")

    async def stop(self, timeout: float = 3.0) -> None:
        """Shut the broker down, giving up after ``timeout`` seconds: amqtt 0.12's shutdown
        can wait forever on a QoS 1 delivery whose PUBACK it lost track of (it logs "PUBACK
        waiter with Id … already done"), which left the orchestrator hanging after its run."""
        if self._broker is not None:
            broker, self._broker = self._broker, None
            try:
                await asyncio.wait_for(broker.shutdown(), timeout)
            except TimeoutError:
                log.warning("broker.shutdown_timeout", seconds=timeout)
            except Exception as exc:  # shutting down: nothing left to save
                log.warning("broker.shutdown_failed", error=f"{type(exc).__name__}: {exc}")

    async def __aenter__(self) -> EmbeddedBroker:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def mosquitto_binary() -> str | None:
    found = shutil.which("mosquitto")
    if found:
        return found
    return "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").is_file() else None


class MosquittoBroker:
    """A private Mosquitto on a free loopback port (for tests, benchmarks and local runs).

    password_file + acl_file: `concord certs broker`'s ``broker/passwd`` and ``broker/acl``
    (anonymous clients are then refused); tls = (cafile, certfile, keyfile): an ``mqtts://``
    listener with the broker certificate."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        password_file: str | Path | None = None,
        acl_file: str | Path | None = None,
        tls: tuple[str | Path, str | Path, str | Path] | None = None,
    ) -> None:
        binary = mosquitto_binary()
        if binary is None:
            raise FileNotFoundError(
                "mosquitto is not installed (Debian: apt-get install mosquitto mosquitto-clients)"
            )
        self.binary = binary
        self.host = host
        self.port = port
        self.password_file = password_file
        self.acl_file = acl_file
        self.tls = tls
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"

    def _conf(self, port: int) -> str:
        lines = [
            f"listener {port} {self.host}",
            "set_tcp_nodelay true",
            "persistence false",
            "log_type error",
        ]
        if self.password_file or self.acl_file or self.tls:
            # as root, mosquitto would drop to the "mosquitto" user, who cannot read our 0600 files
            lines.append(f"user {getpass.getuser()}")
        if self.password_file is not None:
            from concord.protos.mqtt import MOSQUITTO_CLIENT_ID_BINDING

            lines += [
                "allow_anonymous false",
                f"password_file {Path(self.password_file).resolve()}",
                MOSQUITTO_CLIENT_ID_BINDING,
            ]
        else:
            lines.append("allow_anonymous true")
        if self.acl_file is not None:
            lines.append(f"acl_file {Path(self.acl_file).resolve()}")
        if self.tls is not None:
            ca, cert, key = (Path(f).resolve() for f in self.tls)
            lines += [f"cafile {ca}", f"certfile {cert}", f"keyfile {key}"]
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 10.0) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="concord-mosquitto-")
        conf = Path(self._dir.name) / "mosquitto.conf"
        last_error = ""
        for _ in range(_BIND_ATTEMPTS if self.port == 0 else 1):
            port = self.port or free_port(self.host)
            conf.write_text(self._conf(port))
            proc = subprocess.Popen(
                [self.binary, "-c", str(conf)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and proc.poll() is None:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection((self.host, port), timeout=0.2),
                ):
                    self._proc, self.port = proc, port
                    return
                time.sleep(0.05)
            proc.kill()
            proc.wait(timeout=5)
            if proc.stderr is not None:
                last_error = proc.stderr.read().decode(errors="replace").strip()[-500:]
                proc.stderr.close()
        raise OSError(
            f"mosquitto did not start on {self.host} within {timeout} s"
            + (f": {last_error}" if last_error else "")
        )

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
            if self._proc.stderr is not None:
                self._proc.stderr.close()
            self._proc = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    async def __aenter__(self) -> MosquittoBroker:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)
