"""Secure by default where it matters: a process that would expose a run on an open network
refuses to start unless the user accepts the risk.

Refused (`ConfigError` naming ``network.insecure``) unless ``network.insecure = true`` (the
commands' ``--insecure``):

* binding the gRPC data plane to an address that is not loopback (``0.0.0.0``, a host name, a
  LAN address) without ``[network.tls]`` — plaintext tensors anyone on the network may send to,
  fetch from or read;
* connecting to an MQTT broker that is not on loopback with neither broker credentials (a
  username) nor signed control messages (``[network.tls]`` with ``sign_control``) — anyone who
  reaches the broker could then steer the run.

With ``network.insecure = true`` each problem is warned about once per process, on stderr and in
the structured log (``network.insecure``). The messages say how to turn the protection on
(which ``concord certs`` commands and settings) and how to accept the risk. This module is
torch-free (the orchestrator imports it).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any

import structlog

from concord.errors import ConfigError
from concord.protos.mqtt import BrokerAddress, is_loopback

log = structlog.get_logger("concord.protos.exposure")

TLS_HOWTO = (
    "turn TLS on: `concord certs init --dir certs --run-id RUN`, `concord certs issue --dir "
    "certs --peer I --host HOST` for every peer, then [network.tls] ca, cert and key in the "
    "config (docs/deployment.md#mtls-certificates)"
)
BROKER_HOWTO = (
    "give the broker identities (`concord certs broker --dir certs --run-id RUN --peers N`, "
    "orchestrator.broker_username and broker_password_file, an mqtts:// URL) or sign the "
    "control messages ([network.tls] with sign_control = true; docs/deployment.md"
    "#broker-credentials-and-acls)"
)
ACCEPT = "or, inside a network you trust, accept the risk with --insecure (network.insecure = true)"


@dataclass(frozen=True)
class Exposure:
    """What a process is about to open: its gRPC ``listen`` address (None: none), whether the
    data plane has ``tls``, the ``broker`` URL it connects to (None: none), whether it has broker
    ``credentials`` and ``signing``."""

    listen: str | None = None
    tls: bool = False
    broker: str | None = None
    credentials: bool = False
    signing: bool = False

    def problems(self) -> list[str]:
        out: list[str] = []
        if self.listen is not None and not self.tls:
            host = listen_host(self.listen)
            if not is_loopback(host):
                out.append(
                    f"the data plane would listen on {self.listen} (not loopback) without TLS: "
                    f"anyone reaching it could send tensors, fetch parameters or read them; "
                    f"{TLS_HOWTO}"
                )
        if self.broker is not None and not (self.credentials or self.signing):
            try:
                host = BrokerAddress.parse(self.broker).host
            except ValueError:
                host = ""  # the Bus says what is wrong with the URL
            if host and not is_loopback(host):
                out.append(
                    f"the MQTT broker {self.broker} is not on loopback and this process has "
                    f"neither broker credentials nor signed control messages: anyone reaching "
                    f"the broker could steer the run; {BROKER_HOWTO}"
                )
        return out


def exposure_of(cfg: Any, *, listen: str | None, broker: str | None) -> Exposure:
    """The `Exposure` of a process of the run config ``cfg`` (a `concord.core.config.RunConfig`)
    that listens at ``listen`` and connects to ``broker`` (None: no data plane, no broker)."""
    tls = cfg.network.tls
    credentials = cfg.orchestrator.broker_username is not None
    if broker is not None and not credentials:
        with contextlib.suppress(ValueError):
            credentials = BrokerAddress.parse(broker).username is not None
    return Exposure(
        listen=listen,
        tls=tls is not None,
        broker=broker,
        credentials=credentials,
        signing=tls is not None and bool(tls.sign_control),
    )


def listen_host(listen: str) -> str:
    """The host of a ``HOST:PORT`` bind address (``[::]:50051`` → ``::``; ``:50051`` and a bare
    port → ``0.0.0.0``: every interface)."""
    host, sep, _ = listen.rpartition(":")
    if not sep:
        return "0.0.0.0"
    host = host.strip("[]")
    return host or "0.0.0.0"


_WARNED: set[str] = set()


def check_exposure(
    exposure: Exposure, *, insecure: bool, role: str, warn: bool = True
) -> list[str]:
    """Refuse (`ConfigError` on ``network.insecure``) what `Exposure.problems` finds, unless
    ``insecure``: then (with ``warn``) warn once per problem and process, on stderr and in the
    structured log, and return the problems. Call it with ``warn=False`` before anything is
    written (to refuse early), and again once the process's log.jsonl is open."""
    problems = exposure.problems()
    if not problems or (insecure and not warn):
        return problems
    if not insecure:
        raise ConfigError(
            [
                (
                    "network.insecure",
                    f"refusing to start the {role}: {p}; {ACCEPT}",
                )
                for p in problems
            ]
        )
    for p in problems:
        if p in _WARNED:
            continue
        _WARNED.add(p)
        log.warning("network.insecure", role=role, problem=p)
        sys.stderr.write(f"concord {role}: WARNING (network.insecure = true): {p}\n")
    return problems
