"""The terminal progress bar of a run: step, epoch, loss, accuracy, Θ against its target, rounds.

`step_progress` is the one layout of both engines' bars; it fits an 80-column terminal: the step
counter, the bar and the times keep their widths, and the numbers between them are cut with "…"
when the line is too long (a wider terminal shows them whole).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column
from rich.text import Text

from concord.core.records import EvalRecord, StepRecord
from concord.runtime.driver import RunHooks

__all__ = ["ProgressBar", "step_progress"]

BAR_WIDTH = 12


class _StepColumn(ProgressColumn):
    """``step 12/1875``; ``starting`` while the total is not known yet (the processes engine
    learns it from the orchestrator's plan once the peers are up)."""

    def __init__(self) -> None:
        super().__init__(table_column=Column(no_wrap=True))

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text("starting", style="bold")
        return Text(f"step {int(task.completed)}/{int(task.total)}", style="bold")


class _InfoColumn(ProgressColumn):
    """The run's numbers (``info`` field): the one column that gives way, on one line, "…"."""

    def __init__(self) -> None:
        super().__init__(table_column=Column(ratio=1))  # wrappable: the table shrinks this one

    def render(self, task: Task) -> Text:
        return Text(str(task.fields.get("info", "")), no_wrap=True, overflow="ellipsis")


def step_progress(*, enabled: bool = True, console: Console | None = None) -> Progress:
    """A run's progress bar (add one task with ``total`` = the run's steps, or None while
    unknown, and an ``info`` field)."""
    fixed = Column(no_wrap=True)
    return Progress(
        _StepColumn(),
        BarColumn(bar_width=BAR_WIDTH, table_column=Column(no_wrap=True)),
        _InfoColumn(),
        TimeElapsedColumn(table_column=fixed),
        TextColumn("ETA", table_column=Column(no_wrap=True)),
        TimeRemainingColumn(table_column=Column(no_wrap=True)),
        console=console,
        disable=not enabled,
        transient=False,
    )


class ProgressBar(RunHooks):
    """A rich progress bar with the numbers a user watches: accuracy, Θ vs target, rounds."""

    def __init__(self, total: int, *, enabled: bool, console: Console | None = None) -> None:
        self.enabled = enabled
        self.total = total
        self.console = console
        self._progress: Progress | None = None
        self._task: Any = None
        self._last_eval: EvalRecord | None = None

    def evaluated(self, step: int, record: EvalRecord) -> None:
        self._last_eval = record

    def stepped(self, step: int, record: StepRecord) -> None:
        self.update(record, self._last_eval)

    def __enter__(self) -> ProgressBar:
        if self.enabled:
            self._progress = step_progress(console=self.console)
            # the task first: the live display's first frame already shows step 0/total
            self._task = self._progress.add_task("train", total=self.total, info="")
            self._progress.__enter__()
        return self

    def update(self, rec: StepRecord, last_eval: EvalRecord | None) -> None:
        """Show step ``rec`` (the numbers every tenth step and at the last) with the averaged
        model's accuracy of ``last_eval``, the latest evaluation."""
        if self._progress is None:
            return
        step = rec.step
        if step % 10 and step != self.total - 1:
            self._progress.update(self._task, completed=step + 1)
            return
        parts = []
        if rec.epoch is not None:
            parts.append(f"ep {rec.epoch:.1f}")
        if rec.loss is not None:
            parts.append(f"loss {rec.loss:.3f}")
        if last_eval is not None and last_eval.accuracy_avg_model is not None:
            parts.append(f"acc {100 * last_eval.accuracy_avg_model:.1f}%")
        if rec.theta is not None:
            t = rec.target
            parts.append(f"Θ {rec.theta:.3g}" + (f"/{t:.3g}" if t is not None else ""))
        parts.append(f"rounds {rec.rounds}")
        self._progress.update(self._task, completed=step + 1, info="  ".join(parts))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.__exit__(exc_type, exc, tb)
