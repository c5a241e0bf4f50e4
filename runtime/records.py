"""Reading what a run left behind: its metrics records, its summary, a title for its plots; and
cutting a run's line files back to a step for a resumed run (`truncate_metrics`). No torch here:
the orchestrator's side imports this.

The files are written by `concord.runtime.rundir.RunWriter` (layout in docs/architecture.md).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["read_metrics", "read_summary", "run_title"]


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All records of ``run_dir/metrics.jsonl`` in file order.

    Blank lines are skipped. A final line without a trailing newline that does not parse is taken
    to be a record cut short by a crash and is dropped; any other malformed line raises
    ``ValueError`` naming the file and line number.
    """
    path = Path(run_dir) / "metrics.jsonl"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"run_dir {str(run_dir)!r} has no metrics.jsonl ({path})") from None
    lines = text.split("\n")
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):  # last line, no newline after it: truncated by a crash
                break
            raise ValueError(f"{path}:{number}: not a JSON object ({exc.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(
                f"{path}:{number}: expected a JSON object, got {type(record).__name__}"
            )
        records.append(record)
    return records


def read_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """``run_dir/summary.json`` as a dict, or None when the run has not written one (yet)."""
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def run_title(run_dir: str | Path) -> str:
    """Plot title "<algorithm> · <topology> · n=<peers>".

    Fields come from summary.json, else config.toml; only those found are shown, and the
    directory name is the last resort.
    """
    info: dict[str, Any] = {}
    summary = read_summary(run_dir)
    if summary is not None:
        info.update(summary)
    config_path = Path(run_dir) / "config.toml"
    if config_path.is_file():
        try:
            config = tomllib.loads(config_path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError:
            config = {}
        for key in ("algorithm", "topology", "peers"):
            if info.get(key) is None and isinstance(config.get(key), str | int):
                info[key] = config[key]
    parts = [str(info[k]) for k in ("algorithm", "topology") if info.get(k) is not None]
    if info.get("peers") is not None:
        parts.append(f"n={info['peers']}")
    return " · ".join(parts) if parts else Path(run_dir).name


def truncate_metrics(
    path: Path, last_step: int, *, keep: Callable[[dict[str, Any]], bool] | None = None
) -> int:
    """Keep the lines of ``path`` (metrics.jsonl) up to step ``last_step`` (step and eval records
    alike; a torn last line is dropped), and those ``keep`` says to keep whatever their step,
    atomically; returns the lines kept."""
    if not path.is_file():
        return 0
    kept: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        step = record.get("step") if isinstance(record, dict) else None
        kept_anyway = keep is not None and isinstance(record, dict) and keep(record)
        if isinstance(step, int) and step > last_step and not kept_anyway:
            continue
        kept.append(line)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    tmp.replace(path)
    return len(kept)
