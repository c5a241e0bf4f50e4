"""The algorithm catalog: torch-free, one entry per implementation, and its traits drive config
validation."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from collections.abc import Iterator
from types import MappingProxyType

import pytest

from concord.core import config_run
from concord.core.algorithms import catalog
from concord.core.algorithms.catalog import (
    CAST_CODECS,
    CATALOG,
    ERROR_FEEDBACK_KEYWORDS,
    AlgorithmSpec,
)
from concord.core.config import ALGORITHM_NAMES, CODEC_NAMES, ConfigError, RunConfig, load_config


@pytest.mark.parametrize(
    "module",
    [
        "concord.core.algorithms.catalog",
        "concord.core.algorithms",
        "concord.core.config",
        "concord.core.graphs.adagraph",
    ],
)
def test_catalog_imports_without_torch(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        "from concord.core.algorithms.catalog import CATALOG\n"
        "assert CATALOG['dsgd'].controllable\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", f"{module} pulls in torch"


def test_every_config_name_has_a_spec_and_every_spec_an_implementation() -> None:
    from concord.core.algorithms import ALGORITHMS

    assert tuple(CATALOG) == ALGORITHM_NAMES
    assert set(ALGORITHMS.names()) == set(CATALOG)
    for name, spec in CATALOG.items():
        assert spec.name == name
        cls = spec.load()
        assert ALGORITHMS.get(name) is cls
        assert cls.__dict__["spec"] is spec, f"{cls.__qualname__} refers to another entry"
        assert spec.implementation == f"{cls.__module__}:{cls.__qualname__}"
        assert cls.name == name
        assert cls.uses_gossip is spec.gossip


def test_every_name_the_package_exported_is_still_importable() -> None:
    import concord.core.algorithms as package

    for name in [*package.__all__, "ada", "base", "choco", "detag", "optim", "relay"]:
        assert getattr(package, name) is not None, name
    with pytest.raises(AttributeError):
        package.no_such_name  # noqa: B018


def _constructor_defaults(cls: type) -> Iterator[tuple[str, object]]:
    for p in list(inspect.signature(cls).parameters.values())[1:]:  # after the optimizer
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        assert p.default is not inspect.Parameter.empty, f"{cls.__qualname__}: {p.name}"
        yield p.name, p.default


@pytest.mark.parametrize("name", list(CATALOG))
def test_hyperparameter_defaults_are_the_constructors(name: str) -> None:
    spec = CATALOG[name]
    defaults = dict(_constructor_defaults(spec.load()))
    if spec.codecs == "error-feedback":  # these come from [compression]
        for key in ERROR_FEEDBACK_KEYWORDS:
            defaults.pop(key)
    assert list(defaults.items()) == list(spec.hyper.items())


def test_feedback_defaults_are_feedback_config_defaults() -> None:
    from concord.core.graphs.adagraph import FeedbackConfig

    fields = dataclasses.fields(FeedbackConfig)
    assert dict(CATALOG["ada-feedback"].hyper) == {f.name: f.default for f in fields}


@pytest.mark.parametrize("name", list(CATALOG))
def test_silent_steps_trait_matches_the_implementation(name: str) -> None:
    from concord.core.algorithms import Algorithm

    cls = CATALOG[name].load()
    overrides = cls.silent_steps is not Algorithm.silent_steps
    assert overrides == CATALOG[name].silent_steps


def test_adaptive_graph_lists_are_derived() -> None:
    from concord.core.graphs.adagraph import ADA_ALGORITHMS

    assert ADA_ALGORITHMS == ("ada-schedule", "ada-feedback")
    assert [CATALOG[n].graph_source for n in ADA_ALGORITHMS] == [
        "hyper.graphs",
        "exponential:K moved by Θ feedback",
    ]


def test_spec_invariants() -> None:
    with pytest.raises(ValueError, match="'module:attribute' path"):
        AlgorithmSpec(name="x", title="x", summary="", citation="", implementation="nocolon")
    with pytest.raises(ValueError, match="uncontrolled algorithm admits neither"):
        AlgorithmSpec(
            name="x", title="x", summary="", citation="", implementation="m:C", uncontrolled="no"
        )
    spec = CATALOG["qgm"]
    assert isinstance(spec.hyper, MappingProxyType)  # read-only defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.codecs = "raw"  # type: ignore[misc]
    assert (
        CATALOG["ada-schedule"]
        .check_hyper({"graphz": 1}, 8, 3)[0]
        .startswith("hyper: unknown key(s) ['graphz'] for ada-schedule")
    )
    assert CATALOG["dsgd"].check_hyper({"anything": 1}, 8, 3) == []  # no hook: the constructor


# ---- traits drive validation ---------------------------------------------------------------


def _accepted(*overrides: str) -> bool:
    try:
        load_config(None, ["control.mode=none", *overrides], environ={})
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("name", list(CATALOG))
def test_codecs_accepted_exactly_as_the_spec_admits(name: str) -> None:
    spec = CATALOG[name]
    got = {c for c in CODEC_NAMES if _accepted(f"algorithm={name}", f"compression.codec={c}")}
    assert got == {c for c in CODEC_NAMES if spec.admits(c)}
    assert "none" in got


@pytest.mark.parametrize("name", list(CATALOG))
def test_control_accepted_exactly_when_controllable(name: str) -> None:
    spec = CATALOG[name]
    assert _accepted(f"algorithm={name}", "control.mode=constant") is spec.controllable
    cfg = load_config(None, [f"algorithm={name}"], environ={})  # the default adaptive mode
    assert bool(cfg.controlled_phases()) is spec.controllable


@pytest.mark.parametrize("name", [n for n, s in CATALOG.items() if s.adaptive_graph is None])
def test_topologies_accepted_by_the_graph_traits(name: str) -> None:
    spec = CATALOG[name]
    # AD-PSGD pairs odd with even peers only: its time-varying probe is the bipartite schedule
    # (the one-peer exponential graph's round 1 pairs 0 with 2, refused for that reason)
    probe = "bipartite-exponential" if name == "ad-psgd" else "exponential-one-peer"
    varying = _accepted(f"algorithm={name}", f"topology={probe}")
    assert varying is spec.time_varying
    directed = _accepted(f"algorithm={name}", "topology=exponential-one-peer-directed")
    assert directed is (spec.directed and spec.time_varying)


def _use(monkeypatch: pytest.MonkeyPatch, entries: dict[str, AlgorithmSpec]) -> None:
    """Make the config validator read ``entries`` as the catalog (restored after the test)."""
    view = MappingProxyType(entries)
    monkeypatch.setattr(catalog, "CATALOG", view)
    monkeypatch.setattr(config_run, "CATALOG", view)


def test_a_codec_the_spec_does_not_admit_is_refused_naming_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _accepted("algorithm=dsgd", "compression.codec=fp16")
    entries = dict(CATALOG)
    entries["dsgd"] = dataclasses.replace(CATALOG["dsgd"], codecs="raw")
    _use(monkeypatch, entries)
    with pytest.raises(ConfigError) as info:
        load_config(None, ["algorithm=dsgd", "compression.codec=fp16"], environ={})
    assert (
        "compression.codec 'fp16' does not apply to algorithm 'dsgd': its messages travel as raw "
        "float32 (use 'none')" in str(info.value)
    )
    # a second error-feedback algorithm is offered for lossy codecs too
    entries["qgm"] = dataclasses.replace(CATALOG["qgm"], codecs="error-feedback")
    with pytest.raises(ConfigError, match="use algorithm = 'choco' or algorithm = 'qgm'"):
        load_config(None, ["algorithm=dsgd", "compression.codec=topk"], environ={})
    assert _accepted("algorithm=qgm", "compression.codec=topk")


def test_control_and_topology_traits_are_read_from_the_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entries = dict(CATALOG)
    entries["dsgd"] = dataclasses.replace(
        CATALOG["dsgd"],
        uncontrolled="dsgd is declared uncontrolled here",
        lagged_control=False,
        repeats_rounds=False,
        static_topology="needs a static topology (declared here)",
    )
    entries["sgp"] = dataclasses.replace(CATALOG["sgp"], directed=False)
    entries["gradient-tracking"] = dataclasses.replace(CATALOG["gradient-tracking"], directed=True)
    entries["qgm"] = dataclasses.replace(CATALOG["qgm"], lagged_control=False)
    _use(monkeypatch, entries)
    with pytest.raises(ConfigError, match=r"control\.mode: dsgd is declared uncontrolled here"):
        load_config(None, ["control.mode=constant"], environ={})
    assert RunConfig().controlled_phases() == []
    with pytest.raises(
        ConfigError,
        match="topology 'exponential-one-peer' is time-varying; algorithm 'dsgd' needs a static "
        r"topology \(declared here\)",
    ):
        load_config(None, ["topology=exponential-one-peer"], environ={})
    directed = "topology=exponential-one-peer-directed"
    with pytest.raises(ConfigError, match=r"only algorithm 'gradient-tracking' .* not 'sgp'"):
        load_config(None, ["algorithm=sgp", directed], environ={})
    assert _accepted("algorithm=gradient-tracking", directed)
    with pytest.raises(ConfigError, match=r"control\.lagged: algorithm 'qgm' needs the per-round"):
        load_config(
            None,
            ["algorithm=qgm", "control.mode=adaptive", "control.lagged=true"],
            environ={},
        )


def test_cast_codecs_are_registered_codecs_and_the_only_list() -> None:
    import concord.core.compress as compress

    assert set(CAST_CODECS) <= set(CODEC_NAMES)
    assert not hasattr(compress, "PLAIN_GOSSIP_CODECS")  # one list: the catalog's
