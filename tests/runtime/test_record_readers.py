"""`concord.runtime.records`' document readers: a missing file is None, an old document reads
with its old names, a document that does not match its type names the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from concord.core.records import RecordError
from concord.runtime.records import read_orchestrator_summary, read_peer_summary
from tests.records import orchestrator_summary


def test_orchestrator_summary_round_trips_and_is_none_when_missing(tmp_path: Path) -> None:
    assert read_orchestrator_summary(tmp_path) is None
    written = orchestrator_summary(
        peers_done=[0, 1],
        peers_dropped=[2],
        schedule_versions=3,
        completed=False,
        error="boom",
        stage="train",
    )
    (tmp_path / "orchestrator-summary.json").write_text(json.dumps(written.to_json()))
    assert read_orchestrator_summary(tmp_path) == written


def test_a_peer_summary_of_an_older_peer_reads_its_accuracy(tmp_path: Path) -> None:
    old = {"peer": 1, "completed": True, "accuracy": 0.5, "jumps": 0}  # version 0
    (tmp_path / "summary.json").write_text(json.dumps(old))
    summary = read_peer_summary(tmp_path)
    assert summary is not None
    assert summary.accuracy_mean_peer == 0.5
    assert summary.extra == {"jumps": 0}


def test_a_summary_that_does_not_match_names_file_and_field(tmp_path: Path) -> None:
    (tmp_path / "orchestrator-summary.json").write_text(json.dumps({"version": 1, "run": 3}))
    with pytest.raises(RecordError, match=r"orchestrator-summary\.json: field 'run'"):
        read_orchestrator_summary(tmp_path)
