"""The sections of the run configuration that say where a run's processes talk: the data plane
(`NetworkConfig`, with its TLS, straggler and torch-plane parts), the control plane
(`OrchestratorConfig`) and the metrics endpoint (`MetricsConfig`). The vectorized engine ignores
them. Torch-free, like the whole config.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from concord.core.config_sections import Section
from concord.core.emulation import Emulation, parse_emulation, problems_text
from concord.errors import ConfigError


def _port(address: str) -> int | None:
    """The port of ``'host:port'``; None when ``address`` does not have that form."""
    host, sep, port = address.rpartition(":")
    return int(port) if sep and host and port.isdigit() else None


def _listen_address(v: str) -> str:
    """``v`` if it is an address to listen on: ``'host:port'``, port 0 for a free one."""
    port = _port(v)
    if port is None or not 0 <= port < 65536:
        raise ValueError(f"{v!r} must be 'host:port' (port 0: a free one)")
    return v


class TLSConfig(Section):
    """mTLS between peers: every path may contain ``{id}``, replaced by the peer id. The same run
    CA signs the control plane: each peer signs its control messages with its key, the
    orchestrator with its own, and every receiver verifies them (``sign_control``)."""

    ca: str
    cert: str
    key: str
    orchestrator_cert: str | None = Field(
        default=None,
        description="certificate the orchestrator signs control messages with (unset: "
        "orchestrator.crt next to ca; `concord certs init` writes it)",
    )
    orchestrator_key: str | None = Field(
        default=None, description="its private key (unset: orchestrator.key next to ca)"
    )
    sign_control: bool = Field(
        default=True,
        description="sign every control message with the sender's key and refuse unsigned, "
        "forged, replayed or stale ones (docs/protocol.md#signed-control-messages)",
    )

    @model_validator(mode="after")
    def _orchestrator_pair(self) -> TLSConfig:
        if (self.orchestrator_cert is None) != (self.orchestrator_key is None):
            raise ValueError(
                "orchestrator_cert and orchestrator_key go together: give both or neither"
            )
        return self


class StragglerConfig(Section):
    """One slow peer, for experiments: after each training step peer ``peer`` sleeps
    (``factor`` − 1) × the CPU time its training thread spent on that step, as if its processor
    were ``factor`` times slower (`concord.peer.pace`). Real peers only: the vectorized
    engine steps every replica in lockstep in one process and ignores it."""

    peer: int = Field(ge=0, description="the slow peer's id (0 … peers − 1)")
    factor: float = Field(
        ge=1.0, le=100.0, description="its computation takes this many times as long (1: no-op)"
    )


class DeviceConfig(Section):
    """Emulated devices of different speeds, for experiments: peer i's training step takes
    ``factors[i]`` × ``step_ms`` milliseconds of wall time — before each step it sleeps that time
    less the CPU time its training thread spent since its previous sleep ended (the step, the
    evaluation after it, the codec work), so eight peers on a host of two cores each run as if on
    a device of its own as long as their CPU stays under the device time (an overrun, recorded:
    `concord.peer.pace.DeviceTime`). Real peers only: the vectorized engine ignores it."""

    step_ms: float = Field(
        gt=0, le=60000.0, description="the base device's time per training step (milliseconds)"
    )
    factors: list[float] = Field(
        min_length=1,
        description="one per peer: how many times slower than the base device it computes (≥ 1)",
    )

    @field_validator("factors")
    @classmethod
    def _factors(cls, v: list[float]) -> list[float]:
        bad = [f for f in v if not 1.0 <= f <= 100.0]
        if bad:
            raise ValueError(f"every factor must be in 1 … 100; got {bad}")
        return v


class TorchPlaneConfig(Section):
    """``network.transport = "torch"``: the tensors of gossip, all-reduce and per-edge messages
    move with torch.distributed point-to-point operations (`concord.peer.torch_plane`); the
    control plane stays MQTT. A fixed world: no rejoin, a crashed peer ends the run
    (docs/deployment.md#torch-data-plane)."""

    backend: Literal["auto", "gloo", "nccl"] = Field(
        default="auto", description="'auto': NCCL when the peer's device is a GPU, else gloo"
    )
    init: str = Field(
        default="auto",
        description="rendezvous: 'orchestrator' (a TCPStore the orchestrator hosts and announces "
        "in the plan), 'env' (env:// — MASTER_ADDR/MASTER_PORT, as torchrun sets them), "
        "'tcp://HOST:PORT' (peer 0 hosts the store there) or 'auto' (env under torchrun, else "
        "orchestrator)",
    )
    store_host: str | None = Field(
        default=None,
        description="the host peers reach the orchestrator's store at (default: the broker's host)",
    )
    store_port: int = Field(
        default=0, ge=0, lt=65536, description="the orchestrator's store port (0: any free port)"
    )
    timeout: float = Field(
        default=300.0,
        gt=0,
        description="seconds the rendezvous and every torch.distributed operation may take "
        "before the run fails",
    )

    @field_validator("init")
    @classmethod
    def _init(cls, v: str) -> str:
        if v in ("auto", "orchestrator", "env"):
            return v
        host, sep, port = v.removeprefix("tcp://").rpartition(":")
        if not v.startswith("tcp://") or not sep or not host or not port.isdigit():
            raise ValueError(
                f"network.torch.init = {v!r}; expected 'auto', 'orchestrator', 'env' or "
                "'tcp://HOST:PORT'"
            )
        return v


class NetworkConfig(Section):
    """The data plane of real peers (ignored by the vectorized engine)."""

    transport: Literal["grpc", "torch"] = Field(
        default="grpc",
        description="'grpc': Concord's own streams (validated frames, rejoin, TLS); 'torch': "
        "torch.distributed gloo/NCCL point-to-point for a fixed world (network.torch)",
    )
    torch: TorchPlaneConfig = Field(
        default_factory=TorchPlaneConfig,
        description="transport = 'torch': backend, rendezvous and timeout of the process group",
    )

    addresses: list[str] | None = Field(
        default=None, description="static mode: peer i listens at addresses[i] ('host:port')"
    )
    deadline: float = Field(default=10.0, gt=0, description="seconds a round waits per edge")
    skip_after: int = Field(
        default=3,
        ge=1,
        description="consecutive rounds a neighbour may miss before it is skipped (not waited "
        "for, its tensor mixed only if already here) until a tensor of it arrives in time again",
    )
    rejoin_fetch_after: int = Field(
        default=10,
        ge=0,
        description="a restarted static peer whose checkpoint (or none) is more than this many "
        "steps behind its neighbours adopts a neighbour's parameters and step (Fetch)",
    )
    startup_timeout: float = Field(
        default=60.0, gt=0, description="seconds a peer waits for its neighbours at start"
    )
    chunk_bytes: int = Field(default=4 << 20, ge=1024, le=4 << 20)
    max_tensor_bytes: int = Field(default=1 << 30, ge=1024)
    max_abs_value: float | None = Field(
        default=None,
        gt=0,
        description="refuse a received tensor holding a value of larger magnitude (None: no bound)",
    )
    stream_idle_timeout: float = Field(
        default=60.0,
        gt=0,
        description="seconds a received stream may stay silent before the receiver closes it",
    )
    tls: TLSConfig | None = None
    insecure: bool = Field(
        default=False,
        description="accept an open network without protection: a data plane listening beyond "
        "loopback without tls, or a broker beyond loopback with neither credentials nor signed "
        "control (refused otherwise; warned once on stderr and in log.jsonl); the commands' "
        "--insecure",
    )
    straggler: StragglerConfig | None = Field(
        default=None,
        description="slow one peer's computation down by a factor, e.g. {peer = 3, factor = 2.0}",
    )
    device: DeviceConfig | None = Field(
        default=None,
        description="emulated per-peer devices: step i takes factors[i] × step_ms of wall time, "
        "e.g. {step_ms = 40, factors = [1, 1, 2, 6]} (one factor per peer)",
    )
    emulation: dict[str, Any] | None = Field(
        default=None,
        description="emulated links for `concord sim --engine processes` (every process in a "
        "network namespace of its own): a named profile and/or per-link delay_ms, jitter_ms, "
        "loss, loss_burst, rate_mbit, up/down and per-peer tables, e.g. {profile = 'edge'}; "
        "`concord sim --net` sets it (docs/network-emulation.md)",
    )

    @field_validator("emulation")
    @classmethod
    def _emulation(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            try:
                parse_emulation(v)
            except ConfigError as exc:
                raise ValueError(problems_text(exc)) from None
        return v

    def link_emulation(self) -> Emulation | None:
        """The `Emulation` ``emulation`` describes (None: the run's links are not emulated)."""
        return None if self.emulation is None else parse_emulation(self.emulation)

    @field_validator("addresses")
    @classmethod
    def _addresses(cls, v: list[str] | None) -> list[str] | None:
        for i, a in enumerate(v or []):
            port = _port(a)
            if port is None or not 0 < port < 65536:
                raise ValueError(f"addresses[{i}] = {a!r}; expected 'host:port'")
        return v


class OrchestratorConfig(Section):
    """The control plane of real peers (MQTT): where the broker is and how liveness and decisions
    are timed (ignored by the vectorized engine)."""

    broker: str | None = Field(
        default=None,
        description="mqtt://HOST:PORT of the broker; unset: the orchestrator embeds one",
    )
    heartbeat: float = Field(default=1.0, gt=0, description="seconds between peer heartbeats")
    liveness_timeout: float = Field(
        default=6.0, gt=0, description="a peer silent this long is dropped from the schedule"
    )
    decision_timeout: float = Field(
        default=10.0,
        gt=0,
        description="seconds a round waits for all statistics (orchestrator) or a decision (peer)",
    )
    absent_timeout: float = Field(
        default=120.0,
        gt=0,
        description="seconds a peer waits for an absent orchestrator (before start, between "
        "stages or mid-stage: presence offline or never seen) before it gives up (exit 1)",
    )
    broker_lost_timeout: float = Field(
        default=120.0,
        gt=0,
        description="seconds the orchestrator and the peers keep reconnecting to a lost broker "
        "before they give up (exit 1)",
    )

    broker_username: str | None = Field(
        default=None,
        description="username at the broker; '{identity}' becomes orchestrator, peer-<id>, "
        "monitor or observer (`concord certs broker` issues those identities)",
    )
    broker_password_file: str | None = Field(
        default=None,
        description="file holding the broker password ('{identity}' expanded, e.g. "
        "certs/broker/{identity}.password); never put a password in the URL",
    )
    broker_password_env: str | None = Field(
        default=None,
        description="environment variable holding the broker password ('{identity}' becomes "
        "ORCHESTRATOR, PEER_<id>, MONITOR or OBSERVER); instead of broker_password_file",
    )
    broker_ca: str | None = Field(
        default=None,
        description="CA certificate that verifies an mqtts:// broker (unset: the system store)",
    )
    broker_cert: str | None = Field(
        default=None, description="client certificate for mqtts:// ('{identity}' expanded)"
    )
    broker_key: str | None = Field(
        default=None, description="its private key, with broker_cert ('{identity}' expanded)"
    )
    embedded_broker_listen: str = Field(
        default="127.0.0.1:0",
        description="host:port the embedded broker (no broker set) listens on; port 0: a free "
        "one. Beyond loopback only with embedded_broker_passwd",
    )
    embedded_broker_passwd: str | None = Field(
        default=None,
        description="Mosquitto password file the embedded broker enforces (`concord certs "
        "broker`: certs/broker/passwd); with embedded_broker_acl",
    )
    embedded_broker_acl: str | None = Field(
        default=None,
        description="Mosquitto ACL file the embedded broker enforces (certs/broker/acl)",
    )
    embedded_broker_cert: str | None = Field(
        default=None,
        description="TLS certificate of the embedded broker: it then speaks mqtts:// only "
        "(certs/broker.crt; clients verify it with broker_ca)",
    )
    embedded_broker_key: str | None = Field(
        default=None, description="its private key, with embedded_broker_cert (certs/broker.key)"
    )

    @field_validator("broker")
    @classmethod
    def _broker(cls, v: str | None) -> str | None:
        if v is not None:  # the full check (`concord.protos.mqtt.connection`) runs at connect
            scheme, sep, rest = v.partition("://")
            userinfo, at, hostport = rest.rpartition("@")
            if at and ":" in userinfo:
                raise ValueError(
                    "the broker URL carries a password: never put it in the URL; use "
                    "orchestrator.broker_password_file or broker_password_env"
                )
            default = "8883" if scheme == "mqtts" else "1883"
            host, _, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", default)
            if scheme not in ("mqtt", "mqtts") or not sep or not host or not port.isdigit():
                raise ValueError(f"broker {v!r} must look like mqtt[s]://[USER@]HOST[:PORT]")
        return v

    @model_validator(mode="after")
    def _liveness(self) -> OrchestratorConfig:
        if self.liveness_timeout <= 2 * self.heartbeat:
            raise ValueError(
                f"liveness_timeout ({self.liveness_timeout} s) must exceed two heartbeats "
                f"({2 * self.heartbeat} s)"
            )
        return self

    @field_validator("embedded_broker_listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        return _listen_address(v)

    @model_validator(mode="after")
    def _embedded_broker(self) -> OrchestratorConfig:
        pairs = (
            ("embedded_broker_passwd", "embedded_broker_acl"),
            ("embedded_broker_cert", "embedded_broker_key"),
        )
        for a, b in pairs:
            if (getattr(self, a) is None) != (getattr(self, b) is None):
                raise ValueError(f"{a} and {b} go together: give both or neither")
        return self


class MetricsConfig(Section):
    """A Prometheus endpoint on the orchestrator and every peer (docs/deployment.md#metrics);
    ignored by the vectorized engine."""

    listen: str | None = Field(
        default=None,
        description="'host:port' serving GET /metrics (Prometheus text format); port 0: a free "
        "one (written to telemetry.json in the process's run directory). `concord sim`: the "
        "orchestrator takes port, peer i port + 1 + i. Unset: no endpoint",
    )

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str | None) -> str | None:
        return None if v is None else _listen_address(v)
