"""What is registered, the config accepts; plug-ins ``module:Name`` for every kind.

Each kind has a torch-free spec table (`concord.core.specs`) that its registry of
implementations declares names in; the config validator asks the table. User algorithms and
codecs come from a directory outside the repository (docs/api.md's, `user_plugins`)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from concord.core.algorithms import make_algorithm
from concord.core.algorithms.base import Algorithm
from concord.core.algorithms.catalog import spec_of
from concord.core.algorithms.optim import LocalSGD, SGDConfig
from concord.core.compress import CODECS, NoCodec, make_codec
from concord.core.config import ConfigError, load_config
from concord.core.data import DATASETS, PARTITIONERS
from concord.core.graphs.graph import ring_graph
from concord.core.graphs.topology import (
    DIRECTED_TOPOLOGIES,
    TIME_VARYING,
    TOPOLOGIES,
    Family,
    make_schedule,
    topology_spec,
)
from concord.core.models import MODELS
from concord.core.plugins import PLUGIN_PATH_ENV, PluginError
from concord.core.registry import Registry
from concord.core.specs import (
    CODEC_SPECS,
    DATASET_SPECS,
    MODEL_SPECS,
    PARTITIONER_SPECS,
    TOPOLOGY_SPECS,
    SpecTable,
    TopologySpec,
)
from tests.core.user_plugins import mine_blocks, write_mine

ROOT = Path(__file__).resolve().parents[2]


def _ring_family(n: int, seed: int) -> Family:
    return Family(round_graph=lambda _k: ring_graph(n), period=1, default_weights="metropolis")


# kind → (registry, spec table, the config key, an implementation to register)
KINDS: dict[str, tuple[Registry[Any], SpecTable[Any], str, Any]] = {
    "dataset": (DATASETS, DATASET_SPECS, "dataset.name", lambda seed: None),
    "partitioner": (PARTITIONERS, PARTITIONER_SPECS, "partition.scheme", lambda y, n, seed: []),
    "model": (MODELS, MODEL_SPECS, "model.name", lambda *a, **k: None),
    "topology": (TOPOLOGIES, TOPOLOGY_SPECS, "topology", _ring_family),
    "codec": (CODECS, CODEC_SPECS, "compression.codec", NoCodec),
}


@pytest.fixture
def forget() -> Iterator[Callable[[str, str], None]]:
    """Unregister (registry and table) the names a test registers."""
    names: list[tuple[str, str]] = []
    yield lambda kind, name: names.append((kind, name))
    for kind, name in names:
        registry, table, _, _ = KINDS[kind]
        registry.remove(name)
        table.remove(name)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_registered_name_is_accepted_by_the_config(
    kind: str, forget: Callable[[str, str], None]
) -> None:
    registry, table, key, impl = KINDS[kind]
    extra = ["algorithm=choco"] if kind == "codec" else []  # a lossy codec needs error feedback
    with pytest.raises(ConfigError, match=f"unknown .*'mine-{kind}'"):
        load_config(None, [*extra, f"{key}=mine-{kind}"], environ={})
    forget(kind, f"mine-{kind}")
    registry.add(f"mine-{kind}", impl)
    assert f"mine-{kind}" in table
    cfg = load_config(None, [*extra, f"{key}=mine-{kind}"], environ={})
    section, _, field = key.rpartition(".")
    assert getattr(getattr(cfg, section) if section else cfg, field) == f"mine-{kind}"


def test_a_registered_topology_builds_and_its_declared_traits_are_checked(
    forget: Callable[[str, str], None],
) -> None:
    forget("topology", "mine-ring")
    TOPOLOGIES.add("mine-ring", _ring_family)
    assert make_schedule("mine-ring", 5).graph(0).edges == ring_graph(5).edges
    forget("topology", "mine-varying")
    TOPOLOGY_SPECS.add(TopologySpec("mine-varying", time_varying=True))  # traits first
    TOPOLOGIES.add("mine-varying", _ring_family)
    with pytest.raises(ConfigError, match="'mine-varying' is time-varying; algorithm 'choco'"):
        load_config(None, ["algorithm=choco", "topology=mine-varying"], environ={})
    load_config(None, ["algorithm=dsgd", "topology=mine-varying"], environ={})


def test_topology_traits_are_the_spec_tables() -> None:
    assert tuple(n for n in TOPOLOGY_SPECS if topology_spec(n).time_varying) == TIME_VARYING
    assert DIRECTED_TOPOLOGIES == ("exponential-one-peer-directed",)
    assert set(TIME_VARYING) >= set(DIRECTED_TOPOLOGIES)
    assert not topology_spec("exponential:2").time_varying
    assert list(TOPOLOGIES.names()) == TOPOLOGY_SPECS.names()


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_codecs_do_not_import_the_config() -> None:
    """No upward import inside core: the codec names come from the spec table."""
    for path in (ROOT / "core" / "compress").glob("*.py"):
        assert "concord.core.config" not in _imports(path), path.name
    assert set(CODECS.names()) == set(CODEC_SPECS.names())


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory outside the repository on ``CONCORD_PLUGIN_PATH``, holding docs/api.md's
    ``mine.py``; its modules are forgotten afterwards."""
    directory = tmp_path / "plugins"
    directory.mkdir()
    write_mine(directory)
    monkeypatch.setenv(PLUGIN_PATH_ENV, str(directory))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # resolve() prepends the plug-in path
    return directory


def _drop(*modules: str) -> None:
    for m in modules:
        sys.modules.pop(m, None)


def test_the_api_page_algorithm_is_under_60_lines() -> None:
    assert len(mine_blocks()) == 2
    assert mine_blocks()[0].count("\n") < 60


def test_a_user_algorithm_is_configured_and_built_by_module_and_class(plugin_dir: Path) -> None:
    _drop("mine")
    cfg = load_config(None, ["algorithm=mine:MyAlgo", "hyper.beta=0.7"], environ={})
    assert cfg.spec.title == "damped gossip"
    assert cfg.spec.implementation == "mine:MyAlgo"
    assert not cfg.spec.repeats_rounds
    fixed = ["control.mode=fixed", "control.rounds=2"]
    with pytest.raises(ConfigError, match=r"control\.rounds = 2: algorithm 'mine:MyAlgo'"):
        load_config(None, ["algorithm=mine:MyAlgo", *fixed], environ={})
    opt = LocalSGD(SGDConfig(momentum=0.0, nesterov=False, weight_decay=0.0))
    algo = make_algorithm("mine:MyAlgo", opt, beta=0.7)
    assert isinstance(algo, Algorithm)
    assert algo.beta == 0.7
    with pytest.raises(ValueError, match="hyperparameters \\['gamma'\\] do not fit"):
        make_algorithm("mine:MyAlgo", opt, gamma=0.7)


def test_an_algorithm_spec_plugin_keeps_the_validator_torch_free(plugin_dir: Path) -> None:
    """``algorithm = "module:SPEC"`` names the `AlgorithmSpec` alone (its ``implementation`` the
    class): validating the config imports neither the class's module nor torch."""
    (plugin_dir / "mine_spec.py").write_text(
        "from concord.core.algorithms.catalog import AlgorithmSpec\n\n"
        "SPEC = AlgorithmSpec(name='damped', title='damped gossip', summary='s', citation='c',\n"
        "                     implementation='mine:MyAlgo', repeats_rounds=False)\n"
    )
    script = (
        "import sys\n"
        "from concord.core.config import load_config\n"
        "cfg = load_config(None, ['algorithm=mine_spec:SPEC'], environ={})\n"
        "assert cfg.spec.implementation == 'mine:MyAlgo', cfg.spec\n"
        "assert 'torch' not in sys.modules and 'mine' not in sys.modules\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    _drop("mine", "mine_spec")
    opt = LocalSGD(SGDConfig())
    assert type(make_algorithm("mine_spec:SPEC", opt)).__name__ == "MyAlgo"


def test_a_user_codec_is_configured_and_built_by_module_and_class(plugin_dir: Path) -> None:
    _drop("mine")
    with pytest.raises(ConfigError, match="'mine:MyCodec' is lossy and needs error feedback"):
        load_config(None, ["compression.codec=mine:MyCodec"], environ={})
    cfg = load_config(None, ["algorithm=choco", "compression.codec=mine:MyCodec"], environ={})
    codec = make_codec(cfg.compression.codec)
    x = torch.linspace(-1, 1, 101)
    enc = codec.encode(x, key=0)
    assert enc.codec == "mine:MyCodec"
    assert set(enc.parts) == {"scale", "values"}
    assert torch.allclose(codec.decode(enc, key=0), x, atol=1e-4)
    assert not torch.equal(codec.decode(enc, key=0), x)  # lossy


def test_plugin_errors_name_what_is_wrong_and_where(plugin_dir: Path) -> None:
    _drop("broken", "nospec")
    (plugin_dir / "broken.py").write_text("import torch\n\nclass X:\n    y = undefined_name\n")
    (plugin_dir / "nospec.py").write_text("class X:\n    pass\n")
    with pytest.raises(ConfigError, match=r"broken\.py:4: NameError"):
        load_config(None, ["algorithm=broken:X"], environ={})
    with pytest.raises(ConfigError, match=r"'nospec:X'.* declares no spec = AlgorithmSpec"):
        load_config(None, ["algorithm=nospec:X"], environ={})
    with pytest.raises(PluginError, match=r"is not a concord\.core\.compress\.Codec subclass"):
        make_codec("nospec:X")
    with pytest.raises(ConfigError, match="cannot import module 'absent'"):
        load_config(None, ["topology=absent:ring"], environ={})
    with pytest.raises(KeyError):
        spec_of("not-an-algorithm")


def test_a_user_topology_builder_with_declared_traits(plugin_dir: Path) -> None:
    _drop("mytopo")
    (plugin_dir / "mytopo.py").write_text(
        "from concord.core.graphs.graph import ring_graph\n"
        "from concord.core.specs import TopologySpec\n\n"
        "def ring(n):\n    return ring_graph(n)\n\n"
        "def varying(n):\n    return ring_graph(n)\n\n"
        "varying.spec = TopologySpec('varying', time_varying=True)\n"
    )
    cfg = load_config(None, ["topology=mytopo:ring", "peers=6"], environ={})
    assert make_schedule(cfg.topology, 6).graph(0).edges == ring_graph(6).edges
    with pytest.raises(ConfigError, match="'mytopo:varying' is time-varying"):
        load_config(None, ["algorithm=choco", "topology=mytopo:varying"], environ={})
