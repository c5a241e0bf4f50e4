"""`concord.runtime.drive`: the epoch loop every engine and the peer share."""

from __future__ import annotations

from typing import Any

from concord.runtime.driver import StepHooks, drive


class Sink:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def metric(self, record: dict[str, Any]) -> None:
        self.records.append(record)


class Trace(StepHooks):
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def before(self, step: int) -> None:
        self.calls.append(("before", step))

    def after(self, step: int, record: dict[str, Any]) -> None:
        record["seen"] = True  # hooks may add to a record before it is written
        self.calls.append(("after", step))

    def evaluated(self, step: int, record: dict[str, Any]) -> None:
        self.calls.append(("evaluated", step))

    def stepped(self, step: int, record: dict[str, Any]) -> None:
        self.calls.append(("stepped", step))

    def stopping(self, step: int) -> None:
        self.calls.append(("stopping", step))


def train(step: int) -> dict[str, Any]:
    return {"kind": "step", "step": step}


def evaluate(step: int, record: dict[str, Any], final: bool) -> dict[str, Any]:
    return {"kind": "eval", "step": step, "final": final}


def test_evaluates_at_the_interval_and_the_last_step() -> None:
    sink, trace = Sink(), Trace()
    result = drive(
        steps=7, interval=3, last_step=6, train=train, evaluate=evaluate, sink=sink, hooks=[trace]
    )
    evals = [r for r in sink.records if r["kind"] == "eval"]
    assert [(e["step"], e["final"]) for e in evals] == [(2, False), (5, False), (6, True)]
    assert result.steps == 7
    assert not result.stopped
    assert result.last_eval == evals[-1]
    assert all(r["seen"] for r in sink.records if r["kind"] == "step")
    assert trace.calls[:5] == [
        ("before", 0), ("after", 0), ("stepped", 0), ("before", 1), ("after", 1),
    ]  # fmt: skip
    assert trace.calls.index(("evaluated", 2)) < trace.calls.index(("stepped", 2))


def test_a_stage_that_ends_before_the_last_step_does_not_evaluate_there() -> None:
    sink = Sink()
    drive(steps=4, interval=10, last_step=9, train=train, evaluate=evaluate, sink=sink)
    assert [r["kind"] for r in sink.records] == ["step"] * 4


def test_stop_request_ends_before_the_next_step() -> None:
    sink, trace = Sink(), Trace()
    result = drive(
        steps=10,
        interval=2,
        last_step=9,
        train=train,
        evaluate=None,
        sink=sink,
        hooks=[trace],
        stop=lambda: len(sink.records) >= 3,
    )
    assert result.stopped
    assert result.steps == 3
    assert trace.calls[-1] == ("stopping", 3)
    assert [r["step"] for r in sink.records] == [0, 1, 2]  # evaluate=None: steps only


def test_start_continues_a_resumed_run_from_that_step() -> None:
    sink, trace = Sink(), Trace()
    result = drive(
        steps=6,
        interval=2,
        last_step=5,
        train=train,
        evaluate=lambda step, rec, final: {"kind": "eval", "step": step, "final": final},
        sink=sink,
        hooks=[trace],
        start=3,
    )
    assert result.steps == 6
    assert [(r["kind"], r["step"]) for r in sink.records] == [
        ("step", 3),
        ("eval", 3),
        ("step", 4),
        ("step", 5),
        ("eval", 5),
    ]
    assert trace.calls[0] == ("before", 3)
    assert (
        drive(
            steps=4, interval=1, last_step=3, train=train, evaluate=None, sink=Sink(), start=4
        ).steps
        == 4
    )  # nothing left to run
