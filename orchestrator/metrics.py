"""Run-level metrics from the peers' per-step `Metrics` messages (torch-free).

Every peer publishes one record per training step and one per evaluation of its replica. A run
record is written once every expected peer reported that step (or, for stragglers and lost
messages, once the run is ``lag`` steps further, and at the end): the same keys as the vectorized
engine's ``metrics.jsonl`` where they mean the same thing — loss and training accuracy averaged
over peers, rounds, Θ = sqrt(mean θ_i) over peers, the target, bytes summed over peers — plus
``peers`` (how many reported), and for adaptive graphs the K peers gossiped on (``graph_k``).
Evaluation records carry the mean, worst and best peer accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

Sink = Callable[[dict[str, Any]], None]


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def step_record(step: int, per_peer: dict[int, dict[str, float]]) -> dict[str, Any]:
    rows = list(per_peer.values())

    def col(key: str) -> list[float]:
        return [float(r[key]) for r in rows if key in r]

    thetas = col("theta")
    rounds = col("rounds")
    first = rows[0] if rows else {}
    return {
        "kind": "step",
        "step": step,
        "epoch": first.get("epoch"),
        "phase": int(first["phase"]) if "phase" in first else None,
        "lr": first.get("lr"),
        "loss": _mean(col("loss")),
        "train_acc": _mean(col("train_acc")),
        "rounds": int(max(rounds)) if rounds else 0,
        "theta": math.sqrt(math.fsum(t * t for t in thetas) / len(thetas)) if thetas else None,
        "target": max(col("target"), default=None),
        "grad_norm": _mean(col("grad_norm")),
        "bytes_sent": int(math.fsum(col("bytes_sent"))),
        "rounds_total": int(max(col("rounds_total"), default=0)),
        "peers": len(rows),
        **_graph(col("graph_k")),
    }


def _graph(ks: list[float]) -> dict[str, Any]:
    """Adaptive graphs (ada-*): the K of ``exponential:K`` the peers gossiped on, when all agree
    (else the K of each, ``graph_k_peers``: a peer that fell back kept its old graph)."""
    if not ks:
        return {}
    distinct = sorted({int(k) for k in ks})
    if len(distinct) == 1:
        return {"graph_k": distinct[0]}
    return {"graph_k": None, "graph_k_peers": distinct}


def eval_record(step: int, per_peer: dict[int, dict[str, float]]) -> dict[str, Any]:
    acc = [float(r["accuracy"]) for r in per_peer.values() if "accuracy" in r]
    loss = [float(r["loss"]) for r in per_peer.values() if "loss" in r]
    first = next(iter(per_peer.values()), {})
    return {
        "kind": "eval",
        "step": step,
        "epoch": first.get("epoch"),
        "acc_mean_peer": _mean(acc),
        "acc_worst_peer": min(acc, default=None),
        "acc_best_peer": max(acc, default=None),
        "loss_mean_peer": _mean(loss),
        "peers": len(per_peer),
    }


class MetricsTable:
    """Buffers per-peer records and emits run records in step order."""

    def __init__(self, sink: Sink, lag: int = 20) -> None:
        self.sink = sink
        self.lag = lag
        self.steps: dict[int, dict[int, dict[str, float]]] = {}
        self.evals: dict[int, dict[int, dict[str, float]]] = {}
        self.written_step = -1  # last step whose record was emitted
        self.written_eval = -1  # last step whose evaluation record was emitted
        self.latest: dict[str, Any] = {}  # last step record (progress view)
        self.latest_eval: dict[str, Any] = {}

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
        rec = step_record(step, self.steps.pop(step))
        self.written_step = step
        self.latest = rec
        self.sink(rec)

    def _write_eval(self, step: int) -> None:
        rec = eval_record(step, self.evals.pop(step))
        self.written_eval = step
        self.latest_eval = rec
        self.sink(rec)
