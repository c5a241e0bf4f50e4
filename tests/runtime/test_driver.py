"""`concord.runtime.drive`: the epoch loop every engine and the peer share."""

from __future__ import annotations

from dataclasses import dataclass, replace

from concord.runtime.driver import StepHooks, drive


@dataclass(frozen=True)
class Step:
    step: int
    seen: tuple[str, ...] = ()
    kind: str = "step"


@dataclass(frozen=True)
class Eval:
    step: int
    final: bool
    kind: str = "eval"


class Sink:
    def __init__(self) -> None:
        self.records: list[Step | Eval] = []

    def metric(self, record: Step | Eval) -> None:
        self.records.append(record)


class Trace(StepHooks[Step, Eval]):
    """Records the calls; its ``after`` returns a copy of the record marked with ``name``."""

    def __init__(self, name: str = "trace") -> None:
        self.name = name
        self.calls: list[tuple[str, int]] = []

    def before(self, step: int) -> None:
        self.calls.append(("before", step))

    def after(self, step: int, record: Step) -> Step:
        self.calls.append(("after", step))
        return replace(record, seen=(*record.seen, self.name))

    def evaluated(self, step: int, record: Eval) -> None:
        self.calls.append(("evaluated", step))

    def stepped(self, step: int, record: Step) -> None:
        self.calls.append(("stepped", step))

    def stopping(self, step: int) -> None:
        self.calls.append(("stopping", step))


def train(step: int) -> Step:
    return Step(step)


def evaluate(step: int, record: Step, final: bool) -> Eval:
    return Eval(step, final)


def test_evaluates_at_the_interval_and_the_last_step() -> None:
    sink, trace, second = Sink(), Trace(), Trace("second")
    result = drive(
        steps=7,
        interval=3,
        last_step=6,
        train=train,
        evaluate=evaluate,
        sink=sink,
        hooks=[trace, second],
    )
    evals = [r for r in sink.records if isinstance(r, Eval)]
    assert [(e.step, e.final) for e in evals] == [(2, False), (5, False), (6, True)]
    assert result.steps == 7
    assert not result.stopped
    assert result.last_eval == evals[-1]
    # each hook's `after` gets the record the hook before it returned; the last one is written
    steps = [r for r in sink.records if isinstance(r, Step)]
    assert [r.seen for r in steps] == [("trace", "second")] * 7
    assert trace.calls[:5] == [
        ("before", 0), ("after", 0), ("stepped", 0), ("before", 1), ("after", 1),
    ]  # fmt: skip
    assert trace.calls.index(("evaluated", 2)) < trace.calls.index(("stepped", 2))


def test_a_stage_that_ends_before_the_last_step_does_not_evaluate_there() -> None:
    sink = Sink()
    drive(steps=4, interval=10, last_step=9, train=train, evaluate=evaluate, sink=sink)
    assert [r.kind for r in sink.records] == ["step"] * 4
    result = drive(steps=4, interval=10, last_step=9, train=train, evaluate=evaluate, sink=Sink())
    assert result.last_eval is None


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
    assert [r.step for r in sink.records] == [0, 1, 2]  # evaluate=None: steps only


def test_start_continues_a_resumed_run_from_that_step() -> None:
    sink, trace = Sink(), Trace()
    result = drive(
        steps=6,
        interval=2,
        last_step=5,
        train=train,
        evaluate=evaluate,
        sink=sink,
        hooks=[trace],
        start=3,
    )
    assert result.steps == 6
    assert [(r.kind, r.step) for r in sink.records] == [
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


class _Budget:
    """Spent after step 5; an evaluation due after steps 1 and 4 (not on the interval)."""

    def spent(self, step: int) -> bool:
        return step == 5

    def evaluation_due(self, step: int) -> bool:
        return step in (1, 4)


def test_a_budget_ends_the_loop_and_schedules_the_evaluations() -> None:
    # async.budget = "global": `steps` is only an upper bound, the interval and last_step unused
    sink = Sink()
    result = drive(
        steps=100,
        interval=2,
        last_step=99,
        train=train,
        evaluate=evaluate,
        sink=sink,
        budget=_Budget(),
    )
    assert (result.steps, result.spent, result.stopped) == (6, True, False)
    evals = [(r.step, r.final) for r in sink.records if isinstance(r, Eval)]
    assert evals == [(1, False), (4, False), (5, True)]
    assert [r.step for r in sink.records if isinstance(r, Step)] == list(range(6))
