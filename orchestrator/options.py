"""The orchestrator's settings, resolved once from the run's config (`OrchestratorOptions.resolve`).

Each part gets the options it needs and nothing else: `Admission` its `AdmissionOptions` (who
is in the run and when a peer counts as gone), `Schedules` its `ScheduleOptions` (what a
schedule version says besides its peers), and `concord.orchestrator.app.Orchestrator` the
timing of the run itself. Nobody walks the config for these values again. The config still goes,
whole, to the builders that take it (the phase plan, the controller's settings, the checkpoint,
the manifest, the broker session's credentials).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from concord.core.config import RunConfig

STALE_SLACK = 60.0  # seconds of clock skew allowed for before a retained "ready" is a leftover


@dataclass(frozen=True)
class AdmissionOptions:
    """`concord.orchestrator.admission.Admission`'s settings."""

    peers: int  # the run's peer ids are 0 … peers-1
    liveness_timeout: float  # seconds of silence after which a busy peer is dropped
    heartbeat: float  # seconds between a peer's heartbeats (a Last-Will stands after two)
    # a "ready" stamped more than this before the orchestrator started is a leftover
    stale_after: float = float("inf")
    step_deadline: float = float("inf")  # network.deadline: bounds a re-admitted peer's lead


@dataclass(frozen=True)
class ScheduleOptions:
    """`concord.orchestrator.schedules.Schedules`' settings: the run's graph."""

    peers: int
    algorithm: str
    hyper: Mapping[str, Any]
    topology: str
    weights: str | None
    kappa: float
    seed: int


@dataclass(frozen=True)
class OrchestratorOptions:
    """Everything the orchestrator reads of the config, read once."""

    run_id: str
    broker: str | None  # --broker, else orchestrator.broker; None: embed a broker
    startup_timeout: float  # seconds for the peers to be ready (and the broker to answer)
    decision_timeout: float  # seconds a round waits for its statistics
    broker_lost_timeout: float  # seconds of a lost broker before the run gives up
    lag: int | None  # lagged consensus control: the lag in steps; None: barrier or none
    calibrate: bool  # constant targets over controlled phases: a calibration stage first
    statistic: str  # control.statistic, which the calibration records
    graph_feedback: bool  # an ada-feedback run: graph decisions from uncontrolled steps
    metrics_listen: str | None  # where the Prometheus metrics are served
    admission: AdmissionOptions
    schedules: ScheduleOptions

    @classmethod
    def resolve(cls, cfg: RunConfig, *, run_id: str, broker: str | None) -> OrchestratorOptions:
        """The options of ``cfg``'s run under ``run_id``; ``broker``: the one given on the
        command line (overrides the config's)."""
        o, net, c = cfg.orchestrator, cfg.network, cfg.control
        return cls(
            run_id=run_id,
            broker=broker or o.broker,
            startup_timeout=net.startup_timeout,
            decision_timeout=o.decision_timeout,
            broker_lost_timeout=o.broker_lost_timeout,
            lag=c.lag if c.lagged else None,
            calibrate=c.mode == "constant" and bool(cfg.controlled_phases()),
            statistic=c.statistic,
            graph_feedback=cfg.spec.adaptive_graph == "feedback",
            metrics_listen=cfg.metrics.listen,
            admission=AdmissionOptions(
                peers=cfg.peers,
                liveness_timeout=o.liveness_timeout,
                heartbeat=o.heartbeat,
                stale_after=net.startup_timeout + STALE_SLACK,
                step_deadline=net.deadline,
            ),
            schedules=ScheduleOptions(
                peers=cfg.peers,
                algorithm=cfg.algorithm,
                hyper=cfg.hyper,
                topology=cfg.topology,
                weights=cfg.weights,
                kappa=cfg.kappa,
                seed=cfg.seed,
            ),
        )
