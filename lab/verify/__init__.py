"""``concord report verify DIR``: re-run one cell of a committed report and compare it.

``DIR`` is a report directory: its ``preset.json`` (the run manifest,
`concord.lab.presets.report.run_manifest`) is the only source of the configuration — the
recorded engine, base items, ``--set`` items and each run's own overrides — and names the table
of the results (``table.csv`` of a preset, ``runs.csv`` of consensus-control), the column naming
each run and the compared metrics (`concord.lab.verify.manifest`). A directory without a
manifest, or with a version this concord does not read, is bad input naming the version.

The run is chosen by ``--run NAME`` or ``--row KEY --column KEY [--seed S]`` (keys or the CSV's
labels), by default the first run of the CSV that succeeded. It re-runs through the sweep
machinery into ``--out`` (default: a fresh temporary directory), and a table compares, for every
metric the manifest names, the committed value with the re-run's (`concord.lab.verify.rerun`):

- accuracies (averaged model, worst peer): within ``tol`` percentage points (default 0.5 pp —
  well above the CSV's float rounding; a re-run on the recorded machine gives the same numbers);
- gossip rounds and bytes (all peers, or per peer): exact by default, since the configuration
  fixes them; ``count_tol`` (relative) when consensus control is on (or ``ada-feedback``, whose
  graph follows Θ), default ±10 %, since the rounds then follow the float trajectory.

It also compares the recorded host (``preset.json``'s ``host`` facts: CPU identity and flags,
numpy's BLAS, torch's build and CPU capability, thread variables; for an older report its torch,
CPU and threads) and code (its ``git_commit``) with this machine and checkout
(`concord.lab.verify.diagnose`), and the verdict of a cell that differs says which explains it,
naming the facts: "host differs: cpu flags +avx512f, numpy.version 1.26.4 → 2.1.0" (not a
regression), "code differs" on the same host (the code change), a real regression when neither
differs, undecided when both do — then ``--at-commit`` re-runs the report's commit in a temporary
``git worktree`` to decide. On another host an accuracy's tolerance is max(``tol``, 2 × the
std of the cell's committed seeds) (`SEED_SPREAD_K`). Exit codes (`verify_main`): 0 all within
tolerance, 1 a metric differs (or the re-run failed), 2 bad input (`VerifyError`).

Several reports in one command (`verify_reports`, `concord.lab.verify.main`): ``DIR [DIR ...]``,
each ``DIR`` or ``DIR::RUN`` (`parse_directories`; ``--run`` and ``--row/--column/--seed`` only
with a single ``DIR``). ``--csv`` writes the reproducibility record, one row per directory, run
and metric (`record_rows`, `RECORD_COLUMNS`), and ``--markdown`` a report generated from those
rows (`render_markdown`, `concord.lab.verify.record`).

Names load on first use (`__getattr__`): importing a submodule (`concord.lab.verify.paths`, which
`concord.lab.presets.report` imports; `concord.lab.verify.diagnose`) does not load the re-run
machinery, the plots or torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from concord.lab.verify.main import (
        Choice,
        command_line,
        parse_directories,
        verify_main,
        verify_reports,
    )
    from concord.lab.verify.manifest import (
        METRICS,
        Cell,
        Metric,
        Target,
        VerifyError,
        load_target,
    )
    from concord.lab.verify.record import (
        RECORD_COLUMNS,
        record_rows,
        render_markdown,
        summarize,
        write_record_csv,
    )
    from concord.lab.verify.rerun import (
        ACCURACY_TOL_PP,
        CONTROLLED_COUNT_TOL,
        SEED_SPREAD_K,
        Check,
        Outcome,
        compare,
    )

_MODULES = {
    "concord.lab.verify.main": (
        "Choice", "command_line", "parse_directories", "verify_main", "verify_reports"),
    "concord.lab.verify.manifest": (
        "METRICS", "Cell", "Metric", "Target", "VerifyError", "load_target"),
    "concord.lab.verify.record": (
        "RECORD_COLUMNS", "record_rows", "render_markdown", "summarize", "write_record_csv"),
    "concord.lab.verify.rerun": (
        "ACCURACY_TOL_PP", "CONTROLLED_COUNT_TOL", "SEED_SPREAD_K", "Check", "Outcome", "compare"),
}  # fmt: skip
_LAZY = {name: module for module, names in _MODULES.items() for name in names}

__all__ = [
    "ACCURACY_TOL_PP",
    "CONTROLLED_COUNT_TOL",
    "METRICS",
    "RECORD_COLUMNS",
    "SEED_SPREAD_K",
    "Cell",
    "Check",
    "Choice",
    "Metric",
    "Outcome",
    "Target",
    "VerifyError",
    "command_line",
    "compare",
    "load_target",
    "parse_directories",
    "record_rows",
    "render_markdown",
    "summarize",
    "verify_main",
    "verify_reports",
    "write_record_csv",
]


def __getattr__(name: str) -> Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'concord.lab.verify' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
