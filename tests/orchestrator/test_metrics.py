"""Run-level metrics from the peers' `Metrics` messages (`concord.orchestrator.metrics`),
sans-io."""

from __future__ import annotations

import math

import pytest

from concord.core.records import EvalRecord, MetricsRecord, StepRecord
from concord.orchestrator.metrics import MetricsTable, eval_record, step_record

PEERS = {0, 1, 2}


def row(peer: int, step: int, **extra: float) -> dict[str, float]:
    """A peer's step values; ``loss`` and ``theta`` differ per peer so that means are visible."""
    values = {
        "epoch": step / 10,
        "phase": 1.0,
        "lr": 0.1,
        "loss": 1.0 + peer,
        "train_acc": 0.5,
        "rounds": 1.0 + peer,
        "theta": 1.0,
        "target": 0.5,
        "grad_norm": 2.0,
        "bytes_sent": 1000.0 * (peer + 1),
        "rounds_total": 10.0 + step,
    }
    values.update(extra)
    return values


class Sink:
    def __init__(self) -> None:
        self.records: list[MetricsRecord] = []

    def __call__(self, record: MetricsRecord) -> None:
        self.records.append(record)

    def steps(self, kind: str = "step") -> list[tuple[int, int | None]]:
        """(step, peers) of the records of ``kind``, in the order written."""
        return [(r.step, r.peers) for r in self.records if kind == r.TAG]


def add_step(table: MetricsTable, step: int, peers: set[int] = PEERS) -> None:
    for p in sorted(peers):
        table.add(p, step, "step", row(p, step))


# -- aggregation ---------------------------------------------------------------------------------


def test_step_record_aggregates_over_peers() -> None:
    per_peer = {
        0: row(0, 7, theta=1.0, loss=0.5, rounds=2.0),
        1: row(1, 7, theta=7.0, loss=1.5, rounds=5.0),
        2: row(2, 7, theta=5.0, loss=4.0, rounds=3.0, target=0.75),
    }
    rec = step_record(7, per_peer)
    assert isinstance(rec, StepRecord)
    assert rec.step == 7
    assert rec.peers == 3
    assert rec.loss == 2.0  # (0.5 + 1.5 + 4.0) / 3, exact in binary
    # each peer's "theta" is its sqrt(θ_i): the run's Θ = sqrt(mean θ_i) = sqrt((1+49+25)/3) = 5
    assert rec.theta == 5.0
    assert rec.theta != (1.0 + 7.0 + 5.0) / 3  # not the arithmetic mean of the peers' values
    assert rec.rounds == 5  # the slowest peer's rounds
    assert isinstance(rec.rounds, int)
    assert rec.bytes_sent == 1000 + 2000 + 3000  # summed over peers
    assert isinstance(rec.bytes_sent, int)
    assert rec.target == 0.75  # max over peers
    assert rec.grad_norm == 2.0
    assert rec.rounds_total == 17
    assert rec.train_acc == 0.5
    assert rec.phase == 1
    assert (rec.epoch, rec.lr) == (0.7, 0.1)


def test_step_record_with_missing_keys() -> None:
    rec = step_record(3, {4: {"loss": 2.0}, 5: {"loss": 4.0, "theta": 3.0}})
    assert rec.peers == 2
    assert rec.loss == 3.0
    assert rec.theta == 3.0  # over the peers that sent one
    assert rec.rounds == 0
    assert rec.target is None
    assert rec.phase is None
    assert rec.train_acc is None
    assert rec.bytes_sent == 0
    empty = step_record(3, {})
    assert (empty.peers, empty.loss, empty.theta) == (0, None, None)


def test_loss_mean_is_exact_summation() -> None:
    # the mean is fsum/n: the result does not depend on the peers' order
    losses = [1e16, 1.0, -1e16, 3.0]
    rec = step_record(0, {i: {"loss": v} for i, v in enumerate(losses)})
    assert rec.loss == 1.0  # (1 + 3) / 4; naive left-to-right summation gives 0.75


def test_eval_record_mean_worst_best() -> None:
    per_peer = {
        0: {"accuracy": 0.5, "loss": 1.0, "epoch": 3.0},
        1: {"accuracy": 0.75, "loss": 2.0},
        2: {"accuracy": 1.0, "loss": 3.0},
    }
    rec = eval_record(30, per_peer)
    assert rec == EvalRecord(
        step=30,
        epoch=3.0,
        accuracy_mean_peer=0.75,
        accuracy_worst_peer=0.5,
        accuracy_best_peer=1.0,
        loss_mean_peer=2.0,
        peers=3,
    )
    none = eval_record(1, {0: {"epoch": 0.1}})
    assert none.accuracy_mean_peer is None
    assert none.accuracy_worst_peer is None
    assert none.accuracy_best_peer is None


def test_eval_record_reads_the_peers_old_and_new_names() -> None:
    # a peer publishes its replica's accuracy and loss as accuracy_mean_peer / loss_mean_peer
    # (its `EvalRecord`), or as accuracy / loss (peers older than typed records): both count
    per_peer = {
        0: {"accuracy_mean_peer": 0.5, "loss_mean_peer": 1.0},
        1: {"accuracy": 1.0, "loss": 3.0},
    }
    rec = eval_record(4, per_peer)
    assert (rec.accuracy_worst_peer, rec.accuracy_best_peer) == (0.5, 1.0)
    assert rec.loss_mean_peer == 2.0


# -- emission order ------------------------------------------------------------------------------


def test_records_are_written_in_step_order_once_complete() -> None:
    sink = Sink()
    table = MetricsTable(sink, lag=5)
    add_step(table, 1)  # step 1 complete before step 0
    add_step(table, 0, {0, 1})
    table.emit(PEERS)
    assert sink.records == []  # step 0 waits for peer 2, and step 1 waits for step 0
    table.add(2, 0, "step", row(2, 0))
    table.emit(PEERS)
    assert sink.steps() == [(0, 3), (1, 3)]
    assert table.written_step == 1
    assert table.steps == {}


def test_a_peer_that_left_is_not_waited_for() -> None:
    sink = Sink()
    table = MetricsTable(sink, lag=5)
    add_step(table, 0, {0, 1})
    table.emit(PEERS)
    assert sink.records == []
    table.emit({0, 1})  # peer 2 left: the expected set shrank
    assert sink.steps() == [(0, 2)]


def test_stragglers_beyond_lag_are_written_partially() -> None:
    sink = Sink()
    table = MetricsTable(sink, lag=3)
    add_step(table, 0, {0, 1})  # peer 2's step 0 is lost
    for step in (1, 2):
        add_step(table, step)
        table.emit(PEERS)
    assert sink.records == []  # newest step 2: step 0 is only 2 steps behind
    add_step(table, 3)
    table.emit(PEERS)
    assert sink.steps() == [(0, 2), (1, 3), (2, 3), (3, 3)]
    first = sink.records[0]
    assert isinstance(first, StepRecord)
    assert first.loss == 1.5  # mean of the two peers that reported


def test_a_straggler_only_releases_what_is_lag_behind() -> None:
    sink = Sink()
    table = MetricsTable(sink, lag=2)
    add_step(table, 0, {0})
    add_step(table, 1, {0})
    add_step(table, 2, {0})
    table.emit(PEERS)
    assert sink.steps() == [(0, 1)]  # newest 2: step 0 is 2 behind, step 1 only 1
    assert table.written_step == 0
    assert set(table.steps) == {1, 2}


def test_late_messages_for_written_steps_are_dropped() -> None:
    sink = Sink()
    table = MetricsTable(sink, lag=1)
    add_step(table, 0, {0, 1})
    add_step(table, 1)
    table.emit(PEERS)
    assert sink.steps() == [(0, 2), (1, 3)]
    table.add(2, 0, "step", row(2, 0))  # peer 2's step 0 arrives after its record was written
    table.add(2, 1, "step", row(2, 1))  # a duplicate of a written step
    assert table.steps == {}
    table.emit(PEERS)
    table.flush()
    assert sink.steps() == [(0, 2), (1, 3)]  # no second record for steps 0 and 1


def test_eval_records_are_emitted_in_order_and_separately_from_steps() -> None:
    sink = Sink()
    table = MetricsTable(sink, lag=5)
    for p in sorted(PEERS):
        table.add(p, 10, "eval", {"accuracy": 0.25 * (p + 1), "loss": 1.0})
    table.add(0, 5, "eval", {"accuracy": 0.9, "loss": 1.0})  # eval of step 5: peers 1, 2 missing
    add_step(table, 5)
    table.emit(PEERS)
    assert sink.steps("step") == [(5, 3)]
    assert sink.steps("eval") == []  # eval 10 waits behind the incomplete eval 5
    for p in (1, 2):
        table.add(p, 5, "eval", {"accuracy": 0.8, "loss": 1.0})
    table.emit(PEERS)
    assert sink.steps("eval") == [(5, 3), (10, 3)]
    ev = sink.records[-1]
    assert isinstance(ev, EvalRecord)
    assert ev.step == 10
    assert (ev.accuracy_worst_peer, ev.accuracy_best_peer) == (0.25, 0.75)
    assert ev.accuracy_mean_peer == 0.5  # (0.25 + 0.5 + 0.75) / 3, exact in binary
    # a late evaluation of a written step is dropped, and steps do not collide with evals
    table.add(0, 10, "eval", {"accuracy": 0.0})
    assert table.evals == {}
    table.add(0, 7, "step", row(0, 7))
    assert 7 in table.steps  # step 7 is not "written" by the evaluation of step 10


def test_incomplete_evaluations_are_released_by_training_progress() -> None:
    sink = Sink()
    table = MetricsTable(sink, lag=2)
    table.add(0, 0, "eval", {"accuracy": 0.5})
    add_step(table, 0)
    add_step(table, 1)
    table.emit(PEERS)
    assert sink.steps("eval") == []
    add_step(table, 2)
    table.emit(PEERS)
    assert sink.steps("eval") == [(0, 1)]


def test_flush_writes_everything_in_order() -> None:
    sink = Sink()
    table = MetricsTable(sink, lag=100)
    add_step(table, 2, {1})
    add_step(table, 0, {0})
    add_step(table, 1)
    table.add(2, 1, "eval", {"accuracy": 0.5})
    table.add(1, 0, "eval", {"accuracy": 0.25})
    table.emit(PEERS)
    assert sink.records == []
    table.flush()
    assert [(r.TAG, r.step, r.peers) for r in sink.records] == [
        ("step", 0, 1),
        ("step", 1, 3),
        ("step", 2, 1),
        ("eval", 0, 1),
        ("eval", 1, 1),
    ]
    assert table.steps == {}
    assert table.evals == {}
    table.flush()
    assert len(sink.records) == 5  # nothing left to write twice


@pytest.mark.parametrize("lag", [0, 1])
def test_small_lag_writes_at_once(lag: int) -> None:
    sink = Sink()
    table = MetricsTable(sink, lag=lag)
    add_step(table, 0, {0})
    add_step(table, 1, {0})
    table.emit(PEERS)
    want = [(0, 1), (1, 1)] if lag == 0 else [(0, 1)]
    assert sink.steps() == want
    first = sink.records[0]
    assert isinstance(first, StepRecord)
    assert first.theta is not None
    assert math.isfinite(first.theta)


def test_step_record_carries_the_adaptive_graph_k() -> None:
    other = step_record(0, {0: {"loss": 1.0}}).to_json()  # other algorithms: no key
    assert "graph_k" not in other
    assert "graph_k_peers" not in other
    rec = step_record(5, {0: {"graph_k": 3.0}, 1: {"graph_k": 3.0}})
    assert rec.graph_k == 3
    assert "graph_k_peers" not in rec.to_json()
    rec = step_record(5, {0: {"graph_k": 3.0}, 1: {"graph_k": 2.0}})  # a peer fell back
    assert rec.graph_k is None
    assert rec.graph_k_peers == [2, 3]
