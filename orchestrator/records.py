"""Run records: every file the orchestrator leaves in the run directory (``--out``).

* ``log.jsonl`` — the orchestrator's structured log (`concord.runtime.logs.open_log`, bound with
  run and ``role = "orchestrator"``);
* ``orchestrator.json`` (broker, run, pid), ``manifest.json`` (`manifest`), ``calibration.json``,
  ``orchestrator-summary.json`` (`summary`) — whole JSON documents, replaced atomically
  (`RunRecords.write_json`);
* ``metrics.jsonl`` — run-level per-step and evaluation records (`RunRecords.metric`, fed by
  `concord.orchestrator.metrics.MetricsTable`);
* ``control.jsonl`` — every decided round (`RunRecords.rounds`, from
  `concord.orchestrator.rounds.RoundBook`);
* ``schedules.jsonl`` — every schedule version published (`RunRecords.schedule`);
* ``graphs.jsonl`` — ada-feedback runs only: every graph decision point (`RunRecords.graph`).

The line files are opened (truncated; a resumed run: cut after its step, appended) when
`RunRecords` is made and closed by `RunRecords.close`; ``orchestrator-checkpoint.json`` is
`concord.orchestrator.checkpoint`'s.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from concord.core.config import RunConfig
from concord.core.control.plan import PhasePlan
from concord.core.graphs.adagraph import FeedbackDecision
from concord.core.graphs.topology import describe, exponential_name, max_exponential_k
from concord.core.records import JSON, Manifest, MetricsRecord, OrchestratorSummary, Record
from concord.orchestrator.admission import PeerInfo
from concord.orchestrator.rounds import RoundRecord
from concord.runtime.hostinfo import host_facts
from concord.runtime.lock import DirLock
from concord.runtime.records import truncate_metrics


def _calibration(record: Mapping[str, object]) -> bool:
    return record.get("stage") == "calibrate"


class RunRecords:
    """The run directory's record files (see the module docstring)."""

    def __init__(self, out: Path, *, graphs: bool = False, resume_after: int | None = None) -> None:
        """``resume_after``: a resumed run (`concord.orchestrator.checkpoint`) keeps the lines
        up to that step (schedules: all, they are versions) and appends."""
        self.out = out
        self._lock = DirLock(out, "orchestrator")  # before anything is written
        names = ["metrics", "control", "schedules"] + (["graphs"] if graphs else [])
        if resume_after is not None:
            for name in names:
                if name != "schedules":  # the calibration's rounds stay
                    truncate_metrics(out / f"{name}.jsonl", resume_after, keep=_calibration)
        mode = "w" if resume_after is None else "a"
        files = {n: open(out / f"{n}.jsonl", mode, encoding="utf-8") for n in names}  # noqa: SIM115
        self._metrics: IO[str] = files["metrics"]
        self._control: IO[str] = files["control"]
        self._schedules: IO[str] = files["schedules"]
        self._graphs: IO[str] | None = files.get("graphs")

    def write_json(self, name: str, data: Record | Mapping[str, Any]) -> None:
        """Replace ``name`` with ``data`` (a record: its document) as indented JSON (written
        aside, then renamed)."""
        body = data.to_json() if isinstance(data, Record) else data
        tmp = self.out / f"{name}.tmp"
        tmp.write_text(json.dumps(body, indent=2, default=str) + "\n", encoding="utf-8")
        tmp.replace(self.out / name)

    def metric(self, record: MetricsRecord) -> None:
        """Append a run-level step or evaluation record to ``metrics.jsonl``."""
        self._metrics.write(json.dumps(record.to_json()) + "\n")

    def rounds(self, records: Iterable[RoundRecord]) -> None:
        for rec in records:
            self._control.write(json.dumps(rec.to_json()) + "\n")

    def schedule(self, row: dict[str, Any]) -> None:
        self._schedules.write(json.dumps(row) + "\n")
        self._schedules.flush()

    def graph(self, decision: FeedbackDecision) -> None:
        if self._graphs is not None:
            self._graphs.write(json.dumps(decision.to_json()) + "\n")
            self._graphs.flush()

    def close(self) -> None:
        self._metrics.close()
        self._control.close()
        self._schedules.close()
        if self._graphs is not None:
            self._graphs.close()
        self._lock.release()


def manifest(
    cfg: RunConfig,
    run_id: str,
    plan: PhasePlan,
    steps_per_epoch: int,
    *,
    topologies: Mapping[int, str],
    peers: Mapping[int, PeerInfo],
) -> Manifest:
    """``manifest.json``: the run's shape, the admitted ``peers``' addresses and fingerprint, and
    a description of every topology it may gossip on (``topologies``: the per-phase graphs the
    schedule publishes, adaptive runs), and the orchestrator's host (``host``:
    `concord.runtime.hostinfo.host_facts`; torch-free, so without the ``torch.*`` facts)."""
    names = {
        topologies.get(p.index) or p.topology or cfg.topology
        for p in plan.phases
        if p.mode == "gossip"
    }
    if cfg.spec.adaptive_graph == "feedback":  # every graph K may move to
        names |= {exponential_name(k) for k in range(1, max_exponential_k(cfg.peers) + 1)}
    described: dict[str, JSON] = {
        name: describe(name, cfg.peers, weights=cfg.weights, kappa=cfg.kappa, seed=cfg.seed)
        for name in sorted(names)
    }
    return Manifest(
        engine="processes",
        created=dt.datetime.now(dt.UTC).isoformat(),
        run=run_id,
        peers=cfg.peers,
        steps=plan.total_steps,
        steps_per_epoch=steps_per_epoch,
        plan=plan.to_dict(),
        topologies=described,
        addresses={str(i): p.address for i, p in peers.items()},
        fingerprint=peers[0].fingerprint,
        config=cfg.to_dict(),
        host=host_facts(),
    )


def summary(
    run_id: str,
    *,
    peers_done: list[int],
    peers_dropped: list[int],
    schedule_versions: int,
    rejected_payloads: int,
    stats_ignored: int,
    stats_refused: int = 0,
    handler_errors: int = 0,
    graph_decisions: int | None,
    graph_steps_partial: int | None,
    wall_seconds: float,
) -> OrchestratorSummary:
    """``orchestrator-summary.json``; the CPU time includes an embedded broker's routing."""
    return OrchestratorSummary(
        run=run_id,
        peers_done=peers_done,
        peers_dropped=peers_dropped,
        schedule_versions=schedule_versions,
        rejected_payloads=rejected_payloads,
        stats_ignored=stats_ignored,
        stats_refused=stats_refused,
        control_handler_errors=handler_errors,
        graph_decisions=graph_decisions,
        graph_steps_partial=graph_steps_partial,
        wall_seconds=wall_seconds,
        cpu_seconds=time.process_time(),
    )
