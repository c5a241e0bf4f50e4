"""``concord records schema``: the JSON Schema of the run records, invoked as the click command."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from concord.core.records import RECORD_KINDS, StepRecord
from concord.lab.records_cmd import records


def test_schema_of_one_kind() -> None:
    result = CliRunner().invoke(records, ["schema", "step"])
    assert result.exit_code == 0, result.output
    schema = json.loads(result.output)
    assert schema == StepRecord.json_schema()
    assert schema["properties"]["kind"]["const"] == "step"


def test_schema_of_every_kind_by_name() -> None:
    result = CliRunner().invoke(records, ["schema"])
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.output)) == set(RECORD_KINDS)


def test_schema_to_a_file(tmp_path: Path) -> None:
    out = tmp_path / "summary.schema.json"
    result = CliRunner().invoke(records, ["schema", "summary", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output == ""
    assert "accuracy_avg_model" in json.loads(out.read_text(encoding="utf-8"))["properties"]


def test_unknown_kind_is_refused_with_the_kinds() -> None:
    result = CliRunner().invoke(records, ["schema", "steps"])
    assert result.exit_code == 2
    assert "'steps' is not one of" in result.output
    assert "'checkpoint'" in result.output
