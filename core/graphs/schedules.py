"""Topology schedules: the sequence of mixing matrices W_k the engines gossip with (torch-free).

A `TopologySchedule` maps a global gossip-round index k ≥ 0 to a `Graph` and a mixing matrix W_k
(float64 (n, n), symmetric, doubly stochastic, support ⊆ graph + diagonal — validated when
built). A static topology is a schedule with ``period == 1``; periodic time-varying schedules
(one-peer exponential, bipartite exponential) have ``period == T`` and W_k = W_{k mod T};
random schedules (random matching) have ``period is None`` and W_k is a pure function of
(seed, k). Build schedules with `concord.core.graphs.topology.make_schedule`.

A *directed* schedule (``directed=True``, push-sum / SGP) has column-stochastic matrices instead
(`concord.core.graphs.mixing.validate_column_stochastic`; W_k[i, j] > 0 for an arc j → i), its
graphs are the undirected supports of the arcs, and connectivity means *strong* connectivity of the
arcs over one period. Only push-sum algorithms may use one (`concord.core.config` enforces it).

Spectral summary (`Spectral`, docs/algorithms.md#spectral-quantities):

* static: λ = max(|λ₂|, |λₙ|) of W;
* periodic (T > 1): λ = ‖P − 11ᵀ/n‖₂ for the one-period product P = W_{T−1}···W_0 (equal to
  max(|λ₂|, |λₙ|) of P when P is symmetric, e.g. for the commuting one-peer factors); the values
  then describe T rounds (``Spectral.rounds``);
* random: p is the *effective* per-round mixing parameter 1 − ‖E[WᵀW] − 11ᵀ/n‖₂ (Koloskova et
  al. 2020, Assumption 1 holds in expectation), λ := √(1 − p), and λ₂, λₙ are eigenvalues of E[W].

spectral_gap = 1 − λ and p = 1 − λ² throughout.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from concord.core.graphs.graph import Graph, TopologyError, describe_components, whole_number
from concord.core.graphs.mixing import (
    consensus_contraction,
    lazy,
    spectral_values,
    validate_column_stochastic,
    validate_mixing,
)

RoundBuilder = Callable[[int], tuple[Graph, np.ndarray]]
"""Round k → (graph, W before the lazy factor)."""

EXACT_ATOL = 1e-12
"""Max-abs tolerance for "the product equals 11ᵀ/n exactly": round-off of a few float64
products of matrices with entries in [0, 1] is ~n·1e-16, far below this; any genuinely
non-exact product is farther from 11ᵀ/n than this for the sizes Concord uses."""

_RANDOM_CACHE = 8  # rounds of a random schedule kept (engines query one round many times)


@dataclass(frozen=True)
class Spectral:
    """Spectral summary of a schedule (see the module docstring for the time-varying cases).

    spectral_gap = 1 − λ ∈ [0, 1]; p = 1 − λ² ∈ [0, 1]; lambda2 ≥ lambda_n are the second-largest
    and the smallest eigenvalue (real parts for a non-symmetric product); exact_average_after is
    the number of rounds (from round 0) after which the product is 11ᵀ/n exactly, else None;
    rounds is how many gossip rounds the numbers describe (1, or the period T).
    """

    spectral_gap: float
    p: float
    lambda2: float
    lambda_n: float
    exact_average_after: int | None
    rounds: int = 1


class TopologySchedule:
    """Mixing matrices per global gossip round (see the module docstring).

    Attributes: ``name`` (topology name), ``n`` (peers), ``weights`` (rule actually used:
    "metropolis", "uniform", "pairwise" or "file"), ``kappa`` (lazy factor in (0, 1]),
    ``seed`` (for random schedules), ``period`` (matrices per cycle; None for random).
    Matrices of periodic schedules are built, validated and cached at construction (random
    schedules keep the last few rounds); returned matrices are read-only.
    """

    def __init__(
        self,
        *,
        name: str,
        n: int,
        weights: str,
        kappa: float,
        seed: int,
        period: int | None,
        build: RoundBuilder,
        expected: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None,
        directed: bool = False,
    ) -> None:
        """``expected`` (random schedules only) returns (E[W], E[WᵀW]) before the lazy factor;
        ``directed`` selects column-stochastic validation (module docstring)."""
        if period is None and expected is None:
            raise TopologyError(f"random schedule {name!r} needs its expected matrices")
        if period is not None and period < 1:
            raise TopologyError(f"schedule {name!r}: period must be >= 1; got {period}")
        self.name = name
        self.n = int(n)
        self.weights = weights
        self.kappa = float(kappa)
        self.seed = int(seed)
        self.period = period
        self.directed = bool(directed)
        self._build = build
        self._expected = expected
        self._periodic: list[tuple[Graph, np.ndarray]] = []
        self._recent: OrderedDict[int, tuple[Graph, np.ndarray]] = OrderedDict()
        self._spectral: Spectral | None = None
        self._union: Graph | None = None
        # neighbour lists per round (key k mod period, or k for random schedules)
        self._nbrs: OrderedDict[int, list[list[tuple[int, float]]]] = OrderedDict()
        if period is not None:
            self._periodic = [self._make(k) for k in range(period)]
        else:
            self._round(0)  # surface parameter errors at construction

    def __repr__(self) -> str:
        return (
            f"TopologySchedule(name={self.name!r}, n={self.n}, weights={self.weights!r}, "
            f"kappa={self.kappa}, period={self.period}, seed={self.seed})"
        )

    @property
    def time_varying(self) -> bool:
        return self.period != 1

    def _make(self, k: int) -> tuple[Graph, np.ndarray]:
        graph, W0 = self._build(k)
        W = lazy(W0, self.kappa)
        what = f"{self.name} (n={self.n}) round {k} mixing matrix"
        if self.directed:
            validate_column_stochastic(W, what=what, graph=graph)
        else:
            validate_mixing(W, what=what, graph=graph)
        W.flags.writeable = False
        return graph, W

    def _round(self, k: int) -> tuple[Graph, np.ndarray]:
        kk = whole_number(k, f"gossip round k must be an integer >= 0; got {k!r}")
        if kk < 0:
            raise TopologyError(f"gossip round k must be >= 0; got {kk}")
        if self.period is not None:
            return self._periodic[kk % self.period]
        hit = self._recent.get(kk)
        if hit is None:
            hit = self._make(kk)
            self._recent[kk] = hit
            if len(self._recent) > _RANDOM_CACHE:
                self._recent.popitem(last=False)
        else:
            self._recent.move_to_end(kk)
        return hit

    def matrix(self, k: int) -> np.ndarray:
        """W_k, float64 (n, n), symmetric and doubly stochastic (column stochastic if
        ``directed``).

        The cached array itself (read-only; periodic schedules return the same object for
        k ≡ k' mod period, so callers can cache per object). Copy it before modifying, and
        prefer ``torch.tensor(W)`` (copies) over ``torch.as_tensor`` (warns on read-only input).
        """
        return self._round(k)[1]

    def graph(self, k: int) -> Graph:
        """The communication graph of round k (support of W_k off the diagonal)."""
        return self._round(k)[0]

    def neighbors(self, i: int, k: int) -> list[tuple[int, float]]:
        """[(j, W_k[i, j])] for j ≠ i with W_k[i, j] > 0, j increasing. Own weight: W_k[i, i]."""
        graph, W = self._round(k)
        node = graph._check_node(i)
        key = k % self.period if self.period is not None else k
        lists = self._nbrs.get(key)
        if lists is None:
            lists = self._neighbor_lists(graph, W)
            self._nbrs[key] = lists
            if self.period is None and len(self._nbrs) > _RANDOM_CACHE:
                self._nbrs.popitem(last=False)
        return list(lists[node])

    @staticmethod
    def _neighbor_lists(graph: Graph, W: np.ndarray) -> list[list[tuple[int, float]]]:
        out = []
        for u in range(graph.n):
            nb = np.asarray(graph.neighbors(u), dtype=np.int64)
            w = W[u, nb]
            keep = w > 0.0
            out.append(list(zip(nb[keep].tolist(), w[keep].tolist(), strict=True)))
        return out

    def self_weight(self, i: int, k: int) -> float:
        """W_k[i, i]."""
        graph, W = self._round(k)
        return float(W[graph._check_node(i), i])

    def matrices(self) -> list[np.ndarray]:
        """The matrices of one period (copies); refused for random schedules."""
        if self.period is None:
            raise TopologyError(f"{self.name!r} is a random schedule; it has no period")
        return [W.copy() for _, W in self._periodic]

    def union_graph(self) -> Graph:
        """Union of the round graphs over one period; for random schedules the support of E[W]."""
        if self._union is None:
            if self.period is not None:
                edges: set[tuple[int, int]] = set()
                for g, _ in self._periodic:
                    edges.update(g.edges)
                self._union = Graph(self.n, tuple(sorted(edges)))
            else:
                EW, _ = self._expected_lazy()
                iu, ju = np.triu_indices(self.n, 1)
                keep = np.abs(EW[iu, ju]) > 0.0
                pairs = zip(iu[keep].tolist(), ju[keep].tolist(), strict=True)
                self._union = Graph(self.n, tuple(pairs))
        return self._union

    def _expected_lazy(self) -> tuple[np.ndarray, np.ndarray]:
        if self._expected is None:
            raise TopologyError(f"{self.name!r} is not a random schedule")
        EW0, EG0 = self._expected()
        k, eye = self.kappa, np.eye(self.n)
        EW = k * EW0 + (1.0 - k) * eye
        # E[(κW + (1−κ)I)ᵀ(κW + (1−κ)I)] = κ²E[WᵀW] + κ(1−κ)(E[W] + E[W]ᵀ) + (1−κ)²I
        EG = k * k * EG0 + k * (1.0 - k) * (EW0 + EW0.T) + (1.0 - k) ** 2 * eye
        return EW, EG

    def spectral(self) -> Spectral:
        """Spectral gap, p, λ₂, λₙ and exact-averaging time (cached; see module docstring)."""
        if self._spectral is None:
            self._spectral = self._compute_spectral()
        return self._spectral

    def _compute_spectral(self) -> Spectral:
        n = self.n
        J = np.full((n, n), 1.0 / n)
        if self.period is None:
            EW, EG = self._expected_lazy()
            l2, ln = spectral_values(EW)
            # EG − J is symmetric PSD on the disagreement subspace: its top eigenvalue is 1 − p.
            one_minus_p = float(np.clip(np.linalg.eigvalsh(EG - J)[-1], 0.0, 1.0))
            lam = float(np.sqrt(one_minus_p))
            return Spectral(1.0 - lam, 1.0 - one_minus_p, l2, ln, None, rounds=1)
        P = np.eye(n)
        exact: int | None = None
        for r, (_, W) in enumerate(self._periodic, start=1):
            P = W @ P
            if exact is None and np.max(np.abs(P - J)) < EXACT_ATOL:
                exact = r
        if exact is not None:  # P = 11ᵀ/n up to round-off: report the exact values
            return Spectral(1.0, 1.0, 0.0, 0.0, exact, rounds=self.period)
        lam = consensus_contraction(P)
        l2, ln = spectral_values(P)
        return Spectral(1.0 - lam, 1.0 - lam * lam, l2, ln, None, rounds=self.period)


def check_connected_over_period(schedule: TopologySchedule) -> None:
    """Raise TopologyError unless information can reach every peer.

    Periodic schedules: the union of the round graphs over one period must be connected. Random
    schedules: the expected matrix E[W] must be connected (equivalently p > 0), so the union of
    enough rounds is connected with probability → 1.
    """
    union = schedule.union_graph()
    if schedule.directed and schedule.period is not None:
        _check_strongly_connected(schedule)
    if not union.is_connected():
        span = "one period" if schedule.period is not None else "E[W]"
        rounds = f" ({schedule.period} rounds)" if schedule.period not in (None, 1) else ""
        raise TopologyError(
            f"topology {schedule.name!r} with n={schedule.n} is not connected over {span}"
            f"{rounds}: {describe_components(union)}"
        )


def _check_strongly_connected(schedule: TopologySchedule) -> None:
    """Every node reaches every other along the arcs (W[i, j] > 0: j → i) of one period."""
    n = schedule.n
    arcs = np.zeros((n, n), dtype=bool)
    for W in schedule.matrices():
        arcs |= W > 0.0
    for reach_of, direction in ((arcs, "reach"), (arcs.T, "be reached from")):
        seen = np.zeros(n, dtype=bool)
        seen[0] = True
        frontier = seen.copy()
        while frontier.any():
            frontier = reach_of[:, frontier].any(axis=1) & ~seen
            seen |= frontier
        if not seen.all():
            missing = np.flatnonzero(~seen)[:10].tolist()
            raise TopologyError(
                f"directed topology {schedule.name!r} with n={n} is not strongly connected over "
                f"one period: node 0 cannot {direction} nodes {missing}"
            )
