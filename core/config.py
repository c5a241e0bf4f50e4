"""Run configuration: one frozen, validated object built from defaults → TOML file → ``CONCORD_*``
environment → command-line ``--set key=value`` overrides.

Validation reports *every* problem at once, each with its dotted key, so a user fixes a config in
one go. This module is torch-free: the orchestrator validates the same config.

Names accepted here (algorithms, datasets, models, partitions, topologies) are the public names of
the registries in `core`; ``tests/core/test_config.py`` checks both lists agree. What an algorithm
admits (codecs, consensus control, directed or time-varying topologies, ...) is read from its
traits in the torch-free catalog (`concord.core.algorithms.catalog`), not from lists of names.
"""

from __future__ import annotations

import itertools
import os
import tomllib
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from concord.core.algorithms.catalog import (
    CAST_CODECS,
    CATALOG,
    AlgorithmSpec,
    overlap_algorithms,
    spec_of,
)
from concord.core.graphs.graph import TopologyError
from concord.core.graphs.topology import build_graph, exponential_k, topology_spec
from concord.core.graphs.trees import relay_trees
from concord.core.plugins import PluginError, is_spec
from concord.core.specs import (
    CODEC_SPECS,
    DATASET_SPECS,
    MODEL_SPECS,
    PARTITIONER_SPECS,
    TOPOLOGY_SPECS,
    SpecTable,
    TopologySpec,
)
from concord.core.suggest import closest
from concord.errors import ConfigError as ConfigError

# The built-in names of each kind. Validators ask the spec tables (`concord.core.specs`), which
# also hold the names registered at run time; ``module:Name`` plug-ins are accepted besides.
ALGORITHM_NAMES: tuple[str, ...] = tuple(CATALOG)  # every algorithm of the catalog, in its order
DATASET_NAMES: tuple[str, ...] = tuple(DATASET_SPECS)
MODEL_NAMES: tuple[str, ...] = tuple(MODEL_SPECS)
PARTITION_NAMES: tuple[str, ...] = tuple(PARTITIONER_SPECS)
TOPOLOGY_NAMES: tuple[str, ...] = tuple(TOPOLOGY_SPECS)
ENGINE_NAMES: tuple[str, ...] = ("vectorized", "processes")
PLAN_PRESETS = "'gossip', 'exact', 'dec-phase-K', or a list of per-phase modes"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _known(table: SpecTable[Any], kind: str, v: str) -> str:
    """``v`` if ``table`` declares it or it is a ``module:callable`` plug-in (imported where it
    is used, not here: the orchestrator does not import a user's torch code)."""
    if v not in table and not is_spec(v):
        raise ValueError(_unknown(kind, v, table.names(), "module:callable"))
    return v


class DatasetConfig(_Section):
    name: str = Field(
        default="mnist1d",
        description="a built-in dataset or 'module:callable' (a dataset plug-in, docs/api.md)",
    )
    samples: int | None = Field(default=None, gt=0, description="generated datasets: total samples")
    root: str | None = Field(default=None, description="directory of on-disk datasets (cifar10)")
    test_samples: int | None = Field(
        default=None, gt=0, description="evaluate on at most this many"
    )
    augment: bool = False
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        return _known(DATASET_SPECS, "dataset", v)


class PartitionConfig(_Section):
    scheme: str = "iid"
    alpha: float = Field(default=1.0, gt=0, description="Dirichlet concentration")
    shuffled_fraction: float = Field(default=0.0, ge=0, le=1, description="'sorted' scheme")
    shards_per_peer: int = Field(default=2, ge=1)
    exponent: float = Field(
        default=1.0, ge=0, le=10, description="'powerlaw' scheme: sizes ∝ (rank + 1)^−exponent"
    )
    options: dict[str, Any] = Field(default_factory=dict, description="passed to user code")

    @field_validator("scheme")
    @classmethod
    def _known(cls, v: str) -> str:
        return _known(PARTITIONER_SPECS, "partition scheme", v)


class ModelConfig(_Section):
    name: str = "cnn1d"
    width: int | None = Field(default=None, gt=0)
    norm: Literal["bn", "gn"] | None = None
    hidden: list[int] | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        return _known(MODEL_SPECS, "model", v)

    def build_options(self) -> dict[str, Any]:
        opts = dict(self.options)
        for key in ("width", "norm", "hidden"):
            value = getattr(self, key)
            if value is not None:
                opts[key] = value
        return opts


class OptimConfig(_Section):
    lr: float = Field(default=0.1, gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    nesterov: bool = True
    weight_decay: float = Field(default=1e-4, ge=0)
    batch_size: int = Field(default=16, ge=1, description="local (per-peer) batch size")
    warmup: float = Field(default=0.05, ge=0, lt=1, description="fraction of training")
    warmup_from: float = Field(default=0.0, ge=0, le=1, description="warm-up starts at this × lr")
    milestones: list[float] = Field(default_factory=lambda: [0.5, 0.75])
    gamma: float = Field(default=0.1, gt=0, le=1)
    clip_norm: float | None = Field(
        default=None,
        gt=0,
        description="clip each replica's stochastic gradient to this L2 norm before the optimizer "
        "(unset: no clipping)",
    )

    @field_validator("milestones")
    @classmethod
    def _increasing(cls, v: list[float]) -> list[float]:
        if any(not 0 < m < 1 for m in v):
            raise ValueError(f"milestones are fractions of training in (0, 1); got {v}")
        if any(b <= a for a, b in itertools.pairwise(v)):
            raise ValueError(f"milestones must be strictly increasing; got {v}")
        return v


class ControlSection(_Section):
    """Consensus control. The default (adaptive control of phase 1, Kong et al.'s practical
    guideline) applies to gossip algorithms only; it is silently inert for all-reduce, local SGD,
    DeTAG/DSGT (their own rounds) and exact-averaging phases. A ``mode`` set explicitly is checked
    against the plan. ``mode = "fixed"`` is not consensus control: every step of the controlled
    phases runs exactly ``rounds`` gossip rounds (equal-budget comparisons)."""

    mode: Literal["none", "constant", "adaptive", "fixed"] = "adaptive"
    factor: float = Field(default=0.25, gt=0)
    phases: list[int] = Field(default_factory=lambda: [1], description="controlled phases, 1-based")
    max_rounds: int = Field(default=20, ge=1)
    lagged: bool = False
    lag: int = Field(
        default=1,
        ge=1,
        description="lagged mode: rounds of step t from the statistics of step t − lag",
    )
    ema: float = Field(default=0.9, ge=0, lt=1)
    statistic: Literal["theta", "xi"] = "theta"
    rounds: int = Field(
        default=1,
        ge=1,
        description="mode `fixed`: the gossip rounds every step of a controlled phase runs, "
        "whatever the statistic (≤ `max_rounds`; must stay 1 with the other modes)",
    )

    @model_validator(mode="after")
    def _lag_needs_lagged(self) -> ControlSection:
        if self.lag != 1 and not self.lagged:
            raise ValueError(
                f"lag = {self.lag} only applies to lagged control; set lagged = true (the barrier "
                "protocol decides every round of the current step)"
            )
        return self

    @model_validator(mode="after")
    def _rounds_need_fixed(self) -> ControlSection:
        if self.rounds != 1 and self.mode != "fixed":
            raise ValueError(
                f"rounds = {self.rounds} only applies to mode = 'fixed' (mode {self.mode!r} "
                "decides the rounds of a step from the consensus statistic); set mode = 'fixed' "
                "or leave rounds unset"
            )
        if self.rounds > self.max_rounds:
            raise ValueError(
                f"rounds = {self.rounds} exceeds max_rounds = {self.max_rounds}, the bound on "
                "gossip rounds per step; raise max_rounds"
            )
        return self


# the built-in codecs (`concord.core.specs.CODEC_SPECS`; `concord.core.compress` implements them)
CODEC_NAMES: tuple[str, ...] = tuple(CODEC_SPECS)


class CompressionConfig(_Section):
    """What travels on gossip edges. Lossless-enough casts (fp16, bf16) can be used by any gossip
    algorithm; lossy codecs need error feedback, i.e. the ``choco`` algorithm."""

    codec: str = "none"
    ratio: float = Field(default=0.01, gt=0, le=1, description="fraction kept by topk/randomk")
    gamma: float = Field(default=1.0, gt=0, le=1, description="CHOCO consensus step size γ")
    levels: int = Field(
        default=16,
        ge=1,
        le=32767,
        description="qsgd quantisation levels s (16 = the CHOCO '4-bit'; int8 on the wire up to "
        "127, int16 above)",
    )
    unbiased: bool = Field(
        default=False,
        description="qsgd: drop CHOCO's variance-reducing factor 1/(1 + min(d/s², √d/s)) "
        "(unbiased, E Q(x) = x)",
    )

    @field_validator("codec")
    @classmethod
    def _known(cls, v: str) -> str:
        return _known(CODEC_SPECS, "codec", v)


class TLSConfig(_Section):
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


class StragglerConfig(_Section):
    """One slow peer, for experiments: after each training step peer ``peer`` sleeps
    (``factor`` − 1) × the CPU time its training thread spent on that step, as if its processor
    were ``factor`` times slower (`concord.peer.pace`). Real peers only: the vectorized
    engine steps every replica in lockstep in one process and ignores it."""

    peer: int = Field(ge=0, description="the slow peer's id (0 … peers − 1)")
    factor: float = Field(
        ge=1.0, le=100.0, description="its computation takes this many times as long (1: no-op)"
    )


class TorchPlaneConfig(_Section):
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


class NetworkConfig(_Section):
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
    chunk_bytes: int = Field(default=1 << 20, ge=1024, le=4 << 20)
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

    @field_validator("addresses")
    @classmethod
    def _addresses(cls, v: list[str] | None) -> list[str] | None:
        for i, a in enumerate(v or []):
            host, sep, port = a.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"addresses[{i}] = {a!r}; expected 'host:port'")
        return v


class OrchestratorConfig(_Section):
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
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError(f"{v!r} must be 'host:port' (port 0: a free one)")
        return v

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


class EvalConfig(_Section):
    """The averaged model is evaluated on the whole test set every ``every`` epochs; every replica
    too when ``peers`` (on the first ``peer_samples`` test samples, which keeps n-replica
    evaluation cheap); the final evaluation always covers every replica on the whole test set."""

    every: float = Field(default=1.0, gt=0, description="evaluate every this many epochs")
    peers: bool = True
    peer_samples: int | None = Field(default=1000, gt=0)


class MetricsConfig(_Section):
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
        if v is not None:
            host, sep, port = v.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
                raise ValueError(f"{v!r} must be 'host:port' (port 0: a free one)")
        return v


class RunConfig(_Section):
    """Everything a run needs. Top-level keys mirror the paper's experimental knobs."""

    name: str | None = None
    peers: int = Field(default=8, ge=1, le=4096)
    topology: str = "ring"
    weights: Literal["metropolis", "uniform", "pairwise"] | None = None
    kappa: float = Field(default=1.0, gt=0, le=1)
    algorithm: str = "dsgd"
    hyper: dict[str, Any] = Field(
        default_factory=dict,
        description="the algorithm's own hyperparameters (checked by the algorithm, by name)",
    )
    overlap: bool = Field(
        default=False,
        description="overlap communication with computation: each step gossips x_t while its "
        "gradient is computed, x_{t+1} = W x_t − η·u(∇f(x_t)) (combine-then-adapt, Lian et al. "
        "2017; docs/algorithms.md#overlap). Admitted by "
        + ", ".join(f"`{n}`" for n in overlap_algorithms()),
    )
    plan: str | list[Literal["exact", "gossip"]] = "gossip"
    phase_topologies: list[str | None] | None = None
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    control: ControlSection = Field(default_factory=ControlSection)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    compression: CompressionConfig = Field(default_factory=CompressionConfig)
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    orchestrator: OrchestratorConfig = Field(default_factory=OrchestratorConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    epochs: float = Field(default=30.0, gt=0)
    seed: int = Field(default=0, ge=0)
    engine: Literal["vectorized", "processes"] = "processes"
    device: str = "auto"
    threads: int | None = Field(default=None, ge=1)
    tensorboard: bool = Field(
        default=False,
        description="also write TensorBoard event files to `<run dir>/tensorboard` "
        "(`pip install 'concord[tensorboard]'`)",
    )

    @field_validator("dataset", "model", mode="before")
    @classmethod
    def _name_shorthand(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v

    @field_validator("partition", mode="before")
    @classmethod
    def _scheme_shorthand(cls, v: Any) -> Any:
        return {"scheme": v} if isinstance(v, str) else v

    @field_validator("topology")
    @classmethod
    def _topology(cls, v: str) -> str:
        return _check_topology(v)

    @field_validator("phase_topologies")
    @classmethod
    def _phase_topologies(cls, v: list[str | None] | None) -> list[str | None] | None:
        if v is not None:
            for t in v:
                if t is not None:
                    _check_topology(t)
        return v

    @field_validator("algorithm")
    @classmethod
    def _algorithm(cls, v: str) -> str:
        if v in CATALOG:
            return v
        if not is_spec(v):
            raise ValueError(_unknown("algorithm", v, ALGORITHM_NAMES, "module:Class"))
        spec_of(v)  # a plug-in: its spec is read now (PluginError says what is wrong)
        return v

    @field_validator("plan")
    @classmethod
    def _plan(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, str) and v not in ("gossip", "exact"):
            rest = v.removeprefix("dec-phase-")
            if rest == v or not rest.isdigit() or int(rest) < 1:
                raise ValueError(f"unknown plan {v!r}; valid: {PLAN_PRESETS}")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v in ("auto", "cpu", "cuda") or (v.startswith("cuda:") and v[5:].isdigit()):
            return v
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N'; got {v!r}")

    @property
    def spec(self) -> AlgorithmSpec:
        """The catalog entry of ``algorithm``: its traits (`concord.core.algorithms.catalog`)."""
        return spec_of(self.algorithm)

    @model_validator(mode="after")
    def _cross(self) -> RunConfig:
        problems: list[str] = []
        spec = self.spec
        n_phases = len(self.optim.milestones) + 1
        modes = self.phase_modes()
        if isinstance(self.plan, list) and len(self.plan) != n_phases:
            problems.append(
                f"plan lists {len(self.plan)} phase modes but optim.milestones make "
                f"{n_phases} phases"
            )
        if isinstance(self.plan, str) and self.plan.startswith("dec-phase-"):
            k = int(self.plan.removeprefix("dec-phase-"))
            if k > n_phases:
                problems.append(f"plan {self.plan!r}: there are only {n_phases} phases")
        if self.phase_topologies is not None and len(self.phase_topologies) != n_phases:
            problems.append(
                f"phase_topologies lists {len(self.phase_topologies)} entries for {n_phases} phases"
            )
        if self.control.mode != "none" and "mode" in self.control.model_fields_set:
            for k in self.control.phases:
                if not 1 <= k <= n_phases:
                    problems.append(f"control.phases: phase {k} does not exist (1..{n_phases})")
                elif modes[k - 1] == "exact":
                    what = (
                        "a fixed number of gossip rounds"
                        if self.control.mode == "fixed"
                        else "consensus control"
                    )
                    problems.append(
                        f"control.phases: phase {k} uses exact averaging under plan "
                        f"{self.plan!r}; {what} needs a gossip phase"
                    )
            if spec.uncontrolled is not None:
                fixed = (
                    "; mode 'fixed' does not apply either (it sets the gossip rounds per step)"
                    if self.control.mode == "fixed"
                    else ""
                )
                problems.append(f"control.mode: {spec.uncontrolled}{fixed}")
            elif (
                self.control.mode == "fixed" and self.control.rounds > 1 and not spec.repeats_rounds
            ):
                problems.append(_single_round_problem(self.algorithm, self.control.rounds))
            elif self.control.lagged and not spec.lagged_control:
                problems.append(
                    f"control.lagged: algorithm {self.algorithm!r} needs the per-round barrier "
                    "protocol (lagged = false)"
                )
            if self.control.statistic == "xi" and self.engine == "processes":
                problems.append(
                    "control.statistic 'xi' (exact consensus distance) is only known in the "
                    "vectorized engine; real peers control on the estimator 'theta'"
                )
        codec = self.compression.codec
        if not spec.admits(codec) and codec not in CAST_CODECS:
            feedback = [n for n, s in CATALOG.items() if s.admits(codec)]
            problems.append(
                f"compression.codec {codec!r} is lossy and needs error feedback: use "
                f"{' or '.join(f'algorithm = {n!r}' for n in feedback)} (plain gossip accepts "
                f"{', '.join(map(repr, CAST_CODECS))})"
            )
        if not spec.admits(codec) and spec.codecs == "raw" and not spec.gossip:  # all-reduce
            problems.append(
                f"compression.codec {codec!r} applies to gossip algorithms; {spec.title} sends "
                "raw float32 (use 'none')"
            )
        if spec.static_topology is not None and not spec.relay_tree:  # relays: see below
            used = [self.topology, *(t for t in self.phase_topologies or () if t)]
            varying = [t for t in used if _traits(t).time_varying]
            if varying:
                problems.append(_time_varying_problem(varying[0], spec))
        if self.overlap and not spec.overlap:
            problems.append(
                f"overlap: algorithm {self.algorithm!r} does not admit overlap — what {spec.title} "
                "sends at step t is computed from that step's gradient, so its exchange cannot "
                "start before the gradient; overlap = true applies to "
                f"{', '.join(map(repr, overlap_algorithms()))}"
            )
        problems.extend(_relay_and_push_problems(self))
        problems.extend(_exponential_problems(self))
        if spec.adaptive_graph is not None:
            problems.extend(_ada_problems(self, n_phases))
        else:
            problems.extend(spec.check_hyper(self.hyper, self.peers, n_phases))
        addresses = self.network.addresses
        if addresses is not None and len(addresses) != self.peers:
            problems.append(
                f"network.addresses lists {len(addresses)} addresses for {self.peers} peers"
            )
        straggler = self.network.straggler
        if straggler is not None and straggler.peer >= self.peers:
            problems.append(
                f"network.straggler.peer = {straggler.peer} names no peer: ids are "
                f"0 … {self.peers - 1}"
            )
        if self.network.transport == "torch" and spec.adaptive_graph == "feedback":
            problems.append(
                "network.transport = 'torch' needs every peer to run the same rounds; algorithm "
                "'ada-feedback' moves each peer's graph by the orchestrator's decisions, with a "
                "per-peer fallback when one is late — use transport = 'grpc' or ada-schedule"
            )
        if self.network.transport == "torch" and self.network.tls is not None:
            problems.append(
                "network.tls secures the gRPC data plane; network.transport = 'torch' sends "
                "gloo/NCCL traffic unencrypted — use it inside a trusted cluster network and "
                "unset network.tls, or keep transport = 'grpc'"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def phase_modes(self) -> list[str]:
        n_phases = len(self.optim.milestones) + 1
        if isinstance(self.plan, list):
            return [str(m) for m in self.plan] + ["gossip"] * max(0, n_phases - len(self.plan))
        if self.plan in ("gossip", "exact"):
            return [self.plan] * n_phases
        k = int(self.plan.removeprefix("dec-phase-"))
        return ["gossip" if i + 1 == k else "exact" for i in range(n_phases)]

    def plan_label(self) -> str:
        return self.plan if isinstance(self.plan, str) else ",".join(self.plan)

    def to_dict(self) -> dict[str, Any]:
        """Every field, resolved (for config.toml and manifests). A default control mode that
        controls nothing here (all-reduce, exact phases) is written as "none", so that the file
        loads back into the same run."""
        d = self.model_dump(mode="json", exclude_none=True)
        if not self.controlled_phases() and "mode" not in self.control.model_fields_set:
            d["control"]["mode"] = "none"
        if self.spec.adaptive_graph is not None:
            d.pop("topology")  # unused: the graphs come from hyper (and may not be set)
        return d

    def explicit_dict(self) -> dict[str, Any]:
        """Only the fields that were set explicitly (defaults stay defaults when re-validated)."""
        return self.model_dump(mode="json", exclude_unset=True)

    def controlled_phases(self) -> list[int]:
        """Phases under consensus control: listed in control.phases, gossip, gossip algorithm."""
        if self.control.mode == "none" or not self.spec.controllable:
            return []
        modes = self.phase_modes()
        return [k for k in self.control.phases if 1 <= k <= len(modes) and modes[k - 1] == "gossip"]

    def control_summary(self) -> dict[str, Any]:
        """``control_mode`` and ``control_factor`` of a run's summary (factor None when no phase
        is controlled, and for mode fixed, which has no target)."""
        on = bool(self.controlled_phases())
        factor = self.control.factor if on and self.control.mode != "fixed" else None
        return {"control_mode": self.control.mode if on else "none", "control_factor": factor}


def _single_round_problem(algorithm: str, rounds: int) -> str:
    """Why ``control.rounds = rounds`` (> 1) does not apply to ``algorithm``, whose catalog spec
    has ``repeats_rounds = False``."""
    spec = spec_of(algorithm)
    repeating = [n for n, s in CATALOG.items() if s.repeats_rounds]
    return (
        f"control.rounds = {rounds}: algorithm {algorithm!r} ({spec.title}) exchanges exactly "
        "once per step by construction — its update is built around that one exchange, so it "
        "never repeats a gossip round (repeats_rounds = false in its catalog spec) and mode "
        f"'fixed' cannot give it {rounds} rounds per step; use rounds = 1, or an algorithm that "
        f"repeats rounds: {', '.join(repeating)}"
    )


def _relay_and_push_problems(cfg: RunConfig) -> list[str]:
    """RelaySGD needs one static spanning tree; directed topologies need push-sum (sgp); their
    per-edge messages travel as raw float32."""
    problems: list[str] = []
    used = [cfg.topology, *(t for t in cfg.phase_topologies or () if t)]
    directed = [t for t in used if _traits(t).directed]
    spec = cfg.spec
    if directed and not spec.directed:
        push_sum = [n for n, s in CATALOG.items() if s.directed and s.gossip]
        problems.append(
            f"topology {directed[0]!r} is directed (column-stochastic, not symmetric weights); "
            f"only algorithm {' or '.join(map(repr, push_sum))} (push-sum) can use it, not "
            f"{cfg.algorithm!r}"
        )
    if directed and cfg.weights is not None:
        problems.append(
            f"weights: topology {directed[0]!r} is directed and its weights are fixed (½ kept, "
            f"½ pushed); leave weights unset (got {cfg.weights!r})"
        )
    algo = cfg.algorithm
    codec = cfg.compression.codec
    if spec.gossip and not spec.admits(codec) and codec in CAST_CODECS:
        problems.append(
            f"compression.codec {codec!r} does not apply to algorithm {algo!r}: "
            "its messages travel as raw float32 (use 'none')"
        )
    if not spec.relay_tree:
        return problems
    varying = [t for t in used if _traits(t).time_varying]
    if varying:
        problems.append(_time_varying_problem(varying[0], spec))
    elif any(t != cfg.topology for t in used):
        problems.append(
            f"phase_topologies: algorithm {algo!r} relays over one spanning tree for the whole "
            f"run; every phase must use topology {cfg.topology!r}"
        )
    else:
        try:
            graph = build_graph(cfg.topology, cfg.peers)
        except (TopologyError, OSError):
            return problems  # reported when the schedule is built
        try:
            relay_trees(graph, cfg.hyper.get("tree", "auto"), cfg.hyper.get("root", "center"))
        except ValueError as exc:
            problems.append(f"algorithm {algo!r} on topology {cfg.topology!r}: {exc}")
    return problems


def _traits(topology: str) -> TopologySpec:
    """The traits of a topology that passed `_check_topology` (default: static, undirected)."""
    try:
        return topology_spec(topology)
    except (TopologyError, PluginError):
        return TopologySpec(topology)


def _time_varying_problem(topology: str, spec: AlgorithmSpec) -> str:
    return f"topology {topology!r} is time-varying; algorithm {spec.name!r} {spec.static_topology}"


def _check_topology(v: str) -> str:
    if v.startswith("file:"):
        path = Path(v.removeprefix("file:"))
        if not path.is_file():
            raise ValueError(f"topology edge-list file {str(path)!r} does not exist")
        return v
    if exponential_k(v) is not None:  # exponential:K (K ≤ ⌈log2 peers⌉ checked in _cross)
        return v
    if v in TOPOLOGY_SPECS:
        return v
    if not is_spec(v):
        raise ValueError(
            _unknown("topology", v, TOPOLOGY_SPECS.names(), "exponential:K", "file:PATH")
        )
    topology_spec(v)  # a plug-in: numpy-only, imported now for its traits (PluginError)
    return v


def _exponential_problems(cfg: RunConfig) -> list[str]:
    """``exponential:K`` needs K ≤ ⌈log2 peers⌉."""
    problems = []
    for t in (cfg.topology, *(t for t in cfg.phase_topologies or () if t)):
        try:
            exponential_k(t, cfg.peers)
        except TopologyError as exc:
            problems.append(str(exc))
    return problems


def _ada_problems(cfg: RunConfig, n_phases: int) -> list[str]:
    """The Ada interpretations choose every phase's graph themselves
    (`concord.core.graphs.adagraph`)."""
    algo = cfg.algorithm
    source = cfg.spec.graph_source
    if source is None:
        return []
    problems = []
    for key, set_ in (
        ("topology", "topology" in cfg.model_fields_set),
        ("phase_topologies", cfg.phase_topologies is not None),
    ):
        if set_:
            problems.append(f"{key}: algorithm {algo!r} chooses its graphs ({source}); unset it")
    if any(m != "gossip" for m in cfg.phase_modes()):
        problems.append(
            f"plan {cfg.plan_label()!r}: algorithm {algo!r} chooses the gossip graph of every "
            "phase; exact-averaging phases have none (use plan = 'gossip')"
        )
    if cfg.peers < 2:
        problems.append(f"peers: algorithm {algo!r} needs at least 2 peers to gossip")
    else:
        problems.extend(cfg.spec.check_hyper(cfg.hyper, cfg.peers, n_phases))
    return problems


def _unknown(kind: str, value: str, names: Sequence[str], *extra: str) -> str:
    close = closest(value, names)
    hint = f" (did you mean {close!r}?)" if close else ""
    return f"unknown {kind} {value!r}{hint}; valid: {', '.join([*names, *extra])}"


# ---------------------------------------------------------------------------------------------
# Building a config from layers


def parse_value(text: str) -> Any:
    """Parse an override value as a TOML literal (``0.5``, ``true``, ``[1, 2]``, ``"x"``), else
    take it as a bare string (``ring``)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    problems = []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(
                (item, "an override must look like key=value (e.g. control.factor=0.5)")
            )
            continue
        out[key] = parse_value(value.strip())
    if problems:
        raise ConfigError(problems, "--set")
    return out


def env_overrides(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``CONCORD_PEERS=16`` → {"peers": 16}; ``CONCORD_CONTROL__FACTOR=0.5`` → {"control.factor":
    0.5}.

    Only the variables naming a config key are taken (others, like CONCORD_CACHE, are not config).
    """
    environ = os.environ if environ is None else environ
    fields = set(RunConfig.model_fields)
    out: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith("CONCORD_"):
            continue
        key = name.removeprefix("CONCORD_").lower().replace("__", ".")
        if key.split(".")[0] in fields:
            out[key] = parse_value(value)
    return out


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if isinstance(child, str) and part in ("dataset", "model"):
            child = {"name": child}
        elif isinstance(child, str) and part == "partition":
            child = {"scheme": child}
        elif not isinstance(child, dict):
            child = {}
        node[part] = child = dict(child)
        node = child
    node[parts[-1]] = value


def build_config(
    data: Mapping[str, Any], overrides: Mapping[str, Any] | None = None, source: str | None = None
) -> RunConfig:
    tree: dict[str, Any] = dict(data)
    for key, value in (overrides or {}).items():
        if isinstance(value, str) and value.lower() in ("none", "null") and _unsettable(key):
            value = None  # `--set optim.clip_norm=none`: back to unset
        _set_dotted(tree, key, value)
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_problems(exc), source) from None


def _unsettable(key: str) -> bool:
    """Whether ``key`` names an optional field that takes no string (so "none" can only mean
    unset: ``optim.clip_norm``, not ``compression.codec`` whose value "none" is a codec)."""
    model: type[BaseModel] = RunConfig
    parts = key.split(".")
    for part in parts[:-1]:
        field = model.model_fields.get(part)
        ann = field.annotation if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return False
        model = ann
    field = model.model_fields.get(parts[-1])
    if field is None:
        return False
    args = typing.get_args(field.annotation)
    return type(None) in args and not any(a is str or typing.get_origin(a) is Literal for a in args)


def _problems(exc: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            parent = _section_fields(loc[:-1])
            close = closest(loc[-1], parent)
            hint = f"; did you mean {close!r}?" if close else ""
            msg = f"unknown key{hint} (valid here: {', '.join(parent)})"
        elif "input" in err and err["type"] not in ("value_error",):
            msg = f"{msg} (got {err['input']!r})"
        problems.append((".".join(loc), msg))
    return problems


def _section_fields(loc: Sequence[str]) -> list[str]:
    model: type[BaseModel] = RunConfig
    for part in loc:
        field = model.model_fields.get(part)
        ann = field.annotation if field else None
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return []
    return list(model.model_fields)


def load_config(
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    *,
    environ: Mapping[str, str] | None = None,
) -> RunConfig:
    """defaults → TOML file → ``CONCORD_*`` environment → ``--set`` overrides."""
    data: dict[str, Any] = {}
    source = None
    if path is not None:
        source = str(path)
        p = Path(path)
        if not p.is_file():
            raise ConfigError([("", f"config file {source!r} does not exist")], source)
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError([("", f"not valid TOML: {exc}")], source) from None
    merged = env_overrides(environ)
    merged.update(parse_overrides(overrides))
    return build_config(data, merged, source)


def apply_overrides(cfg: RunConfig, overrides: Mapping[str, Any]) -> RunConfig:
    """A copy of ``cfg`` with dotted-key overrides applied and everything re-validated."""
    return build_config(cfg.explicit_dict(), overrides)


# what a reference run drops from the run it is compared with: the settings of the run's own
# algorithm (its hyperparameters, codec, overlap, consensus control, per-phase graphs), which the
# reference algorithm would refuse or read differently; data, model, optimiser, budget, seed,
# network and control plane stay
_ALGORITHM_KEYS = ("hyper", "compression", "overlap", "control", "phase_topologies", "plan")


def reference_config(cfg: RunConfig, algorithm: str) -> RunConfig:
    """``cfg`` run by ``algorithm`` instead (e.g. the all-reduce reference of `concord sim`):
    the same data, model, optimiser, epochs, seed and deployment, with the run's own algorithm
    settings back at their defaults. ``cfg`` may set any of them explicitly — a run's own
    ``config.toml`` sets every key — and the reference still validates."""
    tree = {k: v for k, v in cfg.explicit_dict().items() if k not in _ALGORITHM_KEYS}
    name = f"{algorithm}-reference"
    return build_config(tree, {"algorithm": algorithm, "name": name})


def to_toml(cfg: RunConfig) -> str:
    """Serialise a resolved config to TOML (tables after scalars), readable by `load_config`."""
    return tomli_w.dumps(cfg.to_dict())


def run_identity(cfg: RunConfig) -> str:
    """`to_toml` of what makes two runs the same run: all of the config but where its broker
    is (a resumed run's embedded broker listens on a fresh port). Checkpoints carry it."""
    d = cfg.to_dict()
    d.get("orchestrator", {}).pop("broker", None)
    return tomli_w.dumps(d)
