"""Which paths of the repository hold code (`CODE_PATHS`), and whether they have uncommitted
changes (`code_dirty`): what a report records (``git_dirty``) and ``concord report verify``
compares between commits. A light module (pathlib and subprocess only), so that importing it —
from `concord.lab.presets.report` or `concord.lab.verify.diagnose` — loads no plotting stack.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["CODE_PATHS", "LAYER_DIRS", "ROOT_PACKAGE", "code_dirty"]

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
