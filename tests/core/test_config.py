"""Config: defaults, layering, and errors that name every bad key at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from concord.core.algorithms.catalog import spec_of
from concord.core.config import (
    ALGORITHM_NAMES,
    DATASET_NAMES,
    MODEL_NAMES,
    PARTITION_NAMES,
    ConfigError,
    RunConfig,
    apply_overrides,
    env_overrides,
    load_config,
    parse_overrides,
    parse_value,
    to_toml,
)


def test_defaults_validate() -> None:
    cfg = load_config(None, environ={})
    assert cfg.peers == 8
    assert cfg.topology == "ring"
    assert cfg.algorithm == "dsgd"
    assert cfg.dataset.name == "mnist1d"
    assert cfg.phase_modes() == ["gossip", "gossip", "gossip"]


def test_file_env_and_overrides_layer_in_order(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('peers = 4\ntopology = "torus"\n[control]\nmode = "adaptive"\nfactor = 2.0\n')
    cfg = load_config(
        path,
        ["control.factor=0.5", "dataset=digits"],
        environ={"CONCORD_PEERS": "16", "CONCORD_CACHE": "/x"},
    )
    assert cfg.peers == 16  # environment beats the file
    assert cfg.topology == "torus"
    assert cfg.control.mode == "adaptive"
    assert cfg.control.factor == 0.5  # --set beats everything
    assert cfg.dataset.name == "digits"


def test_every_problem_is_reported_with_its_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        'peers = 0\ntopology = "rign"\nalgorithm = "sgdd"\nepoch = 3\n'
        '[control]\nmode = "sometimes"\nfactor = -1\n'
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    keys = {k for k, _ in info.value.problems}
    assert {"peers", "topology", "algorithm", "epoch", "control.mode", "control.factor"} <= keys
    text = str(info.value)
    assert "did you mean 'ring'" in text
    assert "did you mean 'epochs'" in text
    assert str(path) in text


def test_cross_field_problems() -> None:
    with pytest.raises(ConfigError, match="phase 4 does not exist"):
        load_config(None, ["control.mode=constant", "control.phases=[4]"], environ={})
    with pytest.raises(ConfigError, match="uses exact averaging"):
        load_config(
            None, ["control.mode=constant", "plan=dec-phase-2", "control.phases=[1]"], environ={}
        )
    with pytest.raises(ConfigError, match="only 3 phases"):
        load_config(None, ["plan=dec-phase-4"], environ={})
    with pytest.raises(ConfigError, match="unknown plan"):
        load_config(None, ["plan=dec-phase-x"], environ={})
    with pytest.raises(ConfigError, match="all-reduce has no consensus distance"):
        load_config(None, ["algorithm=allreduce", "control.mode=adaptive"], environ={})
    with pytest.raises(ConfigError, match="lag = 2 only applies to lagged control"):
        load_config(None, ["control.lag=2"], environ={})
    assert load_config(None, ["control.lagged=true", "control.lag=2"], environ={}).control.lag == 2


def test_fixed_rounds_config_errors_name_the_key() -> None:
    cfg = load_config(None, ["control.mode=fixed", "control.rounds=3"], environ={})
    assert (cfg.control.mode, cfg.control.rounds, cfg.controlled_phases()) == ("fixed", 3, [1])
    assert load_config(None, ["control.mode=fixed"], environ={}).control.rounds == 1
    with pytest.raises(ConfigError) as info:
        load_config(None, ["control.rounds=2"], environ={})  # the default mode is adaptive
    assert [k for k, _ in info.value.problems] == ["control"]
    assert "rounds = 2 only applies to mode = 'fixed' (mode 'adaptive'" in str(info.value)
    with pytest.raises(ConfigError, match="rounds = 2 only applies to mode = 'fixed'"):
        load_config(None, ["control.mode=constant", "control.rounds=2"], environ={})
    with pytest.raises(ConfigError, match="rounds = 9 exceeds max_rounds = 8"):
        load_config(
            None, ["control.mode=fixed", "control.rounds=9", "control.max_rounds=8"], environ={}
        )
    with pytest.raises(ConfigError) as info:
        load_config(None, ["control.mode=fixed", "control.rounds=0"], environ={})
    assert [k for k, _ in info.value.problems] == ["control.rounds"]
    with pytest.raises(ConfigError, match="a fixed number of gossip rounds needs a gossip phase"):
        load_config(None, ["control.mode=fixed", "plan=dec-phase-2"], environ={})
    # the resolved file of any run (rounds = 1 written out) loads back into the same run
    import tomllib

    for extra in ([], ["control.mode=fixed", "control.rounds=4", "control.lagged=true"]):
        cfg = load_config(None, extra, environ={})
        assert RunConfig.model_validate(tomllib.loads(to_toml(cfg))) == cfg


@pytest.mark.parametrize("name", ALGORITHM_NAMES)
def test_fixed_rounds_refused_by_algorithms_that_never_repeat_a_round(name: str) -> None:
    spec = spec_of(name)
    overrides = [f"algorithm={name}", "control.mode=fixed", "control.rounds=2"]
    if spec.controllable and spec.repeats_rounds:
        assert load_config(None, overrides, environ={}).controlled_phases() == [1]
        return
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides, environ={})
    text = str(info.value)
    if spec.uncontrolled is not None:  # the path that refuses every explicit mode
        assert f"control.mode: {spec.uncontrolled}" in text
        assert "mode 'fixed' does not apply either" in text
    else:  # consensus control applies (θ reported once per step), repeated rounds do not
        assert f"control.rounds = 2: algorithm {name!r} ({spec.title})" in text
        assert "repeats_rounds = false" in text
        one = load_config(None, [f"algorithm={name}", "control.mode=fixed"], environ={})
        assert one.controlled_phases() == [1]  # one round per step: what it runs anyway


def test_default_control_is_inert_where_it_cannot_apply() -> None:
    cfg = load_config(None, ["algorithm=allreduce"], environ={})
    assert cfg.control.mode == "adaptive"
    assert cfg.controlled_phases() == []
    cfg = load_config(None, ["plan=dec-phase-2"], environ={})
    assert cfg.controlled_phases() == []
    assert load_config(None, [], environ={}).controlled_phases() == [1]
    again = apply_overrides(cfg, {"plan": "gossip"})  # defaults stay defaults when re-validated
    assert again.controlled_phases() == [1]


def test_bad_override_syntax_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["peers"], environ={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", environ={})
    bad = tmp_path / "broken.toml"
    bad.write_text("peers = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, environ={})


def test_edge_list_topology_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(None, [f"topology=file:{tmp_path / 'edges.txt'}"], environ={})


def test_plan_presets_expand() -> None:
    cfg = load_config(None, ["plan=dec-phase-2"], environ={})
    assert cfg.phase_modes() == ["exact", "gossip", "exact"]
    cfg = load_config(None, ['plan=["gossip", "exact", "exact"]'], environ={})
    assert cfg.phase_modes() == ["gossip", "exact", "exact"]


def test_toml_round_trip() -> None:
    cfg = load_config(
        None,
        [
            "control.mode=constant",
            "control.factor=0.25",
            "dataset.samples=2000",
            "partition=dirichlet",
            "partition.alpha=0.1",
        ],
        environ={},
    )
    import tomllib

    again = RunConfig.model_validate(tomllib.loads(to_toml(cfg)))
    assert again == cfg
    assert apply_overrides(cfg, {"seed": 3}).seed == 3


def test_parse_value_and_env() -> None:
    assert parse_value("0.5") == 0.5
    assert parse_value("[1, 2]") == [1, 2]
    assert parse_value("ring") == "ring"
    assert parse_value("true") is True
    assert env_overrides({"CONCORD_CONTROL__FACTOR": "0.5", "CONCORD_DATA": "/d"}) == {
        "control.factor": 0.5
    }


def test_config_names_match_registries() -> None:
    from concord.core.algorithms import ALGORITHMS
    from concord.core.data import DATASET_NAMES as DATA_IMPL
    from concord.core.data import PARTITION_NAMES as PART_IMPL
    from concord.core.models import MODEL_NAMES as MODEL_IMPL

    assert set(ALGORITHM_NAMES) == set(ALGORITHMS.names())
    assert set(DATASET_NAMES) == set(DATA_IMPL)
    assert set(PARTITION_NAMES) == set(PART_IMPL)
    assert set(MODEL_NAMES) == set(MODEL_IMPL)


def test_the_readme_configuration_example_is_a_valid_config() -> None:
    """README's "Configuration" TOML block is what users copy: every key in it must exist in its
    section (a key placed after a table header silently belongs to that table)."""
    import tomllib

    from concord.core.config import build_config

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Configuration") :]
    block = section.split("```toml\n", 1)[1].split("```", 1)[0]
    cfg = build_config(tomllib.loads(block))
    assert cfg.engine == "processes"
    assert cfg.compression.levels == 16
    assert cfg.control.lag == 1


def test_the_torch_data_plane_refuses_what_it_cannot_keep() -> None:
    """``network.transport = "torch"``: unencrypted, and every peer must run the same rounds."""
    with pytest.raises(ConfigError, match="gloo/NCCL traffic unencrypted"):
        load_config(
            None,
            ["network.transport=torch", 'network.tls={ca = "c", cert = "c", key = "k"}'],
            environ={},
        )
    with pytest.raises(ConfigError, match="ada-feedback"):
        load_config(None, ["network.transport=torch", "algorithm=ada-feedback"], environ={})
    with pytest.raises(ConfigError, match=r"network\.torch\.init"):
        load_config(None, ["network.torch.init=udp://x:1"], environ={})
    cfg = load_config(None, ["network.transport=torch"], environ={})
    assert (cfg.network.torch.backend, cfg.network.torch.init) == ("auto", "auto")


def test_none_unsets_an_optional_key_and_stays_a_value_where_it_is_one() -> None:
    cfg = load_config(None, ["optim.clip_norm=2"], environ={})
    assert cfg.optim.clip_norm == 2.0
    for word in ("none", "null", "None"):
        unset = apply_overrides(cfg, parse_overrides([f"optim.clip_norm={word}"]))
        assert unset.optim.clip_norm is None
    # "none" is a codec and a control mode: a value, not "unset"
    cfg = load_config(None, ["compression.codec=none", "control.mode=none"], environ={})
    assert (cfg.compression.codec, cfg.control.mode) == ("none", "none")
    with pytest.raises(ConfigError, match=r"optim\.lr"):  # a required number: still an error
        load_config(None, ["optim.lr=none"], environ={})
