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
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog

from concord.errors import OrchestratorError

log = structlog.get_logger("concord.orchestrator.broker")

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


class EmbeddedBroker:
    """``async with EmbeddedBroker() as broker: broker.url`` → ``mqtt://127.0.0.1:<port>``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self._broker: Any = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def _config(self, port: int) -> dict[str, Any]:
        return {
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{port}"}},
            "plugins": {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
            },
        }

    async def start(self) -> None:
        """Bind and start amqtt; `BrokerUnavailableError` (an ImportError naming the ``broker``
        extra and the external-broker alternative) when amqtt is not installed."""
        Broker = require_embedded_broker()
        last: Exception | None = None
        for _ in range(_BIND_ATTEMPTS if self.port == 0 else 1):
            port = self.port or free_port(self.host)
            broker = Broker(self._config(port))
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
    """A private Mosquitto on a free loopback port (for tests, benchmarks and local runs)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        binary = mosquitto_binary()
        if binary is None:
            raise FileNotFoundError(
                "mosquitto is not installed (Debian: apt-get install mosquitto mosquitto-clients)"
            )
        self.binary = binary
        self.host = host
        self.port = port
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="concord-mosquitto-")
        conf = Path(self._dir.name) / "mosquitto.conf"
        for _ in range(_BIND_ATTEMPTS if self.port == 0 else 1):
            port = self.port or free_port(self.host)
            conf.write_text(
                f"listener {port} {self.host}\nallow_anonymous true\nset_tcp_nodelay true\n"
                "persistence false\nlog_type error\n"
            )
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
        raise OSError(f"mosquitto did not start on {self.host} within {timeout} s")

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
