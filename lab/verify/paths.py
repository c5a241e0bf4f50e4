"""Which paths of the repository hold code (`CODE_PATHS`), and whether they have uncommitted
changes (`code_dirty`): what a report records (``git_dirty``) and ``concord report verify``
compares between commits; and the version and default metrics of a report's run manifest
(`MANIFEST_VERSION`, `TABLE_METRICS`), which both the reports (`concord.lab.presets.report`)
and the verifier (`concord.lab.verify.manifest`) use. A light module (pathlib and subprocess
only), so that importing it — from `concord.lab.presets.report` or `concord.lab.verify.diagnose`
— loads no plotting stack.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "CODE_PATHS",
    "LAYER_DIRS",
    "MANIFEST_VERSION",
    "ROOT_PACKAGE",
    "TABLE_METRICS",
    "code_dirty",
]

MANIFEST_VERSION = 2
"""The version of ``preset.json``'s run manifest (`concord.lab.presets.report.run_manifest`).
1: ``engine``, ``base``, ``set`` and ``runs`` (the table is ``table.csv``, its run names in
``name``, the generic metric columns); 2 adds ``manifest_version``, ``table``, ``name_column``
and ``metrics``."""

TABLE_METRICS: Mapping[str, str] = {
    "accuracy_avg_model": "accuracy_avg_model",
    "accuracy_worst_peer": "accuracy_worst_peer",
    "gossip_rounds_total": "gossip_rounds_total",
    "bytes_sent_total": "bytes_sent_total",
}
"""The compared metrics of a ``table.csv`` (`concord.lab.sweep.write_csv`): metric → column.
The metrics ``concord report verify`` knows: these four and ``bytes_per_peer``."""

ROOT_PACKAGE = "concord"
"""The folder of the root package ``concord`` (its public API, version and errors)."""
LAYER_DIRS = ("core", "lab", "orchestrator", "peer", "protos", "runtime", "sim")
"""The folders installed as ``concord.<name>`` (pyproject.toml's package-dir)."""
CODE_PATHS = (ROOT_PACKAGE, *LAYER_DIRS, "pyproject.toml")
"""The paths of the repository that hold code; the others (docs, tests, examples) do not
change a run."""


def code_dirty(root: Path | None = None) -> bool | None:
    """Whether the tracked code (`CODE_PATHS`) of the git checkout at ``root`` (default: this
    concord's) has uncommitted changes (None: not a git checkout, or git failed)."""
    where = root or Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                              *CODE_PATHS], capture_output=True, text=True, timeout=10,
                             cwd=where, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None
