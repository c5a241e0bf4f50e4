"""``concord config`` and the generated configuration reference: the committed
docs/configuration.md is exactly what `render_markdown` produces (regenerate with
``concord config doc > docs/configuration.md``), every key has a description, and the
show/schema/doc commands work, naming the key of every problem."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from click.testing import CliRunner

from concord.core.config import RunConfig, build_config
from concord.lab.cli import main
from concord.lab.configdoc import DESCRIPTIONS, config_keys, description, render_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_committed_configuration_reference_is_fresh() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == render_markdown(), (
        "docs/configuration.md is stale: run `concord config doc > docs/configuration.md`"
    )


def test_every_key_has_a_description_and_no_description_is_stale() -> None:
    keys = [k.key for k in config_keys()]
    missing = [k for k in config_keys() if not description(k)]
    assert not missing, f"keys without a description: {[k.key for k in missing]}"
    stale = sorted(set(DESCRIPTIONS) - set(keys))
    assert not stale, f"DESCRIPTIONS names keys RunConfig does not have: {stale}"


def test_reference_lists_every_key_with_its_default() -> None:
    text = render_markdown()
    for item in config_keys():
        if item.section is not None and "." not in item.key:
            assert f"## `[{item.key}]`" in text, item.key  # a section: its own heading
            continue
        short = item.key.rsplit(".", 1)[-1]
        assert f"| `{short}` |" in text, item.key
    assert "| `peers` | integer | `8` |" in text  # RunConfig().peers
    assert "| `factor` | float | `0.25` |" in text  # RunConfig().control.factor
    assert "## `[network.tls]`" in text


def test_show_prints_the_resolved_config_as_loadable_toml(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(main, ["config", "show"])
    assert r.exit_code == 0, r.output
    assert build_config(tomllib.loads(r.output)) == build_config({})

    cfg_file = tmp_path / "run.toml"
    cfg_file.write_text("peers = 4\n[control]\nfactor = 0.5\n", encoding="utf-8")
    r = runner.invoke(main, ["config", "show", str(cfg_file), "--set", "seed=3"])
    assert r.exit_code == 0, r.output
    data = tomllib.loads(r.output)
    assert (data["peers"], data["seed"], data["control"]["factor"]) == (4, 3, 0.5)
    assert data["optim"]["lr"] == RunConfig().optim.lr  # defaults filled in


def test_show_errors_name_the_key() -> None:
    r = CliRunner().invoke(
        main, ["config", "show", "--set", "peers=0", "--set", "control.facto=0.5"]
    )
    assert r.exit_code == 2
    assert "peers" in r.output
    assert "control.facto" in r.output
    assert "did you mean 'factor'" in r.output
    r = CliRunner().invoke(main, ["config", "show", "--set", "novalue"])
    assert r.exit_code == 2
    assert "key=value" in r.output


def test_show_reports_a_missing_file(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["config", "show", str(tmp_path / "absent.toml")])
    assert r.exit_code == 2
    assert "does not exist" in r.output


def test_schema_is_runconfig_json_schema() -> None:
    r = CliRunner().invoke(main, ["config", "schema"])
    assert r.exit_code == 0, r.output
    schema = json.loads(r.output)
    assert schema == json.loads(json.dumps(RunConfig.model_json_schema()))
    assert schema["properties"]["peers"]["default"] == 8


def test_doc_prints_the_reference() -> None:
    r = CliRunner().invoke(main, ["config", "doc"])
    assert r.exit_code == 0, r.output
    assert r.output == render_markdown()
