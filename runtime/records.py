"""Reading what a run left behind: its metrics records, its summary and manifest (typed:
`concord.core.records`), a title for its plots; and cutting a run's line files back to a step
for a resumed run (`truncate_metrics`). No torch here: the orchestrator's side imports this.

The files are written by `concord.runtime.rundir.RunWriter` (layout in docs/architecture.md,
fields in docs/records.md). Every reader validates: a record that does not match its type raises
`concord.core.records.RecordError` naming the file, the line and the field.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from concord.core.records import (
    EvalRecord,
    Manifest,
    MetricsRecord,
    OrchestratorSummary,
    PeerSummary,
    Record,
    RunSummary,
    StepRecord,
    metrics_record,
)

__all__ = [
    "read_evals",
    "read_manifest",
    "read_metrics",
    "read_orchestrator_summary",
    "read_peer_summary",
    "read_steps",
    "read_summary",
    "run_title",
]

R = TypeVar("R", bound=Record)


def read_metrics(run_dir: str | Path) -> list[MetricsRecord]:
    """All records of ``run_dir/metrics.jsonl`` in file order.

    Blank lines are skipped. A final line without a trailing newline that does not parse is taken
    to be a record cut short by a crash and is dropped; any other malformed line raises
    ``ValueError`` naming the file and line number (`RecordError` for a record that parses but
    does not match its type).
    """
    path = Path(run_dir) / "metrics.jsonl"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"run_dir {str(run_dir)!r} has no metrics.jsonl ({path})") from None
    lines = text.split("\n")
    records: list[MetricsRecord] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):  # last line, no newline after it: truncated by a crash
                break
            raise ValueError(f"{path}:{number}: not a JSON object ({exc.msg})") from None
        records.append(metrics_record(record, where=f"{path}:{number}"))
    return records


def read_steps(run_dir: str | Path) -> list[StepRecord]:
    """The step records of ``run_dir/metrics.jsonl`` (`read_metrics`)."""
    return [r for r in read_metrics(run_dir) if isinstance(r, StepRecord)]


def read_evals(run_dir: str | Path) -> list[EvalRecord]:
    """The evaluation records of ``run_dir/metrics.jsonl`` (`read_metrics`)."""
    return [r for r in read_metrics(run_dir) if isinstance(r, EvalRecord)]


def read_record(path: Path, kind: type[R]) -> R | None:
    """The JSON document ``path`` as a ``kind`` record, or None when there is no such file.
    Raises `RecordError` (a ValueError) naming the file and field when it does not match."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    return kind.from_json(data, where=str(path))


def read_summary(run_dir: str | Path) -> RunSummary | None:
    """``run_dir/summary.json``, or None when the run has not written one (yet)."""
    return read_record(Path(run_dir) / "summary.json", RunSummary)


def read_peer_summary(peer_dir: str | Path) -> PeerSummary | None:
    """A peer's ``summary.json`` (``peers/peer-i/``), or None when it wrote none (yet)."""
    return read_record(Path(peer_dir) / "summary.json", PeerSummary)


def read_manifest(run_dir: str | Path) -> Manifest | None:
    """``run_dir/manifest.json``, or None when the run has not written one (yet)."""
    return read_record(Path(run_dir) / "manifest.json", Manifest)


def read_orchestrator_summary(run_dir: str | Path) -> OrchestratorSummary | None:
    """``run_dir/orchestrator-summary.json`` (processes runs), or None when there is none."""
    return read_record(Path(run_dir) / "orchestrator-summary.json", OrchestratorSummary)


def run_title(run_dir: str | Path) -> str:
    """Plot title "<algorithm> · <topology> · n=<peers>".

    Fields come from summary.json, else config.toml; only those found are shown, and the
    directory name is the last resort.
    """
    info: dict[str, str | int | None] = {}
    summary = read_summary(run_dir)
    if summary is not None:
        info.update(algorithm=summary.algorithm, topology=summary.topology, peers=summary.peers)
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
    path: Path, last_step: int, *, keep: Callable[[Mapping[str, object]], bool] | None = None
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
