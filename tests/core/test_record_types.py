"""Typed run records (concord.core.records): round trips, validation errors that name the file,
line and field, old documents read with their old names, newer versions refused, schemas
generated from the declared types."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from typing import Any

import pytest

from concord.core.records import (
    RECORD_KINDS,
    CalibrationRecord,
    CheckpointRunState,
    ControlCheckpointState,
    CounterState,
    EvalRecord,
    Manifest,
    OrchestratorSummary,
    PeerSummary,
    Record,
    RecordError,
    RecordVersionError,
    RunSummary,
    StepRecord,
    metrics_record,
    peer_accuracy,
    peer_loss,
    record_schema,
)


def step_record(**over: Any) -> StepRecord:
    fields: dict[str, Any] = {
        "step": 4,
        "epoch": 0.5,
        "phase": 1,
        "lr": 0.1,
        "loss": 2.25,
        "train_acc": 0.375,
        "rounds": 2,
        "theta": 0.125,
        "target": None,
        "grad_norm": 1.5,
        "bytes_sent": 4096,
        "rounds_total": 9,
    }
    return StepRecord(**{**fields, **over})


def run_summary(**over: Any) -> RunSummary:
    fields: dict[str, Any] = {
        "engine": "vectorized",
        "algorithm": "dsgd",
        "topology": "ring",
        "peers": 4,
        "steps": 10,
        "epochs": 1,
        "seed": 0,
        "plan": "gossip",
        "control_mode": "none",
        "control_factor": None,
        "accuracy_avg_model": 0.5,
        "accuracy_worst_peer": 0.25,
        "accuracy_mean_peer": 0.375,
        "gossip_rounds_total": 10,
        "bytes_sent_total": 100,
        "bytes_raw_total": 200,
        "final_consensus_distance": 0.01,
        "partition_sha256": "ab",
        "wall_seconds": 1.5,
        "run_dir": "runs/x",
    }
    return RunSummary(**{**fields, **over})


EXAMPLES: list[Record] = [
    step_record(xi=0.5, graph="exponential:2", graph_k=2, extra={"step_ms": 3.5, "missing": [1]}),
    EvalRecord(step=9, epoch=1.0, xi=0.25, accuracy_avg_model=0.5, accuracy_mean_peer=0.4),
    run_summary(),
    run_summary(engine="processes", peers_completed=[0, 1], children_failed={"peer-2": 1}),
    PeerSummary(completed=True, peer=2, steps=10, bytes_per_edge=[{"src": 0, "dst": 1}]),
    CheckpointRunState(
        engine="peer",
        next_step=5,
        total_steps=10,
        rounds_total=5,
        counters=CounterState(
            bytes_raw=8, bytes_wire=4, messages=2, rounds=5, edges=[(0, 1, 8, 4)]
        ),
        controller={"targets": [0.5, None]},
        peer=3,
        config="seed = 1\n",
    ),
    ControlCheckpointState(
        config="seed = 1\n",
        steps_per_epoch=10,
        step_base=3,
        calibration={"statistic": "theta", "max_statistic": {"1": 1.0}},
        controller={"4": {"targets": [0.5, None]}, "9": {"targets": [0.25, None]}},
    ),
    Manifest(
        engine="vectorized",
        created="2025-01-01T00:00:00+00:00",
        peers=4,
        steps=10,
        steps_per_epoch=5,
        plan={"phases": []},
        topologies={"ring": {"lambda2": 0.5}},
        fingerprint="ff",
    ),
    OrchestratorSummary(
        run="r-1",
        peers_done=[0, 1],
        peers_dropped=[],
        schedule_versions=1,
        rejected_payloads=0,
        stats_ignored=0,
        stats_refused=0,
        control_handler_errors=0,
        graph_decisions=None,
        graph_steps_partial=None,
        wall_seconds=2.0,
        cpu_seconds=1.0,
    ),
    CalibrationRecord(statistic="xi", max_statistic={"1": 2.5, "3": 0.25}),
]


@pytest.mark.parametrize("record", EXAMPLES, ids=lambda r: type(r).__name__)
def test_round_trip_through_json_text(record: Record) -> None:
    text = json.dumps(record.to_json())
    body = json.loads(text)
    assert body["version"] == type(record).VERSION
    assert type(record).from_json(body, where="f.json") == record


def test_record_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        step_record().step = 5  # type: ignore[misc]


def test_metrics_lines_carry_their_kind_and_dispatch_on_it() -> None:
    step, ev = step_record(), EvalRecord(step=4, epoch=0.5, accuracy_avg_model=0.5)
    assert step.to_json()["kind"] == "step"
    assert ev.to_json()["kind"] == "eval"
    assert metrics_record(step.to_json(), where="m") == step
    assert metrics_record(ev.to_json(), where="m") == ev
    with pytest.raises(RecordError, match=r"m\.jsonl:3: field 'kind': 'calibration'"):
        metrics_record({"kind": "calibration", "step": 1}, where="m.jsonl:3")


def test_step_extra_is_written_flat_and_read_back_into_extra() -> None:
    body = step_record(extra={"step_ms": 2.5, "stage": "train"}).to_json()
    assert body["step_ms"] == 2.5
    assert body["stage"] == "train"
    assert "extra" not in body
    assert StepRecord.from_json(body, where="m").extra == {"step_ms": 2.5, "stage": "train"}


def test_extra_may_not_shadow_a_field() -> None:
    with pytest.raises(RecordError, match=r"field 'extra': keys \['loss'\] shadow"):
        step_record(extra={"loss": 1.0}).to_json()


def test_optional_fields_left_unset_are_not_written() -> None:
    body = step_record().to_json()
    assert "xi" not in body
    assert "graph" not in body
    assert "peer" not in body
    assert body["target"] is None  # a required field is written even when None


def test_nan_survives_a_round_trip() -> None:
    body = json.loads(json.dumps(step_record(loss=math.nan).to_json()))
    loss = StepRecord.from_json(body, where="m").loss
    assert loss is not None
    assert math.isnan(loss)


@pytest.mark.parametrize(
    ("body", "field", "problem"),
    [
        ({"step": "4"}, "step", "valid integer"),
        ({"step": True}, "step", "valid integer"),
        ({"rounds": 1.5}, "rounds", "valid integer"),
        ({"graph_k_peers": [1, "x"]}, "graph_k_peers.1", "valid integer"),
    ],
)
def test_bad_field_names_file_line_and_field(
    body: dict[str, Any], field: str, problem: str
) -> None:
    doc = {**step_record().to_json(), **body}
    with pytest.raises(RecordError, match=problem) as info:
        StepRecord.from_json(doc, where="run/metrics.jsonl:12")
    assert info.value.where == "run/metrics.jsonl:12"
    assert info.value.field == field
    assert str(info.value).startswith(f"run/metrics.jsonl:12: field {field!r}:")


def test_missing_and_unknown_fields_are_named() -> None:
    doc = step_record().to_json()
    del doc["loss"]
    with pytest.raises(RecordError, match="field 'loss': missing"):
        StepRecord.from_json(doc, where="m:1")
    doc = {**run_summary().to_json(), "accuracy": 0.5}
    with pytest.raises(RecordError, match="field 'accuracy': not a field of a version-1 summary"):
        RunSummary.from_json(doc, where="summary.json")


def test_not_an_object() -> None:
    with pytest.raises(RecordError, match=r"summary\.json: expected a JSON object, got list"):
        RunSummary.from_json([1], where="summary.json")


def test_newer_version_is_refused_naming_it() -> None:
    doc = {**run_summary().to_json(), "version": RunSummary.VERSION + 1}
    with pytest.raises(RecordVersionError, match="a version-2 summary record") as info:
        RunSummary.from_json(doc, where="run/summary.json")
    assert info.value.field == "version"


def test_bad_version_value() -> None:
    with pytest.raises(RecordError, match="field 'version': '1' is not a record version"):
        RunSummary.from_json({**run_summary().to_json(), "version": "1"}, where="s")


def test_old_eval_record_reads_with_canonical_names() -> None:
    old = {"kind": "eval", "step": 9, "epoch": 1.0, "xi": 0.5, "acc_avg_model": 0.75}
    old |= {"loss_avg_model": 0.5, "acc_mean_peer": 0.5, "acc_worst_peer": 0.25}
    old |= {"acc_best_peer": 0.875, "loss_mean_peer": 1.0}
    ev = EvalRecord.from_json(old, where="m")
    assert (ev.accuracy_avg_model, ev.accuracy_mean_peer) == (0.75, 0.5)
    assert (ev.accuracy_worst_peer, ev.accuracy_best_peer) == (0.25, 0.875)


def test_old_peer_eval_record_reads_its_accuracy_as_the_mean_peer() -> None:
    old = {"kind": "eval", "step": 9, "peer": 2, "accuracy": 0.5, "loss": 1.25, "epoch": 1.0}
    ev = EvalRecord.from_json(old, where="m")
    assert (ev.peer, ev.accuracy_mean_peer, ev.loss_mean_peer) == (2, 0.5, 1.25)


def test_old_names_are_not_read_in_a_versioned_record() -> None:
    doc = {**EvalRecord(step=1, epoch=1.0).to_json(), "acc_avg_model": 0.5}
    with pytest.raises(RecordError, match="field 'acc_avg_model': not a field"):
        EvalRecord.from_json(doc, where="m")


def test_old_peer_summary_reads_its_accuracy() -> None:
    old = {"engine": "processes", "peer": 1, "completed": True, "accuracy": 0.5, "jumps": 0}
    s = PeerSummary.from_json(old, where="peers/peer-1/summary.json")
    assert s.accuracy_mean_peer == 0.5
    assert s.extra == {"jumps": 0}


def test_old_manifests_read() -> None:
    shape = {"peers": 2, "steps": 4, "steps_per_epoch": 2, "plan": {}, "topologies": {}}
    vectorized = Manifest.from_json(
        {**shape, "created": "2025-01-01T00:00:00+00:00", "fingerprint": "f", "seed": 0},
        where="manifest.json",
    )
    assert vectorized.engine == "vectorized"
    orchestrated = Manifest.from_json(
        {**shape, "run": "r", "engine": "processes", "created": 0.0, "fingerprint": "f"},
        where="manifest.json",
    )
    assert orchestrated.created == "1970-01-01T00:00:00+00:00"


def test_checkpoint_state_finished() -> None:
    counters = CounterState(bytes_raw=0, bytes_wire=0, messages=0, rounds=0, edges=[])
    state = CheckpointRunState(
        engine="vectorized", next_step=10, total_steps=10, rounds_total=0, counters=counters
    )
    assert state.finished
    assert not dataclasses.replace(state, next_step=9).finished


def test_peer_accuracy_reads_both_names() -> None:
    assert peer_accuracy({"accuracy_mean_peer": 0.5}) == 0.5
    assert peer_accuracy({"accuracy": 0.25}) == 0.25
    assert peer_accuracy({"loss": 1.0}) is None


def test_peer_loss_reads_both_names() -> None:
    assert peer_loss({"loss_mean_peer": 0.5, "loss": 9.0}) == 0.5
    assert peer_loss({"loss": 0.25}) == 0.25
    assert peer_loss({"loss": math.nan}) is None
    assert peer_loss({"accuracy": 1.0}) is None


def test_control_checkpoint_lists_its_steps_and_reads_the_version_1_file() -> None:
    # orchestrator-checkpoint.json has carried "version": 1 since before records were typed
    old = {
        "version": 1,
        "config": "seed = 1\n",
        "steps_per_epoch": 10,
        "step_base": 0,
        "calibration": None,
        "controller": {"4": {"ema": 0.5}, "14": {"ema": 0.25}},
    }
    state = ControlCheckpointState.from_json(old, where="orchestrator-checkpoint.json")
    assert state.steps == {4, 14}
    with pytest.raises(RecordError, match=r"field 'controller\.4'"):
        ControlCheckpointState.from_json({**old, "controller": {"4": 1}}, where="c")


@pytest.mark.parametrize("kind", sorted(RECORD_KINDS))
def test_schema_is_generated_from_the_declared_fields(kind: str) -> None:
    cls = RECORD_KINDS[kind]
    schema = record_schema(kind)
    props = schema["properties"]
    assert isinstance(props, dict)
    declared = {f.name for f in dataclasses.fields(cls)} - {"extra"}  # type: ignore[arg-type]
    head = {"version"} | ({"kind"} if cls.TAG else set())
    assert set(props) == declared | head
    assert props["version"] == {"const": cls.VERSION, "title": "Version", "type": "integer"}
    open_ended = any(f.name == "extra" for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    assert schema["additionalProperties"] is open_ended


@pytest.mark.parametrize("record", EXAMPLES, ids=lambda r: type(r).__name__)
def test_written_documents_validate_against_their_schema(record: Record) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(json.dumps(record.to_json())), type(record).json_schema())
    bad = {**record.to_json(), "version": "x"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, type(record).json_schema())


def test_unknown_kind_lists_the_kinds() -> None:
    with pytest.raises(KeyError, match="one of step, eval, summary"):
        record_schema("steps")


def test_records_module_is_torch_free() -> None:
    code = "import sys, concord.core.records; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
