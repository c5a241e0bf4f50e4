"""CONTRIBUTING.md's recipes, followed: each test does what a recipe says (or checks the code
still has what the recipe names), so a recipe that no longer matches the code fails here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from concord.core import algorithms
from concord.core.algorithms import ALGORITHMS, CATALOG
from concord.core.compress import CODECS, Codec
from concord.core.compress.quantize import FP16
from concord.core.config import ConfigError, load_config
from concord.core.data import PARTITIONERS
from concord.core.graphs.graph import ring_graph
from concord.core.graphs.topology import TOPOLOGIES, Family, make_schedule
from concord.core.specs import (
    CODEC_SPECS,
    PARTITIONER_SPECS,
    TOPOLOGY_SPECS,
    CodecSpec,
    Spec,
    TopologySpec,
)

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
RECIPES = TEXT[TEXT.index("## Recipes") :]


def recipe(title: str) -> str:
    start = RECIPES.index(f"### {title}")
    end = RECIPES.find("\n### ", start + 1)
    return RECIPES[start : end if end > 0 else None]


# (recipe, the file defining what it names, the name)
NAMED = [
    ("Add an algorithm", "core/algorithms/catalog.py", "AlgorithmSpec"),
    ("Add an algorithm", "core/algorithms/__init__.py", "_SUBMODULES"),
    ("Add an algorithm", "core/algorithms/base.py", "register_algorithm"),
    ("Add a topology", "core/graphs/topology.py", "TOPOLOGIES"),
    ("Add a topology", "core/specs.py", "TOPOLOGY_SPECS"),
    ("Add a partitioner", "core/data/partition.py", "PARTITIONERS"),
    ("Add a partitioner", "core/specs.py", "PARTITIONER_SPECS"),
    ("Add a codec", "core/compress/base.py", "CODECS"),
    ("Add a codec", "core/specs.py", "CODEC_SPECS"),
    ("Add a codec", "peer/serde.py", "CODEC_TO_WIRE"),
]


@pytest.mark.parametrize(("title", "path", "name"), NAMED)
def test_what_a_recipe_names_exists_where_it_says(title: str, path: str, name: str) -> None:
    assert re.search(rf"`@?{name}[`.(]", recipe(title)), (title, name)
    assert re.search(rf"^(def |class )?{name}\b", (ROOT / path).read_text(), re.M), (path, name)


def test_every_path_the_recipes_name_exists() -> None:
    paths = set(re.findall(r"`((?:core|peer|protos|tests|docs)/[\w/.<>-]+)`", RECIPES))
    assert paths
    for p in paths:
        if "<" not in p:
            assert (ROOT / p).exists(), p


def test_algorithm_recipe_every_module_is_in_submodules_and_registered() -> None:
    """Step 3: `_SUBMODULES` lists every module of the package; step 2: each catalog entry's
    class is registered (by `register_algorithm`) once `load_all` imported it."""
    modules = {p.stem for p in (ROOT / "core" / "algorithms").glob("*.py")}
    assert modules - {"__init__", "catalog"} == algorithms._SUBMODULES
    for spec in CATALOG.values():
        module = spec.implementation.split(":")[0].rsplit(".", 1)[-1]
        assert module in algorithms._SUBMODULES, spec.name
    assert set(ALGORITHMS.names()) == set(CATALOG)
    assert all(ALGORITHMS.get(n).spec is CATALOG[n] for n in CATALOG)


@pytest.fixture
def cleanup() -> Iterator[list[tuple[object, object, str]]]:
    done: list[tuple[object, object, str]] = []
    yield done
    for registry, table, name in done:
        registry.remove(name)  # type: ignore[attr-defined]
        table.remove(name)  # type: ignore[attr-defined]


def test_topology_recipe(cleanup: list[tuple[object, object, str]]) -> None:
    """A builder registered in `TOPOLOGIES` with its `TopologySpec`: the config accepts it,
    reads its traits, and `make_schedule` builds it."""

    def build(n: int, seed: int) -> Family:
        return Family(round_graph=lambda _k: ring_graph(n), period=1, default_weights="metropolis")

    cleanup.append((TOPOLOGIES, TOPOLOGY_SPECS, "recipe-ring"))
    TOPOLOGY_SPECS.add(TopologySpec("recipe-ring", "a ring", directed=True))
    TOPOLOGIES.register("recipe-ring")(build)
    with pytest.raises(ConfigError, match="'recipe-ring' is directed"):
        load_config(None, ["topology=recipe-ring"], environ={})
    load_config(None, ["topology=recipe-ring", "algorithm=sgp"], environ={})
    assert make_schedule("recipe-ring", 4).period == 1
    assert set(TOPOLOGIES.names()) == set(TOPOLOGY_SPECS.names())


def test_partitioner_recipe(cleanup: list[tuple[object, object, str]]) -> None:
    cleanup.append((PARTITIONERS, PARTITIONER_SPECS, "recipe-halves"))
    PARTITIONER_SPECS.add(Spec("recipe-halves", "two halves"))
    PARTITIONERS.add("recipe-halves", lambda labels, n, *, seed: [])
    assert load_config(None, ["partition.scheme=recipe-halves"], environ={})
    assert set(PARTITIONERS.names()) == set(PARTITIONER_SPECS.names())


def test_codec_recipe(cleanup: list[tuple[object, object, str]]) -> None:
    """A registered `Codec` subclass with its `CodecSpec`: CHOCO accepts it; every built-in codec
    has its wire value (step 3)."""
    from concord.peer.serde import CODEC_TO_WIRE

    class Half(FP16):
        name = "recipe-half"

    cleanup.append((CODECS, CODEC_SPECS, "recipe-half"))
    CODEC_SPECS.add(CodecSpec("recipe-half", "fp16 again"))
    CODECS.register("recipe-half")(Half)
    with pytest.raises(ConfigError, match="'recipe-half' is lossy"):
        load_config(None, ["compression.codec=recipe-half"], environ={})
    load_config(None, ["compression.codec=recipe-half", "algorithm=choco"], environ={})
    codec: Codec = CODECS.get("recipe-half")()
    assert codec.encode(torch.ones(3), key=0).codec == "recipe-half"
    builtin = set(CODEC_SPECS.names()) - {"recipe-half"}
    assert set(CODEC_TO_WIRE) == builtin
