"""Torch-free spec tables: one per kind of named component — codecs, topologies, datasets,
partitioners, models (algorithms have theirs, `concord.core.algorithms.catalog`).

A spec is what a component *is* (its name and traits) without its implementation, so that the
config validator — which the orchestrator runs and which never imports torch — asks a table,
not a list of names: ``name in DATASET_SPECS``. The torch-bound registries of implementations
(`concord.core.data.DATASETS`, `concord.core.models.MODELS`, ...) are linked to their table:
registering an implementation declares its name here, so that

    DATASETS.add("mine", my_loader)
    load_config(None, ["dataset.name=mine"])

is accepted. A name registered this way holds in the process that registered it; what peer
processes must find on their own is a plug-in, ``"module:Name"`` (`concord.core.plugins`).

Traits a kind needs are fields of its spec (a topology's ``time_varying`` and ``directed``); a
plug-in topology declares them by a ``spec`` attribute on its builder (`lookup`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from concord.core.plugins import is_spec, resolve
from concord.core.suggest import closest
from concord.errors import UnknownNameError

__all__ = [
    "CODEC_SPECS",
    "DATASET_SPECS",
    "MODEL_SPECS",
    "PARTITIONER_SPECS",
    "TOPOLOGY_SPECS",
    "CodecSpec",
    "Spec",
    "SpecTable",
    "TopologySpec",
]


@dataclass(frozen=True)
class Spec:
    """A named component: its config name and one line saying what it is."""

    name: str
    summary: str = ""


@dataclass(frozen=True)
class CodecSpec(Spec):
    """A gossip codec (`concord.core.compress`). Lossy codecs (all but the casts) need an
    error-feedback algorithm (`concord.core.algorithms.catalog.CAST_CODECS`)."""

    lossy: bool = True


@dataclass(frozen=True)
class TopologySpec(Spec):
    """A topology family (`concord.core.graphs.topology`)."""

    time_varying: bool = False  # its graph changes from round to round (a schedule)
    directed: bool = False  # column-stochastic matrices: for push-sum algorithms only


S = TypeVar("S", bound=Spec)


class SpecTable(Generic[S]):
    """Ordered name → spec of one kind; ``declare`` adds the default spec of a name that an
    implementation registry registers without declaring it first."""

    def __init__(self, kind: str, factory: type[S], specs: Iterable[S] = ()) -> None:
        self.kind = kind
        self._factory = factory
        self._specs: dict[str, S] = {}
        self._plugins: dict[str, S] = {}
        for spec in specs:
            self.add(spec)

    def add(self, spec: S) -> S:
        """Declare ``spec`` (ValueError if its name is declared already)."""
        if spec.name in self._specs:
            raise ValueError(f"{self.kind} {spec.name!r} is declared twice")
        if not spec.name or is_spec(spec.name):
            raise ValueError(f"{self.kind} name {spec.name!r}: a name has no ':' (plug-ins do)")
        self._specs[spec.name] = spec
        return spec

    def declare(self, name: str) -> S:
        """The spec of ``name``, declaring the default one (no traits) if it is unknown."""
        found = self._specs.get(name)
        return found if found is not None else self.add(self._factory(name))

    def remove(self, name: str) -> None:
        """Forget ``name`` (tests that register a name and clean up)."""
        self._specs.pop(name, None)

    def names(self) -> list[str]:
        return list(self._specs)

    def get(self, name: str) -> S:
        """The spec of a declared name or of a ``module:Name`` plug-in (`lookup`); an
        `UnknownNameError` listing the valid names (and the closest) otherwise."""
        spec = self.lookup(name)
        if spec is None:
            raise UnknownNameError(self.unknown(name))
        return spec

    def lookup(self, name: str) -> S | None:
        """A declared name's spec; for ``"module:Name"`` the plug-in's own (its object is a spec
        of this kind, or carries one as ``spec``) or the default; None if neither."""
        if name in self._specs:
            return self._specs[name]
        if not is_spec(name):
            return None
        if name not in self._plugins:
            obj = resolve(name, self.kind)
            own = obj if isinstance(obj, self._factory) else getattr(obj, "spec", None)
            spec = own if isinstance(own, self._factory) else self._factory(name)
            self._plugins[name] = spec
        return self._plugins[name]

    def unknown(self, name: str, *forms: str) -> str:
        """The message for an unknown ``name``: the closest name, every valid one, ``forms``."""
        close = closest(name, self.names())
        hint = f" (did you mean {close!r}?)" if close else ""
        valid = ", ".join([*self.names(), *forms])
        return f"unknown {self.kind} {name!r}{hint}; valid: {valid}"

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._specs))

    def __len__(self) -> int:
        return len(self._specs)


CODEC_SPECS: SpecTable[CodecSpec] = SpecTable(
    "codec",
    CodecSpec,
    (
        CodecSpec("none", "raw float32", lossy=False),
        CodecSpec("fp16", "IEEE half precision"),
        CodecSpec("bf16", "bfloat16"),
        CodecSpec("int8", "per-tensor symmetric int8 with a float32 scale"),
        CodecSpec("topk", "the m largest magnitudes and their indices"),
        CodecSpec("randomk", "m seeded random coordinates (indices regenerated)"),
        CodecSpec("sign", "ℓ₁-scaled signs, one bit each"),
        CodecSpec("qsgd", "stochastic quantisation to s levels"),
    ),
)

TOPOLOGY_SPECS: SpecTable[TopologySpec] = SpecTable(
    "topology",
    TopologySpec,
    (
        TopologySpec("complete", "every pair linked"),
        TopologySpec("ring", "a cycle"),
        TopologySpec("chain", "a path"),
        TopologySpec("star", "peer 0 linked to all"),
        TopologySpec("torus", "a 2-D torus"),
        TopologySpec("hypercube", "a hypercube (n a power of 2)"),
        TopologySpec("exponential", "links at distances 2^i"),
        TopologySpec("exponential-one-peer", "one exponential peer per round", time_varying=True),
        TopologySpec(
            "exponential-one-peer-directed",
            "one exponential peer per round, pushed one way",
            time_varying=True,
            directed=True,
        ),
        TopologySpec("bipartite-exponential", "bipartite one-peer rounds", time_varying=True),
        TopologySpec("random-matching", "a seeded random matching per round", time_varying=True),
        TopologySpec("binary-tree", "a binary tree"),
        TopologySpec("double-binary-tree", "a binary tree and its mirror"),
    ),
)

DATASET_SPECS: SpecTable[Spec] = SpecTable(
    "dataset",
    Spec,
    (
        Spec("mnist1d", "MNIST-1D, generated"),
        Spec("digits", "8×8 handwritten digits, shipped"),
        Spec("gaussian-mixture", "a generated Gaussian mixture"),
        Spec("cifar10", "CIFAR-10 from dataset.root"),
        Spec("pystdlib-chars", "next character of the Python stdlib's source"),
    ),
)

PARTITIONER_SPECS: SpecTable[Spec] = SpecTable(
    "partition scheme",
    Spec,
    (
        Spec("iid", "uniform random split"),
        Spec("dirichlet", "label shares ~ Dirichlet(alpha)"),
        Spec("sorted", "sorted by label, a fraction shuffled"),
        Spec("shards", "label-sorted shards per peer"),
        Spec("powerlaw", "sizes ∝ (rank + 1)^−exponent"),
        Spec("groups", "the dataset's natural groups"),
    ),
)

MODEL_SPECS: SpecTable[Spec] = SpecTable(
    "model",
    Spec,
    (
        Spec("mlp", "multilayer perceptron"),
        Spec("cnn1d", "1-D convolutional network"),
        Spec("cnn", "2-D convolutional network"),
        Spec("resnet20", "ResNet-20"),
        Spec("char-transformer", "small causal character transformer"),
    ),
)
