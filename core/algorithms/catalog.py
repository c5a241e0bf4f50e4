"""The algorithm catalog: what each algorithm *is* — name, one-line summary, citation, traits and
default hyperparameters — as data, torch-free.

The config validator (`concord.core.config`, which the orchestrator runs and which must never
import torch), the step driver (`concord.core.loop`) and the engines read an algorithm's traits
from its `AlgorithmSpec` here instead of testing its name against lists. The implementation (a
torch-bound `concord.core.algorithms.base.Algorithm` subclass) is named by a ``"module:Class"``
string, loaded on demand (`AlgorithmSpec.load`); each implementation refers back to its entry
(``spec = CATALOG["dsgd"]``), from which it takes its ``name`` and ``uses_gossip``, and
registering it checks that both agree (`concord.core.algorithms.base.register_algorithm`).

Every entry lives in this one module (not in per-algorithm ``spec`` modules): the algorithm
modules import torch, and a second file per algorithm would only split one table over fifteen
files. A new algorithm adds one `AlgorithmSpec` here and its implementation module; the tests
(``tests/core/test_catalog.py``) check that both exist and agree.

Codec rules (``[compression]``, `concord.core.compress`). `CAST_CODECS` are the casts plain gossip
may travel as (a replica keeps its own full-precision remainder, `concord.core.algorithms.base`);
every other codec is lossy and needs error feedback. Each spec admits one of:

* ``"raw"`` — raw float32 only (``none``): all-reduce, and algorithms whose messages are per-edge
  or push-sum frames that are not cast;
* ``"casts"`` — ``none``, ``fp16``, ``bf16`` (plain gossip);
* ``"error-feedback"`` — every codec: the algorithm applies ``compression.codec`` itself, with
  error feedback, and takes `ERROR_FEEDBACK_KEYWORDS` from ``[compression]`` (CHOCO-SGD).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal, cast

from concord.core.plugins import PluginError, is_spec, resolve

__all__ = [
    "CAST_CODECS",
    "CATALOG",
    "ERROR_FEEDBACK_KEYWORDS",
    "AdaptiveGraph",
    "AlgorithmSpec",
    "CodecUse",
    "HyperCheck",
    "adaptive_graph_algorithms",
    "asynchronous_algorithms",
    "overlap_algorithms",
    "plugin_spec",
    "spec_of",
]

CodecUse = Literal["raw", "casts", "error-feedback"]
AdaptiveGraph = Literal["schedule", "feedback"]
# (algorithm, [hyper] table, peers, phases) -> every problem of the table (empty: valid)
HyperCheck = Callable[[str, Mapping[str, Any], int, int], list[str]]

CAST_CODECS: tuple[str, ...] = ("none", "fp16", "bf16")  # plain gossip, no error feedback needed
ERROR_FEEDBACK_KEYWORDS: tuple[str, ...] = ("codec", "gamma")  # from [compression]: codec, gamma

_GRAPH_SOURCES: dict[str, str] = {
    "schedule": "hyper.graphs",
    "feedback": "exponential:K moved by Θ feedback",
}


def _frozen(d: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm: identity, traits and hyperparameters (module docstring).

    Traits whose absence must be explained to the user are the *reason* text (None: the trait
    does not restrict): the config validator quotes it, so one string states both the rule and
    its message.
    """

    name: str  # the config name (``algorithm = "..."``)
    title: str  # how prose names it ("D-SGD", "all-reduce")
    summary: str  # one line: what a step does
    citation: str  # the paper(s) and the docs/algorithms.md section
    implementation: str  # "module:Class" of the Algorithm subclass (torch-bound, loaded lazily)
    # communication ----------------------------------------------------------------------------
    gossip: bool = True  # False: no gossip by default; phases' topologies and control do not apply
    codecs: CodecUse = "casts"  # which compression.codec values it admits (module docstring)
    per_edge_messages: bool = False  # sends per-edge vectors (Comm.exchange) besides/instead of mix
    directed: bool = False  # may run on a directed (column-stochastic) topology: push-sum, or none
    static_topology: str | None = None  # why time-varying topologies are refused (None: allowed)
    relay_tree: bool = False  # relays over one static spanning tree (hyper.tree, hyper.root)
    adaptive_graph: AdaptiveGraph | None = None  # chooses every phase's graph itself (Ada)
    silent_steps: bool = False  # may take steps without any communication (Algorithm.silent_steps)
    # what it sends at step t does not depend on step t's gradient: ``overlap = true`` may start
    # the exchange before the gradient is computed (Algorithm.start, docs/algorithms.md#overlap)
    overlap: bool = False
    # asynchronous: wait-free local steps simulated on a virtual clock in the vectorized engine
    # (``[async]``, `concord.sim.asynchronous`); its ``step`` is the synchronous reference
    asynchronous: bool = False
    # consensus control ------------------------------------------------------------------------
    uncontrolled: str | None = None  # why consensus control does not apply (None: it does)
    lagged_control: bool = True  # admits the lagged protocol (control.lagged) when controllable
    repeats_rounds: bool = True  # control may add gossip rounds (False: θ reported once per step)
    # its messages are matched by step (a round's): a peer that rejoins behind must take its
    # neighbours' step. False (AD-PSGD: pairwise averaging with whatever model the partner has):
    # under the global budget a restarted peer keeps its own step count, the progress it adds
    steps_align: bool = True
    # hyperparameters --------------------------------------------------------------------------
    hyper: Mapping[str, Any] = field(default_factory=_frozen)  # [hyper] keys and their defaults
    hyper_check: str | None = None  # "module:function", a HyperCheck run by the config validator

    def __post_init__(self) -> None:
        if self.hyper_check is not None:
            _split(self.hyper_check)
        _split(self.implementation)
        if not isinstance(self.hyper, MappingProxyType):
            object.__setattr__(self, "hyper", _frozen(self.hyper))
        if self.uncontrolled is not None and (self.lagged_control or self.repeats_rounds):
            raise ValueError(
                f"{self.name}: an uncontrolled algorithm admits neither lagged control nor "
                "repeated rounds"
            )

    @property
    def controllable(self) -> bool:
        """Consensus control (``control.mode``) applies to its gossip phases."""
        return self.uncontrolled is None

    @property
    def time_varying(self) -> bool:
        """Runs on time-varying topologies (one-peer exponential, random matching, ...)."""
        return self.static_topology is None

    @property
    def graph_source(self) -> str | None:
        """Where an adaptive-graph algorithm's graphs come from (None: the run's topology)."""
        return None if self.adaptive_graph is None else _GRAPH_SOURCES[self.adaptive_graph]

    def admits(self, codec: str) -> bool:
        """Whether ``compression.codec = codec`` (a known codec name) applies to it."""
        if self.codecs == "error-feedback":
            return True
        if self.codecs == "casts":
            return codec in CAST_CODECS
        return codec == "none"

    def load(self) -> type[Any]:
        """The implementation class (imports its module, and with it torch)."""
        module, attr = _split(self.implementation)
        obj: type[Any] = getattr(importlib.import_module(module), attr)
        return obj

    def check_hyper(self, hyper: Mapping[str, Any], peers: int, phases: int) -> list[str]:
        """Every problem of the ``[hyper]`` table by the spec's hook (torch-free; [] if none)."""
        if self.hyper_check is None:
            return []
        module, attr = _split(self.hyper_check)
        hook = cast(HyperCheck, getattr(importlib.import_module(module), attr))
        return hook(self.name, hyper, peers, phases)


def _split(path: str) -> tuple[str, str]:
    module, sep, attr = path.partition(":")
    if not (sep and module and attr):
        raise ValueError(f"{path!r} is not a 'module:attribute' path")
    return module, attr


_PKG = "concord.core.algorithms"
_DETAG_ROUNDS = (
    "runs its own number of accelerated gossip rounds per step (hyper.rounds); consensus control "
    "does not apply"
)
_RELAY_STATIC = (
    "relays over one spanning tree of a static topology (chain, binary-tree, double-binary-tree, "
    "or the BFS tree of any static graph)"
)
_DETAG_STATIC = "needs a static topology (its accelerated gossip and λ assume one fixed W)"
_ADA_CHECK = "concord.core.graphs.adagraph:hyper_problems"
_ASYNC_UNCONTROLLED = (
    "takes wait-free asynchronous steps: no two peers share a gossip round at which a global "
    "Θ could decide to repeat it, and the lagged per-exchange controller is not implemented for "
    "asynchronous runs (use control.mode = 'none')"
)

_SPECS = (
    AlgorithmSpec(
        name="allreduce",
        title="all-reduce",
        summary="local optimizer step, then exact averaging over all replicas (mini-batch SGD)",
        citation="centralized baseline; docs/algorithms.md#all-reduce",
        implementation=f"{_PKG}.allreduce:AllReduce",
        gossip=False,
        codecs="raw",
        directed=True,  # ignores the topology
        uncontrolled="all-reduce has no consensus distance to control",
        lagged_control=False,
        repeats_rounds=False,
    ),
    AlgorithmSpec(
        name="dsgd",
        title="D-SGD",
        summary="local (Nesterov) momentum step, then gossip rounds with the phase's W",
        citation="Lian et al., NeurIPS 2017 (D-PSGD); Kong et al., ICML 2021; "
        "docs/algorithms.md#consensus-control",
        implementation=f"{_PKG}.dsgd:DSGD",
        overlap=True,
    ),
    AlgorithmSpec(
        name="choco",
        title="CHOCO-SGD",
        summary="gossip of compressed differences to public copies, with error feedback",
        citation="Koloskova, Stich & Jaggi, ICML 2019; Koloskova, Lin, Stich & Jaggi, ICLR 2020; "
        "docs/algorithms.md#choco-sgd",
        implementation=f"{_PKG}.choco:Choco",
        codecs="error-feedback",
        static_topology="needs a static topology (its public-copy sums assume fixed neighbours)",
        repeats_rounds=False,
    ),
    AlgorithmSpec(
        name="gradient-tracking",
        title="gradient tracking",
        summary="D-SGD plus a tracker of the average gradient gossiped as per-edge messages",
        citation="Pu & Nedić, Math. Programming 2021; Zhang & You, 2019; "
        "docs/algorithms.md#gradient-tracking",
        implementation=f"{_PKG}.gradient_tracking:GradientTracking",
        per_edge_messages=True,
    ),
    AlgorithmSpec(
        name="d2",
        title="D²",
        summary="x ← W(2x − x_prev − η g + η g_prev): removes the data-heterogeneity bias",
        citation="Tang, Lian, Yan, Zhang & Liu, ICML 2018; "
        "docs/algorithms.md#d2-and-exact-diffusion",
        implementation=f"{_PKG}.d2:D2",
        repeats_rounds=False,
    ),
    AlgorithmSpec(
        name="exact-diffusion",
        title="exact diffusion",
        summary="D²'s recursion with the lazy matrix (W + I)/2 (adapt, correct, combine)",
        citation="Yuan, Ying, Zhao & Sayed, IEEE Trans. Signal Processing 2019; "
        "docs/algorithms.md#d2-and-exact-diffusion",
        implementation=f"{_PKG}.exact_diffusion:ExactDiffusion",
        repeats_rounds=False,
    ),
    AlgorithmSpec(
        name="qgm",
        title="QGM",
        summary="D-SGD with quasi-global momentum built from the net model change",
        citation="Lin, Karimireddy, Stich & Jaggi, ICML 2021; docs/algorithms.md#qgm",
        implementation=f"{_PKG}.qgm:QGM",
        overlap=True,
        hyper={"beta": 0.9},
    ),
    AlgorithmSpec(
        name="local-sgd",
        title="local SGD",
        summary="H local steps, then one exact average (or one gossip round)",
        citation="Stich, ICLR 2019; Lin, Stich, Patel & Jaggi, ICLR 2020; Koloskova et al., "
        "ICML 2020",
        implementation=f"{_PKG}.local_sgd:LocalSGDAlgorithm",
        gossip=False,  # the default average = "exact"
        silent_steps=True,
        overlap=True,
        uncontrolled="local-sgd communicates once every hyper.local_steps steps; consensus "
        "control (repeated gossip rounds) does not apply",
        lagged_control=False,
        repeats_rounds=False,
        hyper={"local_steps": 4, "average": "exact"},
    ),
    AlgorithmSpec(
        name="relaysgd",
        title="RelaySum/Model",
        summary="models relayed over a spanning tree: every replica gets every other's, delayed",
        citation="Vogels et al., NeurIPS 2021 (RelaySum); docs/algorithms.md#relaysgd",
        implementation=f"{_PKG}.relaysgd:RelaySGD",
        codecs="raw",
        per_edge_messages=True,
        static_topology=_RELAY_STATIC,
        relay_tree=True,
        repeats_rounds=False,
        hyper={"tree": "auto", "root": "center"},
    ),
    AlgorithmSpec(
        name="relaysgd-grad",
        title="RelaySum/Grad",
        summary="model updates relayed over a spanning tree (RelaySum/Grad)",
        citation="Vogels et al., NeurIPS 2021 (RelaySum); docs/algorithms.md#relaysgd",
        implementation=f"{_PKG}.relaysgd:RelaySGDGrad",
        codecs="raw",
        per_edge_messages=True,
        static_topology=_RELAY_STATIC,
        relay_tree=True,
        repeats_rounds=False,
        hyper={"tree": "auto", "root": "center"},
    ),
    AlgorithmSpec(
        name="sgp",
        title="SGP",
        summary="push-sum gossip with column-stochastic, possibly directed matrices",
        citation="Assran, Loizou, Ballas & Rabbat, ICML 2019; docs/algorithms.md#sgp",
        implementation=f"{_PKG}.sgp:SGP",
        codecs="raw",
        directed=True,
    ),
    AlgorithmSpec(
        name="ad-psgd",
        title="AD-PSGD",
        summary="wait-free local steps; each active peer then averages pairwise with one neighbour",
        citation="Lian, Zhang, Zhang & Liu, ICML 2018; docs/algorithms.md#ad-psgd",
        implementation=f"{_PKG}.ad_psgd:ADPSGD",
        codecs="raw",
        asynchronous=True,
        uncontrolled=f"ad-psgd {_ASYNC_UNCONTROLLED}",
        lagged_control=False,
        repeats_rounds=False,
        steps_align=False,
    ),
    AlgorithmSpec(
        name="async-sgp",
        title="asynchronous SGP",
        summary="wait-free push-sum: push (x·w, w) shares at step end, mix what has arrived",
        citation="Assran, Loizou, Ballas & Rabbat, ICML 2019 (overlap SGP); "
        "docs/algorithms.md#asynchronous-sgp",
        implementation=f"{_PKG}.async_sgp:AsyncSGP",
        codecs="raw",
        directed=True,
        asynchronous=True,
        uncontrolled=f"async-sgp {_ASYNC_UNCONTROLLED}",
        lagged_control=False,
        repeats_rounds=False,
    ),
    AlgorithmSpec(
        name="detag",
        title="DeTAG",
        summary="gradient tracking with R accelerated gossip rounds per step",
        citation="Lu & De Sa, ICML 2021 (JMLR 24(93), 2023); docs/algorithms.md#detag-and-dsgt",
        implementation=f"{_PKG}.detag:DeTAG",
        per_edge_messages=True,
        static_topology=_DETAG_STATIC,
        uncontrolled=f"detag {_DETAG_ROUNDS}",
        lagged_control=False,
        repeats_rounds=False,
        hyper={"rounds": 2, "eta": None, "order": "detag"},
    ),
    AlgorithmSpec(
        name="dsgt",
        title="DSGT",
        summary="gradient tracking, one round per step (DeTAG with R = 1, η = 0, order detag*)",
        citation="Pu & Nedić 2021; Zhang & You 2019; docs/algorithms.md#detag-and-dsgt",
        implementation=f"{_PKG}.detag:DSGT",
        per_edge_messages=True,
        static_topology=_DETAG_STATIC,
        uncontrolled=f"dsgt {_DETAG_ROUNDS}",
        lagged_control=False,
        repeats_rounds=False,
    ),
    AlgorithmSpec(
        name="ada-schedule",
        title="Ada (schedule interpretation)",
        summary="D-SGD on a dense → sparse per-phase graph schedule (an interpretation of Ada)",
        citation="Xie, Yin, Zhou, Oral & Wang, arXiv 2509.12213, 2025; "
        "docs/algorithms.md#ada-interpretations",
        implementation=f"{_PKG}.ada:AdaSchedule",
        adaptive_graph="schedule",
        overlap=True,
        hyper={"graphs": None},
        hyper_check=_ADA_CHECK,
    ),
    AlgorithmSpec(
        name="ada-feedback",
        title="Ada (feedback interpretation)",
        summary="D-SGD on exponential:K, K moved by feedback on Θ (an interpretation of Ada)",
        citation="Xie, Yin, Zhou, Oral & Wang, arXiv 2509.12213, 2025; "
        "docs/algorithms.md#ada-interpretations",
        implementation=f"{_PKG}.ada:AdaFeedback",
        adaptive_graph="feedback",
        overlap=True,
        uncontrolled="ada-feedback moves its graph from the same Θ that consensus control drives "
        "down with extra rounds; the two loops do not combine (use ada-schedule with control, or "
        "control.mode = 'none')",
        lagged_control=False,
        repeats_rounds=False,
        # concord.core.graphs.adagraph.FeedbackConfig's defaults (a test checks they agree)
        hyper={"every": 20, "factor": 0.25, "ema": 0.9, "hysteresis": 0.5, "k0": None, "lag": 2},
        hyper_check=_ADA_CHECK,
    ),
)

CATALOG: Mapping[str, AlgorithmSpec] = MappingProxyType({s.name: s for s in _SPECS})
"""Config name → spec, in the order the config lists valid algorithms."""


_PLUGINS: dict[str, AlgorithmSpec] = {}


def spec_of(name: str) -> AlgorithmSpec:
    """The spec of a catalog name or of a ``"module:Class"`` plug-in (`plugin_spec`); KeyError
    for any other name (the config validates names)."""
    found = CATALOG.get(name)
    if found is not None:
        return found
    if not is_spec(name):
        raise KeyError(name)
    return plugin_spec(name)


def plugin_spec(name: str) -> AlgorithmSpec:
    """The spec of the user's algorithm ``"module:Class"`` (an `Algorithm` subclass declaring
    ``spec = AlgorithmSpec(...)``), or ``"module:SPEC"`` naming an `AlgorithmSpec` itself (whose
    ``implementation`` names the class: the orchestrator then never imports the class's module).
    The returned spec's ``implementation`` is what the engines load; `PluginError` naming the
    plug-in if it has no spec."""
    if name not in _PLUGINS:
        obj = resolve(name, "algorithm", need_callable=False)
        spec = obj if isinstance(obj, AlgorithmSpec) else getattr(obj, "spec", None)
        if not isinstance(spec, AlgorithmSpec):
            raise PluginError(
                f"algorithm {name!r}: {getattr(obj, '__qualname__', obj)!r} declares no "
                "spec = AlgorithmSpec(...) (concord.core.algorithms.catalog)"
            )
        if isinstance(obj, type):  # the class itself implements it, whatever the spec says
            spec = replace(spec, implementation=name)
        _PLUGINS[name] = spec
    return _PLUGINS[name]


def overlap_algorithms() -> tuple[str, ...]:
    """Names of the algorithms that admit ``overlap = true``."""
    return tuple(n for n, s in CATALOG.items() if s.overlap)


def adaptive_graph_algorithms() -> tuple[str, ...]:
    """Names of the algorithms that choose their own graphs (the Ada interpretations)."""
    return tuple(n for n, s in CATALOG.items() if s.adaptive_graph is not None)


def asynchronous_algorithms() -> tuple[str, ...]:
    """Names of the asynchronous algorithms (simulated on a virtual clock, ``[async]``)."""
    return tuple(n for n, s in CATALOG.items() if s.asynchronous)
