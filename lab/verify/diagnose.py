"""Why a re-run differs from a report: the host, the code, or neither (`concord.lab.verify`).

A report records the host facts of the machine that produced it (``preset.json``'s ``host``,
`concord.runtime.hostinfo.host_facts`) and the commit of its code (``git_commit``). A re-run
compares both with this machine and checkout:

- the host (`compare_hosts`): "same" (every decisive fact equal), "differs" (the facts that
  differ are named: "cpu flags +avx512f", "numpy.version 1.26.4 → 2.1.0"), or, for a report
  that predates host facts, the torch / CPU / threads it records (a model name such as
  "AMD EPYC" says little: two hosts with that name can expose different flags);
- the code (`compare_code`): "same" when ``git diff`` between the report's commit and this
  checkout touches none of the code paths (`concord.lab.verify.paths.CODE_PATHS`) and no new
  untracked file lies under them, "differs" (with the commits and how many files), "unknown"
  without git or a commit, or when the report was made with uncommitted code changes (its
  ``git_dirty``: no commit holds the code that produced it). A report without ``git_commit`` is
  taken at the commit that last changed its table (said so).

When both differ, only a re-run of the report's own code on this host separates them
(`rerun_at_commit`, ``--at-commit``): the report's commit is checked out in a temporary
``git worktree`` of this checkout's repository (where `compare_code` found the commit) and the
cell re-run there with that commit's own ``concord report verify``, reading the report directory
itself (the report is data: at its recorded commit — HEAD when it was generated, before it was
committed — the worktree's copy is missing or older). If it gives this re-run's values, the host
is the reason; if it gives the committed ones, the code.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from concord.core.records import RunSummary
from concord.lab.verify.manifest import Target, VerifyError
from concord.lab.verify.paths import CODE_PATHS, LAYER_DIRS, ROOT_PACKAGE
from concord.runtime.hostinfo import host_differences
from concord.runtime.records import read_summary

__all__ = [
    "CodeState",
    "HostState",
    "compare_code",
    "compare_hosts",
    "rerun_at_commit",
]


@dataclass(frozen=True)
class HostState:
    """The recorded host against this one: ``state`` "same", "differs" or "not recorded" (also:
    no host facts, and the torch / CPU / threads the report records are equal — they do not
    establish the same host); ``facts``: the differing facts as a verdict shows them;
    ``from_facts``: False when the report records no host facts and the comparison fell back to
    its torch / CPU / threads; ``corpus``: the differing facts of a dataset read from the host's
    files (``data.*``, `concord.runtime.hostinfo.CORPUS_DECISIVE`) — other training data, not
    another machine: a cell's difference is then the corpus's (`describe_corpus`)."""

    state: str
    facts: tuple[str, ...] = ()
    from_facts: bool = True
    corpus: tuple[str, ...] = ()

    def describe_corpus(self) -> str:
        return "corpus differs: " + ", ".join(self.corpus) if self.corpus else "corpus: same"

    def describe(self) -> str:
        if self.corpus:
            other = [f for f in self.facts if f not in self.corpus]
            host = f"; host differs too: {', '.join(other)}" if other else "; host: same"
            return self.describe_corpus() + host
        if self.state == "same":
            what = "host facts" if self.from_facts else "torch, CPU and threads (no host facts)"
            return f"host: same ({what} equal)"
        if self.state == "differs":
            return "host differs: " + ", ".join(self.facts)
        if not self.from_facts:
            return ("host: not established — the report records no host facts, and its torch, "
                    "CPU model name and threads (equal here) do not identify a host")  # fmt: skip
        return "host: not recorded by the report"


@dataclass(frozen=True)
class CodeState:
    """The report's code against this checkout: ``state`` "same", "differs" or "unknown";
    ``recorded``: the report's commit (None: unknown); ``how``: where it comes from;
    ``detail``: what differs."""

    state: str
    recorded: str | None = None
    how: str = ""
    detail: str = ""

    def describe(self) -> str:
        if self.state == "unknown":
            return f"code: unknown ({self.detail})" if self.detail else "code: unknown"
        word = "same as" if self.state == "same" else "differs from"
        text = f"code {word} the report's commit {(self.recorded or '')[:10]} ({self.how})"
        return text + (f": {self.detail}" if self.detail else "")


_FALLBACK = (("torch", "torch"), ("cpu", "CPU"), ("threads", "torch threads per run"))


def compare_hosts(recorded: Mapping[str, Any], here: Mapping[str, Any]) -> HostState:
    """The report's machine (``recorded``: its ``preset.json``) against this one (``here``:
    `concord.lab.presets.report.environment`). The threads per run count with the host facts."""
    old, new = recorded.get("host"), here.get("host")
    if isinstance(old, dict) and isinstance(new, dict):
        found = host_differences(old, new)
        facts = [str(d) for d in found]
        corpus = tuple(str(d) for d in found if d.key.startswith("data."))
        facts += [  # the model name and the threads per run, as the report states them
            f"{label} {recorded.get(key)} → {here.get(key)}"
            for key, label in _FALLBACK[1:]
            if recorded.get(key) is not None and str(recorded.get(key)) != str(here.get(key))
        ]
        return HostState("differs" if facts else "same", tuple(facts), corpus=corpus)
    if recorded.get("torch") is None:
        return HostState("not recorded", from_facts=False)
    facts = [
        f"{label} {recorded.get(key)} → {here.get(key)}"
        for key, label in _FALLBACK
        if str(recorded.get(key)) != str(here.get(key))
    ]
    # equal torch, CPU model name and threads do not make the same host (the name can be a
    # masked "AMD EPYC" over other flags): without facts, sameness is not established
    return HostState("differs" if facts else "not recorded", tuple(facts), from_facts=False)


def _git(cwd: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


def repo_root(path: Path) -> Path | None:
    """The top of the git checkout holding ``path`` (None: not in one, or no git)."""
    try:
        out = _git(path, "rev-parse", "--show-toplevel")
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def code_checkout(code_root: Path | None = None) -> Path:
    """The checkout whose code runs here: ``code_root``, default this concord's."""
    return code_root or Path(__file__).resolve().parents[2]


def compare_code(target: Target, code_root: Path | None = None) -> CodeState:
    """The code of the report in ``target`` against the code at ``code_root`` (default: this
    concord's checkout): the report's ``git_commit``, else the commit that last changed its table;
    "same" when ``git diff`` from that commit to the working tree of ``code_root`` changes no
    code path and no untracked file is new under them; "unknown" when the report records
    ``git_dirty`` (made with uncommitted changes: its commit is not its code)."""
    root = code_checkout(code_root)
    if repo_root(root) is None:
        return CodeState("unknown", detail="this concord is not a git checkout")
    recorded = target.recorded.get("git_commit")
    how = "recorded in preset.json"
    if recorded and target.recorded.get("git_dirty") is True:
        return CodeState("unknown", str(recorded), how,
                         "the report was made with uncommitted changes to its code "
                         f"(git_dirty) on top of {str(recorded)[:10]}")  # fmt: skip
    if not recorded:
        where = repo_root(target.directory)
        if where is None:
            return CodeState("unknown", detail="the report records no commit and is not in git")
        table = target.directory.resolve() / target.csv_name
        out = _git(where, "log", "-1", "--format=%H", "--", str(table))
        recorded = out.stdout.strip()
        how = f"the commit that last changed {target.csv_name}; the report records none"
        if out.returncode != 0 or not recorded:
            return CodeState("unknown", detail="the report records no commit, its table none")
    if _git(root, "cat-file", "-e", f"{recorded}^{{commit}}").returncode != 0:
        return CodeState("unknown", str(recorded), how, "this checkout does not have that commit")
    out = _git(root, "diff", "--name-only", str(recorded), "--", *CODE_PATHS)
    if out.returncode != 0:
        return CodeState("unknown", str(recorded), how, f"git diff failed: {out.stderr.strip()}")
    changed = [line for line in out.stdout.splitlines() if line.strip()]
    status = _git(root, "status", "--porcelain", "--untracked-files=all", "--", *CODE_PATHS)
    untracked = [line[3:] for line in status.stdout.splitlines() if line.startswith("?? ")]
    changed += [f"{name} (untracked)" for name in untracked]
    if not changed:
        return CodeState("same", str(recorded), how)
    head = _git(root, "rev-parse", "HEAD").stdout.strip()[:10]
    dirty = bool(untracked) or (
        _git(root, "diff", "--quiet", "HEAD", "--", *CODE_PATHS).returncode != 0
    )
    shown = ", ".join(changed[:3]) + (f", … ({len(changed)} files)" if len(changed) > 3 else "")
    moved = f"{str(recorded)[:10]} → {head}" + (" with uncommitted changes" if dirty else "")
    return CodeState("differs", str(recorded), how, f"{moved}: {shown}")


_RUNNER = """\
import os
import sys
import concord.lab.cli as cli
worktree = os.path.realpath(sys.argv[1])
if not os.path.realpath(cli.__file__).startswith(worktree + os.sep):
    sys.exit(f"--at-commit: imported {cli.__file__}, not the worktree's code under {worktree}")
sys.argv = ["concord", "report", "verify", *sys.argv[2:]]
cli.main()
"""


_SITECUSTOMIZE = """\
# written by concord report verify --at-commit: import concord from this directory, not from the
# editable install (whose finder the site-packages .pth put ahead of sys.path), in this process
# and in every process it spawns (they inherit PYTHONPATH)
import sys

sys.meta_path[:] = [
    f for f in sys.meta_path
    if "concord" not in getattr(sys.modules.get(getattr(f, "__module__", "")), "MAPPING", {})
]
"""


def _layout(worktree: Path, dest: Path) -> Path:
    """The packages of ``worktree`` under their installed names (``concord``, ``concord.core``
    …) as a tree of symlinks in ``dest``, with a ``sitecustomize`` that drops the editable
    install's finder: a ``PYTHONPATH`` that imports that commit's code instead of this one."""
    farm = dest / "concord"
    farm.mkdir(parents=True)
    (dest / "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
    for entry in (worktree / ROOT_PACKAGE).iterdir():
        (farm / entry.name).symlink_to(entry)
    for layer in LAYER_DIRS:
        if (worktree / layer).is_dir():
            (farm / layer).symlink_to(worktree / layer)
    return dest


def rerun_at_commit(
    target: Target,
    commit: str,
    out_dir: Path,
    *,
    code_root: Path | None = None,
    timeout: float = 3600,
) -> tuple[RunSummary | None, str]:
    """Re-run ``target``'s cell with the code of ``commit`` on this host: check ``commit`` out in
    a temporary ``git worktree`` of the repository of ``code_root`` (`code_checkout`: where
    `compare_code` found the commit), run that commit's ``concord report verify`` on the report
    directory itself into ``out_dir``, and return the re-run's summary (None: it failed) with the
    tail of its output. The worktree is removed at the end. `VerifyError`: no git checkout at
    ``code_root``, the commit cannot be checked out, or ``out_dir`` already holds the run."""
    root = repo_root(code_checkout(code_root))
    if root is None:
        raise VerifyError(f"--at-commit: {code_checkout(code_root)} is not a git checkout")
    if (out_dir / "runs" / target.run.name).exists():
        raise VerifyError(f"--at-commit: {out_dir} already holds runs/{target.run.name}")
    tmp = Path(tempfile.mkdtemp(prefix="concord-at-commit-"))
    worktree = tmp / "worktree"
    added = _git(root, "worktree", "add", "--detach", str(worktree), commit, timeout=300)
    if added.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise VerifyError(f"--at-commit: git worktree add {commit[:10]} failed: "
                          f"{added.stderr.strip()}")  # fmt: skip
    try:
        layout = _layout(worktree, tmp / "layout")
        env = {**os.environ, "PYTHONPATH": str(layout)}
        args = [str(target.directory.resolve()), "--run", target.run.name, "--out", str(out_dir)]
        try:
            done = subprocess.run([sys.executable, "-c", _RUNNER, str(worktree), *args],
                                  cwd=layout, env=env, capture_output=True, text=True,
                                  timeout=timeout, check=False)  # fmt: skip
            output = (done.stdout + done.stderr).strip()
        except subprocess.TimeoutExpired:
            output = f"timed out after {timeout:g} s"
        return read_summary(out_dir / "runs" / target.run.name), output
    finally:
        _git(root, "worktree", "remove", "--force", str(worktree), timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)
        _git(root, "worktree", "prune")


def seed_tolerance(values: Sequence[float], tol_pp: float, k: float) -> float:
    """The tolerance (pp) of a cell whose committed seeds gave ``values`` (fractions): the
    larger of ``tol_pp`` and ``k`` × their sample standard deviation (in pp); ``tol_pp`` with
    fewer than two values."""
    import statistics

    if len(values) < 2:
        return tol_pp
    return max(tol_pp, k * 100 * statistics.stdev(values))
