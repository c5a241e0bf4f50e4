"""``concord report verify DIR [DIR ...]``: the command (`verify_reports`, `verify_main`), its
arguments (`parse_directories`, `Choice`) and the command line it records (`command_line`)."""

from __future__ import annotations

import datetime
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from concord.lab.sweep import RunFn
from concord.lab.verify.manifest import VerifyError, load_target
from concord.lab.verify.record import (
    plot_record,
    record_rows,
    render_markdown,
    summarize,
    write_record_csv,
)
from concord.lab.verify.rerun import ACCURACY_TOL_PP, check_tolerances, configure, rerun

__all__ = [
    "SEPARATOR",
    "Choice",
    "command_line",
    "parse_directories",
    "verify_main",
    "verify_reports",
]


SEPARATOR = "::"
"""``DIR::RUN``: the run ``RUN`` of the report in ``DIR``."""


@dataclass(frozen=True)
class Choice:
    """A report directory as given on the command line and how its run is chosen (the arguments
    of `load_target`; all None: its first run that succeeded)."""

    directory: str
    run: str | None = None
    row: str | None = None
    column: str | None = None
    seed: int | None = None

    def selectors(self) -> list[tuple[str, object]]:
        """The options that choose the run (``--run``, ``--row``, ``--column``, ``--seed``) set
        on this choice, with their values."""
        options = (("--run", self.run), ("--row", self.row), ("--column", self.column),
                   ("--seed", self.seed))  # fmt: skip
        return [(option, value) for option, value in options if value is not None]


def _split(arg: str) -> tuple[str, str | None]:
    if SEPARATOR not in arg or Path(arg).is_dir():
        return arg, None
    directory, _, name = arg.rpartition(SEPARATOR)
    if not directory or not name:
        raise VerifyError(f"{arg!r}: expected DIR or DIR::RUN (a run name of the CSV after '::')")
    return directory, name


def parse_directories(
    args: Sequence[str],
    *,
    run: str | None = None,
    row: str | None = None,
    column: str | None = None,
    seed: int | None = None,
) -> list[Choice]:
    """The `Choice` of each ``DIR`` or ``DIR::RUN`` argument. The options ``run`` / ``row`` /
    ``column`` / ``seed`` (``--run`` …) choose the run of a single ``DIR``; with several, each
    directory's run is its ``::RUN`` (default: its first run that succeeded). Raises
    `VerifyError`: the options with several directories, a run chosen twice, an empty ``::RUN``."""
    if not args:
        raise VerifyError("give at least one report directory (DIR or DIR::RUN)")
    given = [option for option, _ in Choice("", run, row, column, seed).selectors()]
    if len(args) > 1 and given:
        verb = "applies" if len(given) == 1 else "apply"
        first = args[0].split(SEPARATOR)[0]
        raise VerifyError(
            f"{'/'.join(given)} {verb} to a single DIR, and {len(args)} directories were given: "
            f"choose each directory's run as DIR::RUN (e.g. {first}::NAME), or verify one "
            "directory per command"
        )
    choices = []
    for arg in args:
        directory, name = _split(arg)
        if name is None:
            choices.append(Choice(directory, run, row, column, seed))
        elif given:
            raise VerifyError(
                f"{arg}: the run is chosen twice, as DIR::RUN and with {'/'.join(given)}: give one"
            )
        else:
            choices.append(Choice(directory, name))
    return choices


def command_line(directories: Sequence[str], options: Sequence[tuple[str, object]] = ()) -> str:
    """``concord report verify`` with ``directories`` (as given) and ``options`` (name, value;
    True: a flag), quoted for a shell."""
    words = ["concord", "report", "verify", *directories]
    for option, value in options:
        words += [option] if value is True else [option, str(value)]
    return shlex.join(words)


def _default_command(
    choices: Sequence[Choice],
    out: str | Path | None,
    tol: float,
    count_tol: float | None,
    csv_path: str | Path | None,
    markdown_path: str | Path | None,
) -> str:
    args = [
        c.directory + (SEPARATOR + c.run if c.run and len(choices) > 1 else "") for c in choices
    ]
    options: list[tuple[str, object]] = []
    if len(choices) == 1:
        options += choices[0].selectors()
    for option, value in (("--out", out), ("--count-tol", count_tol), ("--csv", csv_path),
                          ("--markdown", markdown_path)):  # fmt: skip
        if value is not None:
            options.append((option, value))
    if tol != ACCURACY_TOL_PP:
        options.append(("--tol", tol))
    return command_line(args, options)


def _slug(directory: Path) -> str:
    name = directory.resolve().name or "report"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)


def verify_reports(
    choices: Sequence[Choice],
    *,
    out: str | Path | None = None,
    tol: float = ACCURACY_TOL_PP,
    count_tol: float | None = None,
    csv_path: str | Path | None = None,
    markdown_path: str | Path | None = None,
    command: str | None = None,
    today: str | None = None,
    echo: Callable[[str], None] = print,
    run_fn: RunFn | None = None,
    console: Console | None = None,
    at_commit: bool = False,
    code_root: str | Path | None = None,
) -> int:
    """Re-run the chosen cell of each report (`Choice`s; `parse_directories`) and print each
    comparison; with ``csv_path``, write the reproducibility record (`record_rows`), with
    ``markdown_path`` too (needs ``csv_path``) its report (`render_markdown`; ``command``: the
    command line it shows, default rebuilt from the arguments; ``today``: its date, default
    today's); ``at_commit``: a cell whose host and code both differ from the report's is
    re-run with the report's commit too, to decide (`concord.lab.verify.diagnose`);
    ``code_root``: the checkout whose code runs here (default: this concord's). Every input is
    checked before the first re-run. ``out``: one report's re-run goes
    to ``out/runs/NAME``, several to ``out/<i>-<directory name>/runs/NAME`` (default: a fresh
    temporary directory). Returns 0 every metric of every cell within tolerance, 1 any differs
    or a re-run failed; raises `VerifyError` for bad input (exit 2)."""
    check_tolerances(tol, count_tol)
    if not choices:
        raise VerifyError("give at least one report directory (DIR or DIR::RUN)")
    csv_file = None if csv_path is None else Path(csv_path)
    md_file = None if markdown_path is None else Path(markdown_path)
    if md_file is not None and csv_file is None:
        raise VerifyError(
            "--markdown needs --csv: the markdown is generated from the CSV's rows and names it"
        )
    for path, option in ((csv_file, "--csv"), (md_file, "--markdown")):
        if path is not None and path.is_dir():
            raise VerifyError(f"{option} {path} is a directory: give a file path")
    if csv_file is not None and md_file is not None and csv_file.resolve() == md_file.resolve():
        raise VerifyError("--csv and --markdown name the same file")
    prepared = []
    seen: dict[tuple[Path, str], str] = {}
    for choice in choices:
        target = load_target(
            choice.directory, run=choice.run, row=choice.row, column=choice.column,
            seed=choice.seed,
        )  # fmt: skip
        key = (target.directory.resolve(), target.cell.name)
        if key in seen:
            raise VerifyError(
                f"run {target.cell.name!r} of {choice.directory} is chosen twice "
                f"({seen[key]} and {choice.directory}): verify each cell once"
            )
        seen[key] = choice.directory
        base, cfg = configure(target)
        prepared.append((choice, target, base, cfg))
    several = len(prepared) > 1
    # no --out: the re-runs go to a temporary directory, removed however this ends (a verdict,
    # a failed re-run, an error, Ctrl-C); with --out they stay
    kept = out is not None
    root = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="concord-verify-"))
    try:
        out_dirs = []
        for i, (_, target, _, _) in enumerate(prepared, 1):
            out_dir = root / f"{i}-{_slug(target.directory)}" if several else root
            for sub in ("", "at-commit/") if at_commit else ("",):
                if (out_dir / sub / "runs" / target.run.name).exists():
                    where = f"--out {root}" + (f": {out_dir}" if several else "")
                    raise VerifyError(f"{where} already holds {sub}runs/{target.run.name}; "
                                      "choose another directory")  # fmt: skip
            out_dirs.append(out_dir)
        outcomes = []
        for i, ((choice, target, base, cfg), out_dir) in enumerate(
            zip(prepared, out_dirs, strict=True), 1
        ):
            if several:
                if i > 1:
                    echo("")
                echo(f"=== {i}/{len(prepared)}: {choice.directory} ===")
            outcomes.append(
                rerun(choice.directory, target, base, cfg, out_dir, tol=tol, count_tol=count_tol,
                       echo=echo, run_fn=run_fn, console=console, kept=kept, at_commit=at_commit,
                       code_root=None if code_root is None else Path(code_root))
            )  # fmt: skip
        rows = record_rows(outcomes)
        if several:
            echo("")
            echo(f"summary: {summarize(rows)[0]}")
        if csv_file is not None:
            write_record_csv(csv_file, rows)
            echo(f"wrote {csv_file} ({len(rows)} rows)")
        if csv_file is not None and md_file is not None:
            here = outcomes[0].here
            md_file.parent.mkdir(parents=True, exist_ok=True)
            figure = plot_record(rows, md_file.with_suffix(".png"))
            echo(f"wrote {figure}")
            text = render_markdown(
                rows,
                command=command
                or _default_command(choices, out, tol, count_tol, csv_path, markdown_path),
                csv_name=Path(
                    os.path.relpath(csv_file.resolve(), md_file.resolve().parent)
                ).as_posix(),
                date=today or datetime.date.today().isoformat(),
                python=str(here.get("python")),
                cores=here.get("cores"),
                plot=figure.name,
            )
            md_file.write_text(text, encoding="utf-8")
            echo(f"wrote {md_file}")
        return 0 if all(o.ok for o in outcomes) else 1
    finally:
        if not kept:
            shutil.rmtree(root, ignore_errors=True)


def verify_main(
    directory: str | Path,
    *,
    run: str | None = None,
    row: str | None = None,
    column: str | None = None,
    seed: int | None = None,
    out: str | Path | None = None,
    tol: float = ACCURACY_TOL_PP,
    count_tol: float | None = None,
    csv_path: str | Path | None = None,
    markdown_path: str | Path | None = None,
    command: str | None = None,
    echo: Callable[[str], None] = print,
    run_fn: RunFn | None = None,
    console: Console | None = None,
    at_commit: bool = False,
) -> int:
    """Re-run a cell of the report in ``directory`` and print the comparison; returns the exit
    code: 0 every metric within tolerance, 1 a metric differs or the re-run failed. Raises
    `VerifyError` for bad input (exit 2). ``tol``: accuracy tolerance in pp; ``count_tol``:
    relative tolerance of rounds and bytes (None: 0, or `CONTROLLED_COUNT_TOL` when consensus
    control is on). ``run_fn``: the engine's run (default: the sweep's, without plots). The
    record: `verify_reports`."""
    return verify_reports(
        [Choice(str(directory), run, row, column, seed)],
        out=out,
        tol=tol,
        count_tol=count_tol,
        csv_path=csv_path,
        markdown_path=markdown_path,
        command=command,
        echo=echo,
        run_fn=run_fn,
        console=console,
        at_commit=at_commit,
    )
