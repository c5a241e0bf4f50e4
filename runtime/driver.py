"""The epoch driver: the loop over a run's steps that every engine and the peer share.

`drive` trains step after step, writes each step's record, evaluates at the run's evaluation
interval and at the last step, and stops early when asked. What differs between the vectorized
engine and a peer process comes in as functions (``train``, ``evaluate``) and as `StepHooks`:
the progress bar, the orchestrator's schedule changes before a step, metrics published after it,
a checkpoint after each evaluation or when a stop is requested.

The loop is generic over its step record type ``S`` and evaluation record type ``E``; both
engines and the peer drive `concord.core.records.StepRecord` and
`concord.core.records.EvalRecord` (`RunHooks`). Records are immutable: a hook that adds to a
step's record (a peer's timings) returns a copy (`dataclasses.replace`) from `StepHooks.after`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeAlias, TypeVar

from concord.core.records import EvalRecord, StepRecord

__all__ = ["Budget", "DriveResult", "MetricsSink", "RunHooks", "StepHooks", "drive"]

S = TypeVar("S")
E = TypeVar("E")
R_contra = TypeVar("R_contra", contravariant=True)


class StepHooks(Generic[S, E]):
    """What a training loop does around each step besides training (no-ops by default), for
    step records of type ``S`` and evaluation records of type ``E``."""

    def before(self, step: int) -> None:
        """Called before ``step`` runs."""

    def after(self, step: int, record: S) -> S:
        """Called with the step's record before it is written; returns the record to write and
        to pass on: ``record`` itself, or a copy with more in it."""
        return record

    def evaluated(self, step: int, record: E) -> None:
        """Called with an evaluation record, after it is written."""

    def stepped(self, step: int, record: S) -> None:
        """Called when ``step`` is done (its record and any evaluation written)."""

    def stopping(self, step: int) -> None:
        """A stop was requested before ``step`` (steps ``0 … step − 1`` are complete)."""


RunHooks: TypeAlias = StepHooks[StepRecord, EvalRecord]
"""The hooks of the engines and the peer, whose records are `StepRecord` and `EvalRecord`."""


class MetricsSink(Protocol[R_contra]):
    """Where the records go (`concord.runtime.rundir.RunWriter`: ``metrics.jsonl``)."""

    def metric(self, record: R_contra) -> None: ...


class Budget(Protocol):
    """A budget that ends the loop and schedules evaluations by something other than the step
    index (``async.budget = "global"``: a peer's estimate of the run's global progress,
    `concord.peer.asynchronous.GlobalBudget`)."""

    def spent(self, step: int) -> bool:
        """After ``step``: was it the last one (the final evaluation, then the loop ends)?"""
        ...

    def evaluation_due(self, step: int) -> bool:
        """After ``step``: is an evaluation due?"""
        ...


@dataclass
class DriveResult(Generic[E]):
    """How a `drive` ended: ``steps`` completed, whether a stop request ``stopped`` the loop
    early, the latest evaluation record (None: no evaluation ran), and whether a `Budget`
    ended it (``spent``)."""

    steps: int
    stopped: bool
    last_eval: E | None = None
    spent: bool = False


def drive(
    *,
    steps: int,
    interval: int,
    last_step: int,
    train: Callable[[int], S],
    evaluate: Callable[[int, S, bool], E] | None,
    sink: MetricsSink[S | E],
    hooks: Sequence[StepHooks[S, E]] = (),
    stop: Callable[[], bool] | None = None,
    start: int = 0,
    skip: Callable[[int], int] | None = None,
    budget: Budget | None = None,
) -> DriveResult[E]:
    """Run steps ``start … steps − 1`` (``start`` > 0: a resumed run, steps ``0 … start − 1``
    were done before and count as completed).

    ``train(step)`` returns the step's record, which every hook's ``after`` may replace in
    turn before it is written; ``evaluate(step, record, final)`` the evaluation record, called
    after every ``interval``-th step and after ``last_step`` (the run's final step, ``final`` =
    True; a stage that ends earlier, such as the calibration pass, does not evaluate there).
    ``evaluate`` None: no evaluations. ``stop()`` is asked before each step.

    ``skip(step)``, asked before each step (after ``stop``), returns the step to run instead
    (≥ ``step``, < ``steps``): a peer that fell behind its neighbours jumps to their step, and
    the steps in between run nowhere (no record, no evaluation; they count as completed).

    ``budget``: the final step and the evaluations are the budget's (`Budget`), not
    ``last_step`` and ``interval``; ``steps`` is then only an upper bound.
    """
    if start < 0:
        raise ValueError(f"start = {start!r}; must be ≥ 0")
    result: DriveResult[E] = DriveResult(steps=min(start, steps), stopped=False)
    step = start - 1
    while step + 1 < steps:
        step += 1
        if stop is not None and stop():
            for hook in hooks:
                hook.stopping(step)
            result.stopped = True
            return result
        if skip is not None:
            to = skip(step)
            if not step <= to < steps:
                raise ValueError(f"skip({step}) = {to}; must be in {step} … {steps - 1}")
            step = to
        for hook in hooks:
            hook.before(step)
        record = train(step)
        for hook in hooks:
            record = hook.after(step, record)
        sink.metric(record)
        if budget is None:
            final = step == last_step
            due = (step + 1) % interval == 0
        else:
            final = budget.spent(step)
            due = budget.evaluation_due(step)
        if evaluate is not None and (due or final):
            ev = evaluate(step, record, final)
            sink.metric(ev)
            result.last_eval = ev
            for hook in hooks:
                hook.evaluated(step, ev)
        for hook in hooks:
            hook.stepped(step, record)
        result.steps = step + 1
        if budget is not None and final:
            result.spent = True
            break
    return result
