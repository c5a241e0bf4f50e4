"""The run's progress bar on an 80-column terminal: the step counter with its total from the
first frame, the numbers cut with "…" rather than the counter, the bar or the times."""

from __future__ import annotations

import io
import re

from rich.console import Console

from concord.core.records import EvalRecord, StepRecord
from concord.runtime.progress import ProgressBar, step_progress

LONG = StepRecord(
    step=1230,
    epoch=12.3,
    phase=0,
    lr=0.1,
    loss=2.123,
    train_acc=0.5,
    rounds=12345,
    theta=0.0123,
    target=0.02,
    grad_norm=1.0,
    bytes_sent=0,
    rounds_total=12345,
)
HALF = EvalRecord(step=1229, epoch=12.3, accuracy_avg_model=0.5)
PROCESSES_INFO = (
    "ep 0.3  loss 2.303  acc 10.0% (worst 9.0%)  Θ 0.0123/0.02  rounds 1234  peers 16 training"
)


def _terminal() -> Console:
    return Console(
        file=io.StringIO(), width=80, record=True, force_terminal=True, color_system=None
    )


def _lines(console: Console, progress_table: object) -> list[str]:
    console.print(progress_table)
    return console.export_text().splitlines()


def test_the_first_frame_shows_the_total() -> None:
    console = _terminal()
    with ProgressBar(1875, enabled=True, console=console):
        pass  # entering draws the first frame, leaving the last
    text = console.export_text()
    assert "step 0/1875" in text
    assert "None" not in text


def test_eighty_columns_keep_the_step_counter_bar_and_times() -> None:
    bar = ProgressBar(18750, enabled=True, console=_terminal())
    with bar:
        bar.update(LONG, HALF)
        assert bar._progress is not None
        console = _terminal()
        lines = _lines(console, bar._progress.make_tasks_table(bar._progress.tasks))
    assert len(lines) == 1, lines
    (line,) = lines
    assert len(line) <= 80, line
    # the counter, the bar (12 columns, a tenth of it done), then the numbers
    assert re.match(r"step 1231/18750 ╸ {11} ep 12\.3  loss 2\.123", line), line
    assert "…" in line  # the rest of the numbers gave way
    assert line.rstrip().endswith("0:00:00 ETA -:--:--")


def test_the_processes_engine_bar_says_starting_until_it_knows_the_total() -> None:
    progress = step_progress(console=_terminal())
    task = progress.add_task("run", total=None, info="starting peers")
    (line,) = _lines(_terminal(), progress.make_tasks_table(progress.tasks))
    assert line.startswith("starting ")
    assert "None" not in line
    progress.update(task, total=1875, completed=0, info=PROCESSES_INFO)
    (line,) = _lines(_terminal(), progress.make_tasks_table(progress.tasks))
    assert line.startswith("step 0/1875 ")
    assert len(line) <= 80
    assert "ETA" in line


def test_a_wide_terminal_shows_every_number() -> None:
    bar = ProgressBar(18750, enabled=True, console=_terminal())
    with bar:
        bar.update(LONG, HALF)
        assert bar._progress is not None
        console = Console(
            file=io.StringIO(), width=160, record=True, force_terminal=True, color_system=None
        )
        (line,) = _lines(console, bar._progress.make_tasks_table(bar._progress.tasks))
    assert "acc 50.0%  Θ 0.0123/0.02  rounds 12345" in line
    assert "…" not in line
