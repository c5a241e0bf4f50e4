"""Run-level metrics from the peers' per-step `Metrics` messages (torch-free).

Every peer publishes one record per training step and one per evaluation of its replica. A run
record is written once every expected peer reported that step (or, for stragglers and lost
messages, once the run is ``lag`` steps further, and at the end): the same keys as the vectorized
engine's ``metrics.jsonl`` where they mean the same thing — loss and training accuracy averaged
over peers, rounds, Θ = sqrt(mean θ_i) over peers, the target, bytes summed over peers — plus
``peers`` (how many reported), and for adaptive graphs the K peers gossiped on (``graph_k``).
Evaluation records carry the mean, worst and best peer accuracy. The records are
`concord.core.records` types (docs/records.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from concord.core.records import EvalRecord, MetricsRecord, StepRecord, peer_accuracy, peer_loss

Sink = Callable[[MetricsRecord], None]


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def step_record(step: int, per_peer: Mapping[int, Mapping[str, float]]) -> StepRecord:
    """The run's step record from the peers' step values (``per_peer``: peer → its values)."""
    rows = list(per_peer.values())

    def col(key: str) -> list[float]:
        return [float(r[key]) for r in rows if key in r]

    thetas = col("theta")
    rounds = col("rounds")
    ks = sorted({int(k) for k in col("graph_k")})
    first = rows[0] if rows else {}
    return StepRecord(
        step=step,
        epoch=first.get("epoch"),
        phase=int(first["phase"]) if "phase" in first else None,
        lr=first.get("lr"),
        loss=_mean(col("loss")),
        train_acc=_mean(col("train_acc")),
        rounds=int(max(rounds)) if rounds else 0,
        theta=math.sqrt(math.fsum(t * t for t in thetas) / len(thetas)) if thetas else None,
        target=max(col("target"), default=None),
        grad_norm=_mean(col("grad_norm")),
        bytes_sent=int(math.fsum(col("bytes_sent"))),
        rounds_total=int(max(col("rounds_total"), default=0)),
        peers=len(rows),
        # adaptive graphs (ada-*): the K of ``exponential:K`` the peers gossiped on, when all
        # agree (else the K of each: a peer that fell back kept its old graph)
        graph_k=ks[0] if len(ks) == 1 else None,
        graph_k_peers=ks if len(ks) > 1 else None,
    )


def eval_record(step: int, per_peer: Mapping[int, Mapping[str, float]]) -> EvalRecord:
    """The run's evaluation record from the peers' evaluation values: the mean, worst and best
    peer accuracy and the mean loss (each peer's under any name it has had: `peer_accuracy`)."""
    acc = [a for a in map(peer_accuracy, per_peer.values()) if a is not None]
    loss = [x for x in map(peer_loss, per_peer.values()) if x is not None]
    first = next(iter(per_peer.values()), {})
    return EvalRecord(
        step=step,
        epoch=first.get("epoch"),
        accuracy_mean_peer=_mean(acc),
        accuracy_worst_peer=min(acc, default=None),
        accuracy_best_peer=max(acc, default=None),
        loss_mean_peer=_mean(loss),
        peers=len(per_peer),
    )


class MetricsTable:
    """Buffers per-peer records and emits run records in step order."""

    def __init__(self, sink: Sink, lag: int = 20) -> None:
        self.sink = sink
        self.lag = lag
        self.steps: dict[int, dict[int, dict[str, float]]] = {}
        self.evals: dict[int, dict[int, dict[str, float]]] = {}
        self.written_step = -1  # last step whose record was emitted
        self.written_eval = -1  # last step whose evaluation record was emitted

    def add(self, peer: int, step: int, event: str, values: dict[str, float]) -> None:
        evaluation = event == "eval"
        if step <= (self.written_eval if evaluation else self.written_step):
            return  # a straggler after its record was written: dropped
        table = self.evals if evaluation else self.steps
        table.setdefault(step, {})[peer] = values

    def emit(self, expected: set[int]) -> None:
        """Write every consecutive complete record, and anything ``lag`` steps behind the
        newest step."""
        newest = max(self.steps, default=-1)
        for step in sorted(self.steps):
            complete = expected <= set(self.steps[step])
            if not complete and step > newest - self.lag:
                break
            self._write(step)
        for step in sorted(self.evals):
            complete = expected <= set(self.evals[step])
            if not complete and step > newest - self.lag:
                break
            self._write_eval(step)

    def flush(self) -> None:
        for step in sorted(self.steps):
            self._write(step)
        for step in sorted(self.evals):
            self._write_eval(step)

    def _write(self, step: int) -> None:
        self.written_step = step
        self.sink(step_record(step, self.steps.pop(step)))

    def _write_eval(self, step: int) -> None:
        self.written_eval = step
        self.sink(eval_record(step, self.evals.pop(step)))
