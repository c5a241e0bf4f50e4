"""What a peer tells operators while it trains: its Prometheus metrics
(`concord.runtime.telemetry`), fed by a step hook from every step and evaluation record (names:
docs/deployment.md#metrics), and a progress line in its log at every evaluation."""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from concord.core.records import JSON, EvalRecord, StepRecord
from concord.runtime.driver import RunHooks
from concord.runtime.telemetry import Registry

__all__ = ["PeerMetrics", "peer_registry", "watch_refusals"]

log = structlog.get_logger(__name__)

# (name, kind, help): what a step record feeds
_DECLARED = (
    ("step", "gauge", "Last completed training step (0-based)."),
    ("steps_total", "counter", "Training steps completed by this process."),
    ("phase", "gauge", "Training phase of the last step (1-based; phases split at LR decays)."),
    ("epoch", "gauge", "Epochs of this peer's partition completed."),
    ("lr", "gauge", "Learning rate of the last step."),
    ("loss", "gauge", "Training loss of the last step's batch."),
    ("last_step_seconds", "gauge", "Wall time of the last step, control waits included."),
    ("step_seconds_total", "counter", "Wall time of all steps (rate: seconds per second)."),
    ("wait_seconds_total", "counter", "Time steps waited for neighbours' tensors."),
    ("control_wait_seconds_total", "counter", "Time steps waited for control decisions."),
    ("rounds", "gauge", "Gossip rounds of the last step."),
    ("gossip_rounds_total", "counter", "Gossip rounds since the start of the run."),
    ("theta", "gauge", "Local consensus statistic θ_i of the last round."),
    ("target", "gauge", "Consensus-control target of the last step (absent: uncontrolled)."),
    ("grad_norm", "gauge", "Local gradient norm of the last step."),
    ("bytes_sent_total", "counter", "Bytes this peer sent on gossip edges."),
    ("neighbours_missing_total", "counter", "Neighbour tensors that missed a round's deadline."),
    ("frames_rejected_total", "counter", "Received tensors refused (shape, finiteness, …)."),
    (
        "requests_refused_total",
        "counter",
        "Data-plane requests this peer's server refused (Hello, frames, Fetch), by reason class.",
    ),
    ("eval_accuracy", "gauge", "Accuracy of this peer's model at the last evaluation."),
    ("eval_loss", "gauge", "Test loss of this peer's model at the last evaluation."),
)


def peer_registry(run: str, peer: int) -> Registry:
    """The ``concord_peer_*`` metrics of peer ``peer`` of run ``run``."""
    registry = Registry("concord_peer", {"run": run, "peer": str(peer)})
    for name, kind, help in _DECLARED:
        registry.declare(name, kind, help)
    return registry


def watch_refusals(registry: Registry, refused: Mapping[str, int]) -> None:
    """Export ``refused`` (the transport's reason class → count, kept up to date by its server)
    as ``requests_refused_total{reason}`` at every scrape."""

    def collect() -> None:
        for reason, count in list(refused.items()):
            registry.set("requests_refused_total", count, {"reason": reason})

    registry.collector(collect)


class PeerMetrics(RunHooks):
    """Feeds ``registry`` from the training loop's records (called in the training thread): the
    step record's fields, the peer's timings and round outcomes in its ``extra`` (``step_ms``,
    ``wait_ms``, ``control_wait_ms``, ``missing``, ``rejected``), and the evaluation record's
    accuracy and loss of this peer's replica."""

    def __init__(self, registry: Registry, total_steps: int | None = None) -> None:
        self.registry = registry
        self.total = total_steps
        self.last: StepRecord | None = None  # the latest step record: the progress line's

    def after(self, step: int, record: StepRecord) -> StepRecord:
        r = self.registry
        self.last = record
        r.set("step", step)
        r.inc("steps_total")
        gauges = {
            "phase": record.phase,
            "epoch": record.epoch,
            "lr": record.lr,
            "loss": record.loss,
            "rounds": record.rounds,
            "theta": record.theta,
            "grad_norm": record.grad_norm,
            "target": record.target,
            "gossip_rounds_total": record.rounds_total,
            "bytes_sent_total": record.bytes_sent,  # cumulative in the step record
        }
        for name, value in gauges.items():
            if value is not None:
                r.set(name, value)
        extra = record.extra
        seconds = _number(extra.get("step_ms")) / 1e3
        r.set("last_step_seconds", seconds)
        r.inc("step_seconds_total", seconds)
        r.inc("wait_seconds_total", _number(extra.get("wait_ms")) / 1e3)
        r.inc("control_wait_seconds_total", _number(extra.get("control_wait_ms")) / 1e3)
        r.inc("neighbours_missing_total", _count(extra.get("missing")))
        r.inc("frames_rejected_total", _count(extra.get("rejected")))
        return record

    def evaluated(self, step: int, record: EvalRecord) -> None:
        accuracy, loss = record.accuracy_mean_peer, record.loss_mean_peer
        if accuracy is not None:
            self.registry.set("eval_accuracy", accuracy)
        if loss is not None:
            self.registry.set("eval_loss", loss)
        last = self.last
        log.info(
            "peer.progress",
            step=step,
            of=self.total,
            epoch=_rounded(record.epoch, 3),
            accuracy=_rounded(accuracy, 4),
            test_loss=_rounded(loss, 4),
            train_loss=None if last is None else _rounded(last.loss, 4),
            rounds_total=None if last is None else last.rounds_total,
            step_ms=None if last is None else _rounded(last.extra.get("step_ms"), 1),
        )


def _number(value: JSON) -> float:
    """A number of a record's ``extra`` (0 where there is none)."""
    return float(value) if isinstance(value, int | float) else 0.0


def _count(value: JSON) -> int:
    """How many items a list of a record's ``extra`` holds (0 where there is none)."""
    return len(value) if isinstance(value, list) else 0


def _rounded(value: JSON, digits: int) -> float | None:
    return round(float(value), digits) if isinstance(value, int | float) else None
