"""`RunConfig`, the whole run configuration, and its cross-section checks: what an algorithm
admits (codecs, consensus control, directed or time-varying topologies, overlap, ...) is read from
its traits in the torch-free catalog (`concord.core.algorithms.catalog`), not from lists of
names. Every problem is reported at once. `concord.core.config` builds it from layers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypedDict

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails

from concord.core.algorithms.bipartite import schedule_problems
from concord.core.algorithms.catalog import (
    CAST_CODECS,
    CATALOG,
    AlgorithmSpec,
    asynchronous_algorithms,
    overlap_algorithms,
    spec_of,
)
from concord.core.config_async import AsyncConfig
from concord.core.config_deploy import MetricsConfig, NetworkConfig, OrchestratorConfig
from concord.core.config_sections import (
    ALGORITHM_NAMES,
    PLAN_PRESETS,
    CompressionConfig,
    ControlSection,
    DatasetConfig,
    EvalConfig,
    ModelConfig,
    OptimConfig,
    PartitionConfig,
    Section,
    unknown_name,
)
from concord.core.graphs.graph import TopologyError
from concord.core.graphs.topology import (
    build_graph,
    exponential_k,
    make_schedule,
    topology_spec,
)
from concord.core.graphs.trees import relay_trees
from concord.core.plugins import PluginError, is_spec
from concord.core.specs import TOPOLOGY_SPECS, TopologySpec


class RunConfig(Section):
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
    # ``[async]``: a Python keyword, so declared through the namespace (read it as
    # `RunConfig.asynchrony`); pydantic sees a field named "async" like any other
    __annotations__["async"] = "AsyncConfig"
    vars()["async"] = Field(
        default_factory=AsyncConfig,
        description="the virtual clock of asynchronous algorithms (ad-psgd, async-sgp)",
    )
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

    @model_validator(mode="before")
    @classmethod
    def _asynchronous_engine(cls, data: Any) -> Any:
        """An asynchronous algorithm defaults to the vectorized engine's deterministic simulation
        (peer processes run it for real: engine = 'processes')."""
        if (
            isinstance(data, dict)
            and "engine" not in data
            and data.get("algorithm") in asynchronous_algorithms()
        ):
            return {**data, "engine": "vectorized"}
        return data

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
            raise ValueError(unknown_name("algorithm", v, ALGORITHM_NAMES, "module:Class"))
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
    def asynchrony(self) -> AsyncConfig:
        """The ``[async]`` section."""
        section: AsyncConfig = getattr(self, "async")
        return section

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
                    "vectorized engine; real peers control on the estimator 'theta' or on "
                    "'sketch' (Ξ estimated from 64-float random sketches of the models)"
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
        problems.extend(_async_problems(self))
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
        device = self.network.device
        if device is not None and len(device.factors) != self.peers:
            problems.append(
                f"network.device.factors lists {len(device.factors)} factors for "
                f"{self.peers} peers (one per peer)"
            )
        if device is not None and straggler is not None:
            problems.append(
                "network.device and network.straggler both slow peers down; use one "
                "(network.device: a factor per peer)"
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
        keyed = self.asynchrony.problems(self.peers, self.seed) if spec.asynchronous else []
        if keyed:  # each under its own key; the cross-field problems together under the root
            located: list[tuple[tuple[str, ...], str]] = [(("async", k), m) for k, m in keyed]
            if problems:
                located.append(((), "; ".join(problems)))
            errors: list[InitErrorDetails] = [
                {"type": "value_error", "loc": loc, "input": None, "ctx": {"error": ValueError(m)}}
                for loc, m in located
            ]
            raise ValidationError.from_exception_data(type(self).__name__, errors)
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
        if not self.spec.asynchronous:
            d.pop("async")  # inert (and refused if set): keeps other runs' files and hashes
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

    def summary_fields(self) -> SummaryFields:
        """What a run's summary says of its configuration, for both engines: ``control_mode``
        "none" and ``control_factor`` None when no phase is controlled, and factor None for
        mode fixed, which has no target."""
        on = bool(self.controlled_phases())
        factor = self.control.factor if on and self.control.mode != "fixed" else None
        return SummaryFields(
            algorithm=self.algorithm,
            topology=self.topology,
            peers=self.peers,
            epochs=self.epochs,
            seed=self.seed,
            plan=self.plan_label(),
            control_mode=self.control.mode if on else "none",
            control_factor=factor,
        )


class SummaryFields(TypedDict):
    """The configuration's part of a run summary (`RunConfig.summary_fields`)."""

    algorithm: str
    topology: str
    peers: int
    epochs: float
    seed: int
    plan: str
    control_mode: str
    control_factor: float | None


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


def _async_problems(cfg: RunConfig) -> list[str]:
    """``[async]`` applies to the asynchronous algorithms, which the vectorized engine simulates
    on a virtual clock and peer processes run for real (one model update rule per local step:
    gossip phases only)."""
    algo = cfg.algorithm
    if not cfg.spec.asynchronous:
        if cfg.asynchrony != AsyncConfig():
            return [
                f"async: applies to the asynchronous algorithms "
                f"({', '.join(map(repr, asynchronous_algorithms()))}), not {algo!r}; remove it"
            ]
        return []
    problems: list[str] = []  # the section's own (list lengths, clock): under its keys, `_cross`
    if cfg.engine == "processes":
        problems.extend(async_process_problems(cfg))
    if any(m != "gossip" for m in cfg.phase_modes()):
        problems.append(
            f"plan {cfg.plan_label()!r}: algorithm {algo!r} has no common step at which to "
            "average exactly; use plan = 'gossip'"
        )
    if cfg.peers < 2:
        problems.append(f"peers: algorithm {algo!r} needs at least 2 peers")
    if cfg.dataset.augment:
        problems.append(
            f"dataset.augment: the asynchronous simulation of {algo!r} draws per-peer batches "
            "of different steps at once; augmentation is not supported (set it false)"
        )
    if algo == "ad-psgd":
        problems.extend(_adpsgd_problems(cfg))
    return problems


def _adpsgd_problems(cfg: RunConfig) -> list[str]:
    """AD-PSGD averages pairwise with ½ – ½ between an odd and an even peer, on a schedule known
    in advance (`concord.core.algorithms.bipartite`): checked here, before a run directory
    exists, rather than at its first step."""
    problems = []
    if cfg.kappa != 1.0:
        problems.append(
            f"kappa: algorithm 'ad-psgd' always averages a pair ½ – ½ (its rule has no lazy "
            f"factor); remove kappa (got {cfg.kappa})"
        )
    if cfg.weights is not None:
        problems.append(
            f"weights: algorithm 'ad-psgd' always averages a pair ½ – ½, whatever the mixing "
            f"weights; leave weights unset (got {cfg.weights!r})"
        )
    for t in dict.fromkeys([cfg.topology, *(t for t in cfg.phase_topologies or () if t)]):
        try:
            schedule = make_schedule(t, cfg.peers, seed=cfg.seed)
        except (TopologyError, OSError, ValueError):
            continue  # reported when the schedule is built
        if schedule.period is None:
            problems.append(
                f"topology {t!r} draws its rounds at random; algorithm 'ad-psgd' needs every "
                "round's edges to join an odd and an even peer, which only a fixed schedule "
                "can guarantee — use bipartite-exponential or a ring of even n"
            )
        else:
            problems.extend(schedule_problems(t, schedule.matrices()))
    return problems


def async_process_problems(cfg: RunConfig) -> list[str]:
    """What peer processes do not support for an asynchronous algorithm
    (`concord.peer.asynchronous`): the gRPC data plane only; no consensus control, codec,
    overlap or virtual clock (real peers have real speeds and delays)."""
    algo = cfg.algorithm
    problems = []
    if cfg.network.transport != "grpc":
        problems.append(
            f"network.transport: peer processes run algorithm {algo!r} over gRPC only "
            "(its messages are one-way and request/answer, not rounds); set transport = 'grpc'"
        )
    if cfg.compression.codec != "none":
        problems.append(
            f"compression.codec: peer processes send algorithm {algo!r}'s messages as raw "
            "float32; set codec = 'none'"
        )
    if cfg.asynchrony.speeds != 1.0 or cfg.asynchrony.delays != 0.0:
        problems.append(
            "async.speeds / async.delays: the virtual clock is the vectorized engine's; peer "
            "processes run at their real speeds over the real network (slow a peer down with "
            "network.straggler); remove them"
        )
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
            unknown_name("topology", v, TOPOLOGY_SPECS.names(), "exponential:K", "file:PATH")
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
