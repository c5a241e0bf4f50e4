"""The epoch driver: the loop over a run's steps that every engine and the peer share.

`drive` trains step after step, writes each step's record, evaluates at the run's evaluation
interval and at the last step, and stops early when asked. What differs between the vectorized
engine and a peer process comes in as functions (``train``, ``evaluate``) and as `StepHooks`:
the progress bar, the orchestrator's schedule changes before a step, metrics published after it,
a checkpoint after each evaluation or when a stop is requested.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["DriveResult", "MetricsSink", "StepHooks", "drive"]

Record = dict[str, Any]


class StepHooks:
    """What a training loop does around each step besides training (no-ops by default)."""

    def before(self, step: int) -> None:
        """Called before ``step`` runs."""

    def after(self, step: int, record: Record) -> None:
        """Called with the step's metrics record, before it is written."""

    def evaluated(self, step: int, record: Record) -> None:
        """Called with an evaluation record, after it is written."""

    def stepped(self, step: int, record: Record) -> None:
        """Called when ``step`` is done (its record and any evaluation written)."""

    def stopping(self, step: int) -> None:
        """A stop was requested before ``step`` (steps ``0 … step − 1`` are complete)."""


class MetricsSink(Protocol):
    def metric(self, record: Record) -> None: ...


@dataclass
class DriveResult:
    steps: int  # steps completed
    stopped: bool  # a stop request ended the loop early
    last_eval: Record = field(default_factory=dict)  # the latest evaluation record


def drive(
    *,
    steps: int,
    interval: int,
    last_step: int,
    train: Callable[[int], Record],
    evaluate: Callable[[int, Record, bool], Record] | None,
    sink: MetricsSink,
    hooks: Sequence[StepHooks] = (),
    stop: Callable[[], bool] | None = None,
    start: int = 0,
    skip: Callable[[int], int] | None = None,
) -> DriveResult:
    """Run steps ``start … steps − 1`` (``start`` > 0: a resumed run, steps ``0 … start − 1``
    were done before and count as completed).

    ``train(step)`` returns the step's record; ``evaluate(step, record, final)`` the evaluation
    record, called after every ``interval``-th step and after ``last_step`` (the run's final step,
    ``final`` = True; a stage that ends earlier, such as the calibration pass, does not evaluate
    there). ``evaluate`` None: no evaluations. ``stop()`` is asked before each step.

    ``skip(step)``, asked before each step (after ``stop``), returns the step to run instead
    (≥ ``step``, < ``steps``): a peer that fell behind its neighbours jumps to their step, and
    the steps in between run nowhere (no record, no evaluation; they count as completed).
    """
    if start < 0:
        raise ValueError(f"start = {start!r}; must be ≥ 0")
    result = DriveResult(steps=min(start, steps), stopped=False)
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
            hook.after(step, record)
        sink.metric(record)
        final = step == last_step
        if evaluate is not None and ((step + 1) % interval == 0 or final):
            ev = evaluate(step, record, final)
            sink.metric(ev)
            result.last_eval = ev
            for hook in hooks:
                hook.evaluated(step, ev)
        for hook in hooks:
            hook.stepped(step, record)
        result.steps = step + 1
    return result
