"""`concord.orchestrator.records`: the run directory's files — line records appended, JSON
documents replaced whole, the manifest and summary documents."""

from __future__ import annotations

import json
from pathlib import Path

from concord.core.config import load_config
from concord.core.control.runplan import make_lr_schedule, make_plan
from concord.core.graphs.adagraph import FeedbackDecision
from concord.core.records import Manifest, OrchestratorSummary, StepRecord
from concord.orchestrator.admission import PeerInfo
from concord.orchestrator.records import RunRecords, manifest, summary
from concord.orchestrator.rounds import RoundRecord


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_line_records_land_in_their_files(tmp_path: Path) -> None:
    out = tmp_path / "run"
    rec = RunRecords(out, graphs=True)
    step = StepRecord(
        step=0,
        epoch=0.0,
        phase=1,
        lr=0.1,
        loss=1.0,
        train_acc=None,
        rounds=1,
        theta=None,
        target=None,
        grad_norm=None,
        bytes_sent=10,
        rounds_total=1,
        peers=2,
    )
    rec.metric(step)
    rnd = RoundRecord("train", 3, 1, 4, 0.5, 0.25, True, None, "above-target", False)
    rec.rounds([rnd])
    rec.schedule({"version": 1})
    d = FeedbackDecision(
        step=5, effective=7, k_from=1, k_to=2, theta=2.0, target=1.0, steps=3, reason="denser"
    )
    rec.graph(d)
    rec.close()
    assert lines(out / "metrics.jsonl") == [step.to_json()]
    assert lines(out / "control.jsonl") == [rnd.to_json()]
    assert lines(out / "schedules.jsonl") == [{"version": 1}]
    assert lines(out / "graphs.jsonl") == [d.to_json()]


def test_no_graphs_file_unless_asked(tmp_path: Path) -> None:
    rec = RunRecords(tmp_path)
    rec.graph(FeedbackDecision(1, 2, 1, 1, None, None, 0, "no-statistics"))  # ignored
    rec.close()
    assert not (tmp_path / "graphs.jsonl").exists()


def test_json_documents_are_replaced_whole(tmp_path: Path) -> None:
    rec = RunRecords(tmp_path)
    rec.write_json("orchestrator.json", {"pid": 1})
    rec.write_json("orchestrator.json", {"pid": 2})
    rec.close()
    assert json.loads((tmp_path / "orchestrator.json").read_text(encoding="utf-8")) == {"pid": 2}
    assert not list(tmp_path.glob("*.tmp"))


def test_manifest_and_summary() -> None:
    cfg = load_config(None, ["peers=4", "epochs=2", "algorithm=ada-feedback"], environ={})
    plan = make_plan(cfg, make_lr_schedule(cfg, 10))
    peers = {i: PeerInfo(address=f"h:{i}", fingerprint="fp") for i in range(4)}
    m = manifest(cfg, "r1", plan, 10, topologies={}, peers=peers)
    assert (m.run, m.engine, m.peers, m.steps) == ("r1", "processes", 4, 20)
    assert m.addresses == {"0": "h:0", "1": "h:1", "2": "h:2", "3": "h:3"}
    assert m.fingerprint == "fp"
    assert {"exponential:1", "exponential:2"} <= set(m.topologies)  # every K it may move to
    # what the orchestrator writes reads back as the same manifest (ISO 8601 ``created``)
    assert Manifest.from_json(json.loads(json.dumps(m.to_json())), where="m") == m
    s = summary(
        "r1",
        peers_done=[0, 1],
        peers_dropped=[2],
        schedule_versions=3,
        rejected_payloads=0,
        stats_ignored=1,
        graph_decisions=None,
        graph_steps_partial=None,
        wall_seconds=1.5,
    )
    assert s.peers_done == [0, 1]
    assert s.cpu_seconds > 0
    assert s.completed is None  # a finished run; an error's summary sets it False
    assert OrchestratorSummary.from_json(s.to_json(), where="s") == s
