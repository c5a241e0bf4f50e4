"""Ada-style adaptive graphs — two labelled *interpretations* of Ada (Xie, Yin, Zhou, Oral, Wang,
"Scaling Up Data Parallelism in Decentralized Deep Learning", arXiv 2509.12213, 2025).

**The paper's exact Ada rule is not published** (docs/algorithms.md#ada-interpretations): these are
Concord's interpretations of "a decentralized SGD method adapting the communication graph in use
dynamically throughout training iterations", not a reproduction. Both are D-SGD with local
(Nesterov) momentum — the update is exactly `concord.core.algorithms.dsgd.DSGD`:

    x_i^{t+½} = x_i^t − η · d_i^t;      x_i^{t+1} = Σ_j w_ij(t) x_j^{t+½}

and differ only in *which* graph W(t) is (symmetric, doubly stochastic Metropolis weights on the
chosen graph, so the mean x̄ is preserved). The graph choice is run-level machinery, not part of
the update, and lives in `concord.core.graphs.adagraph` (torch-free, shared with the orchestrator):

* ``ada-schedule`` (interpretation a): W(t) is the graph of the phase containing t, dense →
  sparse (``hyper.graphs``, one topology name per phase; default ``exponential:⌈log2 n⌉``, K
  halved in middle phases, ``ring`` last). Compatible with consensus control (controlled phases
  repeat rounds on the phase's graph).
* ``ada-feedback`` (interpretation b): W(t) is ``exponential:K(t)``, K moved every
  ``hyper.every`` steps from the window's mean Θ against factor × EMA of the mean gradient norm
  (``every`` ≥ 1, ``factor`` > 0, ``ema`` ∈ [0, 1), ``hysteresis`` ∈ (0, 1],
  ``k0`` ∈ [1, ⌈log2 n⌉], ``lag`` ∈ [1, every]; `concord.core.graphs.adagraph.FeedbackConfig`). Not
  combinable with consensus control: both loops would react to the same Θ, and the repeated rounds
  would hide the variance the graph controller measures (`concord.core.config` refuses it).

Shapes: x, grad [k, d] (k replicas held by this process). The per-phase / per-step topology is
applied by the engines (`concord.core.control.runplan.Schedules.set_topologies`): the vectorized
engine from the config and its own `concord.core.graphs.adagraph.GraphFeedback`, a peer from the
orchestrator's published schedule.
"""

from __future__ import annotations

from collections.abc import Sequence

from concord.core.algorithms.base import register_algorithm
from concord.core.algorithms.catalog import CATALOG
from concord.core.algorithms.dsgd import DSGD
from concord.core.algorithms.optim import LocalSGD
from concord.core.graphs.adagraph import FeedbackConfig, check_graph_names

_DEFAULT = FeedbackConfig()


@register_algorithm
class AdaSchedule(DSGD):
    """D-SGD on a dense → sparse per-phase graph schedule (interpretation a, module docstring)."""

    spec = CATALOG["ada-schedule"]

    def __init__(self, optimizer: LocalSGD, graphs: Sequence[str] | None = None) -> None:
        super().__init__(optimizer)
        self.graphs = None if graphs is None else check_graph_names(graphs)


@register_algorithm
class AdaFeedback(DSGD):
    """D-SGD on ``exponential:K`` with K moved by Θ feedback (interpretation b, module
    docstring)."""

    spec = CATALOG["ada-feedback"]

    def __init__(
        self,
        optimizer: LocalSGD,
        every: int = _DEFAULT.every,
        factor: float = _DEFAULT.factor,
        ema: float = _DEFAULT.ema,
        hysteresis: float = _DEFAULT.hysteresis,
        k0: int | None = _DEFAULT.k0,
        lag: int = _DEFAULT.lag,
    ) -> None:
        super().__init__(optimizer)
        self.feedback = FeedbackConfig(
            every=every, factor=factor, ema=ema, hysteresis=hysteresis, k0=k0, lag=lag
        )
