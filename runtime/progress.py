"""The terminal progress bar of a run: step, epoch, loss, accuracy, Θ against its target, rounds."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from concord.runtime.driver import StepHooks

__all__ = ["ProgressBar"]


class ProgressBar(StepHooks):
    """A rich progress bar with the numbers a user watches: accuracy, Θ vs target, rounds."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.enabled = enabled
        self.total = total
        self._progress: Progress | None = None
        self._task: Any = None
        self._last_eval: dict[str, Any] = {}

    def evaluated(self, step: int, record: dict[str, Any]) -> None:
        self._last_eval = record

    def stepped(self, step: int, record: dict[str, Any]) -> None:
        self.update(record, self._last_eval)

    def __enter__(self) -> ProgressBar:
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]step {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("train", total=self.total, info="")
        return self

    def update(self, rec: dict[str, Any], last_eval: dict[str, float]) -> None:
        if self._progress is None:
            return
        step = rec["step"]
        if step % 10 and step != self.total - 1:
            self._progress.update(self._task, completed=step + 1)
            return
        parts = [f"ep {rec['epoch']:.1f}", f"loss {rec['loss']:.3f}"]
        if "acc_avg_model" in last_eval:
            parts.append(f"acc {100 * last_eval['acc_avg_model']:.1f}%")
        if rec.get("theta") is not None:
            t = rec.get("target")
            parts.append(f"Θ {rec['theta']:.3g}" + (f"/{t:.3g}" if t is not None else ""))
        parts.append(f"rounds {rec['rounds']}")
        self._progress.update(self._task, completed=step + 1, info="  ".join(parts))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.__exit__(exc_type, exc, tb)
