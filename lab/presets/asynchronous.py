"""``concord sweep --preset async``: asynchronous against synchronous decentralized SGD on a
virtual clock (Lian et al., ICML 2018, AD-PSGD; Assran et al., ICML 2019, asynchronous SGP).

Grid (vectorized engine; MNIST-1D, the ``mlp``, local batch 16, Nesterov 0.9, a constant lr after
a 5 % warm-up): rows all-reduce, D-SGD (ring), AD-PSGD (ring) and asynchronous SGP (one-peer
exponential graph, τ = 2) × columns n ∈ {16, 64} × speed spread {1×, 2×, 8×} × data {iid,
Dirichlet α = 0.1} × seeds. A peer's local step takes ``compute_s × speed`` virtual seconds;
the speeds of a column are ``1 … spread`` evenly spaced over the n peers in a fixed shuffled
order (`speeds`), no message delay. The asynchronous rows pin ``async.budget = "per-peer"``
(`BUDGET`: T windows of the fastest peer's step, slower peers fewer), what the committed study
(docs/results/async) ran with before ``"global"`` became the default.

The synchronous rows do not depend on the speeds (they wait for the slowest peer every step,
which changes their clock, not their trajectory), and ``[async]`` is refused for them; so they
run once per (n, data, seed), in the 1× columns only, and the report puts them on the clock of
every spread (`concord.lab.presets.async_report.sync_step_seconds`: the slowest peer's compute
plus the step's longest message delay). The report (`concord.lab.presets.async_report`) writes
``curves.csv`` (every evaluation of every run, on the virtual clock) and reads everything from
it and ``table.csv``; its `study` is the entry of ``concord sweep --preset``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from concord.lab.presets.spec import Preset, Setting, Setup

NAME = "async"
SIZES = (16, 64)
SPREADS = (1, 2, 8)
_DIRICHLET = {"partition.scheme": "dirichlet", "partition.alpha": 0.1}
DATA = (("iid", "iid", {"partition.scheme": "iid"}), ("a0.1", "Dirichlet α = 0.1", _DIRICHLET))
SYNC_ROWS = ("allreduce", "dsgd")
ASYNC_ROWS = ("ad-psgd", "async-sgp")
LR = 0.1
COMPUTE_S = 1.0
_ORDER_SEED = 2018  # the fixed shuffle of the speeds over the ranks
BUDGET = "per-peer"  # the committed study's budget (the default is now "global")
MIN_WEIGHT = 0.0  # the committed study's async-sgp: no weight floor (the default is now 0.25)


def speeds(n: int, spread: float) -> list[float]:
    """The compute-time multipliers of a column: 1 … ``spread`` evenly spaced over ``n`` peers,
    shuffled over the ranks by a fixed permutation (the same for every seed), so that the slow
    peers are neither neighbours on the ring nor all of one AD-PSGD parity. Exactly min 1 and
    max ``spread``."""
    if n < 2 or spread < 1:
        raise ValueError(f"speeds need n >= 2 and spread >= 1; got n = {n}, spread = {spread}")
    values = [1 + (spread - 1) * i / (n - 1) for i in range(n)]
    random.Random(_ORDER_SEED + n).shuffle(values)
    return values


def column_key(n: int, spread: float, data: str) -> str:
    return f"n{n}-x{spread:g}-{data}"


def _columns() -> tuple[Setting, ...]:
    out = []
    for n in SIZES:
        for spread in SPREADS:
            for key, label, data in DATA:
                over: dict[str, object] = {"peers": n, **data}
                if spread != 1:
                    over["async.speeds"] = speeds(n, spread)
                out.append(
                    Setting(column_key(n, spread, key), f"n = {n}, {spread}×, {label}", over, n)
                )
    return tuple(out)


COLUMNS = _columns()
_SYNC_ONLY = tuple(c.key for c in COLUMNS if "-x1-" in c.key)


def _lrs(only: tuple[str, ...] = ()) -> Mapping[str, float]:
    return {c.key: LR for c in COLUMNS if not only or c.key in only}


BASE = (
    "dataset.name=mnist1d",
    "dataset.samples=20000",
    "model.name=mlp",
    "epochs=4",
    "optim.batch_size=16",
    "optim.momentum=0.9",
    "optim.nesterov=true",
    "optim.weight_decay=1e-4",
    "optim.warmup=0.05",
    "optim.milestones=[]",
    "plan=gossip",
    "control.mode=none",
    "eval.every=0.25",
    "threads=1",
)
"""MNIST-1D (16 000 training samples, 4 000 test), ``mlp``, 4 epochs of the fastest peer, a
constant lr after the warm-up: no decay milestones, since a slow asynchronous peer would reach
them at another virtual time than a fast one, and the curves are compared at equal time and at
equal samples, not only at the end."""

ASYNC = Preset(
    name=NAME,
    title="Asynchronous vs synchronous SGD on a virtual clock (MNIST-1D, n = 16 / 64)",
    setup=(
        "AD-PSGD (Lian et al., ICML 2018) and asynchronous SGP (Assran et al., ICML 2019, "
        "τ = 2) against all-reduce and D-SGD in the vectorized engine's deterministic "
        "asynchronous simulation (docs/algorithms.md#asynchronous-simulation): MNIST-1D "
        "(20 000 samples, 16 000 for training), the `mlp`, local batch 16, Nesterov 0.9, "
        "weight decay 1e-4, 5 % warm-up then a constant lr 0.1 (untuned, every row), 4 "
        "epochs of steps of the fastest peer. Peer i's local step takes `speeds[i]` virtual "
        "seconds (`async.compute_s = 1`): 1 … spread evenly spaced over the peers in a fixed "
        "shuffled order, spread ∈ {1×, 2×, 8×}; no message delay. An asynchronous run has "
        "the synchronous run's number of engine steps, each a window as long as the fastest "
        "peer's step, so its slow peers take fewer local steps (fewer samples); a synchronous "
        "step waits for the slowest peer and so lasts spread × compute_s. D-SGD and AD-PSGD "
        "on the ring, asynchronous SGP on the one-peer exponential graph, all-reduce exact. "
        "Data iid or Dirichlet α = 0.1 (the 10-worker grouping of "
        "docs/algorithms.md#data-partitions)."
    ),
    base=BASE,
    rows=(
        Setup(
            "allreduce",
            "all-reduce",
            {"algorithm": "allreduce", "topology": "complete"},
            _lrs(_SYNC_ONLY),
            (LR,),
            only=_SYNC_ONLY,
        ),
        Setup(
            "dsgd",
            "D-SGD (ring)",
            {"algorithm": "dsgd", "topology": "ring"},
            _lrs(_SYNC_ONLY),
            (LR,),
            only=_SYNC_ONLY,
        ),
        Setup(
            "ad-psgd",
            "AD-PSGD (ring)",
            {"algorithm": "ad-psgd", "topology": "ring", "async.budget": BUDGET},
            _lrs(),
            (LR,),
        ),
        Setup(
            "async-sgp",
            "async SGP (one-peer exponential, τ = 2)",
            {
                "algorithm": "async-sgp",
                "topology": "exponential-one-peer-directed",
                "async.max_staleness": 2,
                "async.budget": BUDGET,
                "async.min_weight": MIN_WEIGHT,
            },
            _lrs(),
            (LR,),
        ),
    ),
    columns=COLUMNS,
    column_name="n, speed spread, data",
    metric="avg",
    seeds=(0, 1, 2, 3, 4),
    lr_note="One lr (0.1) for every row and column: not tuned (see the report's limits).",
)
