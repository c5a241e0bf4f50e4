"""Split a training set over n peers: i.i.d., Dirichlet label skew, label-sorted, shards, user code.

Every scheme returns n int64 index arrays that together cover each sample index exactly once (no
drop, no duplicate); `partition` checks this for built-in and user schemes alike
(`validate_partition`). Schemes (registry ``PARTITIONERS``, kind "partitioner"):

- ``iid`` — seeded permutation cut into n contiguous shards whose sizes differ by ≤ 1 (the "random"
  split of Tao Lin's and the RelaySGD code).
- ``dirichlet`` — label skew by a Dirichlet(α) draw per class (Hsu et al. 2019 as implemented in
  Tao Lin's ``partition_data.py`` and relaysgd ``tasks/utils/non_iid_dirichlet.py``;
  docs/algorithms.md#data-partitions). α > 0; 10 ≈ i.i.d., 1 mild, 0.1 strong, 0.01 extreme
  (≈ one class per worker).
- ``sorted`` — DeTAG's "unshuffled" data (Lu & De Sa 2021, §7; docs/algorithms.md#detag-and-dsgt):
  sort by label, shuffle the first X = ``shuffled_fraction`` ∈ [0, 1] of the sorted order, cut into
  n contiguous even shards. X = 0: each peer sees one or two labels; X = 1: i.i.d.
- ``shards`` — pathological non-i.i.d. split of McMahan et al. 2017 (FedAvg): sort by label, cut
  into n · ``shards_per_peer`` (≥ 1) equal shards, deal ``shards_per_peer`` random shards to each
  peer.
- ``powerlaw`` — quantity skew (LEAF; Li et al. 2022, NIID-Bench): peer sizes proportional to
  (r + 1)^(−``exponent``) for ranks r dealt to peers at random, every peer ≥ 1 sample, samples
  drawn i.i.d. (the label mix stays global: only the amount differs).
- ``groups`` — natural groups (writers, sites): each group of the dataset's ``groups_train`` ids
  goes whole to one peer, largest first to the peer holding fewest samples (ties in seeded order).
- ``"module:callable"`` — user code, called as ``fn(labels=labels, n=n, seed=seed, **options)`` plus
  ``features=`` (the training inputs, [N, ...] numpy) and ``groups=`` (the natural group ids, or
  None) when it declares them (or ``**kwargs``); imported as `concord.core.plugins` says; its
  result is validated.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from concord.core.plugins import PluginError, accepts, resolve
from concord.core.registry import Registry
from concord.core.specs import PARTITIONER_SPECS
from concord.errors import PartitionError as PartitionError

Partitioner = Callable[..., list[np.ndarray]]
PARTITIONERS: Registry[Partitioner] = Registry("partitioner", PARTITIONER_SPECS)
PARTITION_NAMES = ("iid", "dirichlet", "sorted", "shards", "powerlaw", "groups")

DIRICHLET_GROUP_SIZE = 10  # "auxiliary workers" per group in the reference code
DIRICHLET_MIN_SHARE = 0.5  # every worker needs ≥ 50 % of its group's average share
DIRICHLET_MAX_ATTEMPTS = 1000
DIRICHLET_SEED_OFFSET = 100  # the reference code seeds its RNG with 100 + config seed


def _sorted_by_label(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices sorted by label, in seeded random order within each label."""
    perm = rng.permutation(labels.shape[0])
    return perm[np.argsort(labels[perm], kind="stable")]


def iid_partition(labels: np.ndarray, n: int, *, seed: int) -> list[np.ndarray]:
    """Seeded shuffle, n shards with sizes ⌊N/n⌋ or ⌈N/n⌉."""
    perm = np.random.default_rng(seed).permutation(labels.shape[0])
    return [np.sort(p) for p in np.array_split(perm, n)]


def dirichlet_partition(
    labels: np.ndarray, n: int, *, seed: int, alpha: float, num_classes: int | None = None
) -> list[np.ndarray]:
    """Dirichlet(α) label skew with the grouping and minimum-share rule of the reference code.

    1. Shuffle the indices (RNG seeded with 100 + seed).
    2. Split the n workers into consecutive groups of ≤ 10 and the shuffled data into consecutive
       chunks of sizes ⌊(group size / n) · N⌋ (the last chunk takes the rest).
    3. In each chunk (size S, group of m workers), for every class c: draw p ~ Dirichlet(α·1_m),
       zero p_j for every worker already holding ≥ S/m samples, renormalise, and cut that class's
       indices of the chunk at ⌊cumsum(p) · count_c⌋. (If every non-zero p_j was zeroed, p is
       redrawn as Dirichlet(α) over the workers below S/m — the same distribution.)
    4. Repeat 3 until every worker of the group holds ≥ 50 % of S/m samples (at most 1000 attempts,
       then PartitionError: α too small for this many workers per class).
    """
    if not (
        isinstance(alpha, int | float) and not isinstance(alpha, bool) and 0 < alpha < math.inf
    ):
        raise PartitionError(f"alpha must be a finite number > 0, got {alpha!r}")
    C = int(labels.max()) + 1 if num_classes is None else num_classes
    rng = np.random.default_rng(DIRICHLET_SEED_OFFSET + seed)
    N = labels.shape[0]
    shuffled = rng.permutation(N)
    num_groups = math.ceil(n / DIRICHLET_GROUP_SIZE)
    group_sizes = [DIRICHLET_GROUP_SIZE] * (num_groups - 1) + [
        n - DIRICHLET_GROUP_SIZE * (num_groups - 1)
    ]
    parts: list[np.ndarray] = []
    start = 0
    for g, m in enumerate(group_sizes):
        stop = N if g == num_groups - 1 else start + int(m / n * N)
        chunk = shuffled[start:stop]
        start = stop
        parts += _dirichlet_chunk(chunk, labels[chunk], m, C, float(alpha), rng, n=n)
    return [np.sort(p) for p in parts]


def _dirichlet_chunk(
    chunk: np.ndarray,
    chunk_labels: np.ndarray,
    m: int,
    C: int,
    alpha: float,
    rng: np.random.Generator,
    *,
    n: int,
) -> list[np.ndarray]:
    S = chunk.shape[0]
    cap = S / m  # a worker at or above its average share gets no more samples
    by_class = [chunk[chunk_labels == c] for c in range(C)]
    for _ in range(DIRICHLET_MAX_ATTEMPTS):
        pieces: list[list[np.ndarray]] = [[] for _ in range(m)]
        sizes = np.zeros(m, dtype=np.int64)
        for idx in by_class:
            p = rng.dirichlet(np.full(m, alpha)) * (sizes < cap)
            total = p.sum()
            if not total > 0:
                # All mass fell on full workers (tiny α underflows to one-hot draws). The masked,
                # renormalised vector is Dirichlet(α) over the open workers (aggregation property),
                # so draw that directly; the reference code would produce NaN proportions here.
                open_ = sizes < cap
                p = np.zeros(m)
                if open_.any():
                    p[open_] = rng.dirichlet(np.full(int(open_.sum()), alpha))
                else:  # cannot happen while samples remain; guard anyway
                    p[:] = 1.0
                total = p.sum()
            cuts = (np.cumsum(p / total) * idx.shape[0]).astype(np.int64)[:-1]
            for j, piece in enumerate(np.split(idx, cuts)):
                pieces[j].append(piece)
                sizes[j] += piece.shape[0]
        if sizes.min() >= DIRICHLET_MIN_SHARE * cap:
            return [np.concatenate(pc) if pc else np.zeros(0, np.int64) for pc in pieces]
    raise PartitionError(
        f"dirichlet partition: after {DIRICHLET_MAX_ATTEMPTS} attempts some of a group of {m} "
        f"workers (n={n}) still holds < {DIRICHLET_MIN_SHARE:.0%} of the average share "
        f"{cap:.1f} of {S} samples with alpha={alpha} and {C} classes; use a larger alpha or "
        f"fewer workers"
    )


def sorted_partition(
    labels: np.ndarray, n: int, *, seed: int, shuffled_fraction: float = 0.0
) -> list[np.ndarray]:
    """DeTAG "unshuffled" split: label-sorted order, first ⌊X·N⌉ positions shuffled, n even cuts."""
    X = shuffled_fraction
    if isinstance(X, bool) or not isinstance(X, int | float) or not 0.0 <= X <= 1.0:
        raise PartitionError(f"shuffled_fraction must be in [0, 1], got {X!r}")
    rng = np.random.default_rng(seed)
    order = _sorted_by_label(labels, rng)
    k = round(float(X) * order.shape[0])
    order[:k] = rng.permutation(order[:k])
    return list(np.array_split(order, n))


def shards_partition(
    labels: np.ndarray, n: int, *, seed: int, shards_per_peer: int = 2
) -> list[np.ndarray]:
    """FedAvg-style shards: label-sorted order cut into n·s shards, s random shards per peer."""
    s = shards_per_peer
    if isinstance(s, bool) or not isinstance(s, int | np.integer) or s < 1:
        raise PartitionError(f"shards_per_peer must be an integer ≥ 1, got {s!r}")
    if n * s > labels.shape[0]:
        raise PartitionError(
            f"shards: n·shards_per_peer = {n * s} shards exceed the {labels.shape[0]} samples"
        )
    rng = np.random.default_rng(seed)
    shards = np.array_split(_sorted_by_label(labels, rng), n * int(s))
    deal = rng.permutation(n * int(s)).reshape(n, int(s))
    return [np.sort(np.concatenate([shards[j] for j in row])) for row in deal]


def powerlaw_partition(
    labels: np.ndarray, n: int, *, seed: int, exponent: float = 1.0
) -> list[np.ndarray]:
    """Quantity skew: sizes ∝ (r + 1)^(−exponent), ranks r dealt at random, each ≥ 1."""
    if not isinstance(exponent, int | float) or not 0.0 <= float(exponent) <= 10.0:
        raise PartitionError(f"powerlaw: exponent must be a number in [0, 10], got {exponent!r}")
    N = labels.shape[0]
    rng = np.random.default_rng(seed)
    weights = (np.arange(n) + 1.0) ** (-float(exponent))
    weights = weights[rng.permutation(n)]
    spare = N - n  # every peer gets one sample; the rest in proportion to the weights
    raw = spare * weights / weights.sum()
    sizes = np.floor(raw).astype(np.int64)
    left = spare - int(sizes.sum())
    sizes[np.argsort(-(raw - sizes), kind="stable")[:left]] += 1  # largest remainders
    sizes += 1
    cuts = np.cumsum(sizes)[:-1]
    return [np.sort(p) for p in np.split(rng.permutation(N), cuts)]


def groups_partition(
    labels: np.ndarray, n: int, *, seed: int, groups: np.ndarray | None = None
) -> list[np.ndarray]:
    """Whole natural groups per peer, balanced greedily by sample count."""
    if groups is None:
        raise PartitionError(
            "partition scheme 'groups' needs natural group ids per training sample; this "
            "dataset has none (a dataset plug-in returns them as groups_train)"
        )
    g = np.asarray(groups)
    if g.shape != labels.shape:
        raise PartitionError(f"groups has shape {g.shape}; labels {labels.shape}")
    ids, inverse, counts = np.unique(g, return_inverse=True, return_counts=True)
    if ids.size < n:
        raise PartitionError(f"partition scheme 'groups': {ids.size} groups for {n} peers")
    rng = np.random.default_rng(seed)
    order = rng.permutation(ids.size)
    order = order[np.argsort(-counts[order], kind="stable")]  # largest first, ties seeded
    load = np.zeros(n, np.int64)
    owner = np.empty(ids.size, np.int64)
    peer_order = rng.permutation(n)
    for k in order:
        i = int(peer_order[np.argmin(load[peer_order])])
        owner[k] = i
        load[i] += counts[k]
    of_sample = owner[inverse]
    return [np.flatnonzero(of_sample == i).astype(np.int64) for i in range(n)]


PARTITIONERS.add("iid", iid_partition)
PARTITIONERS.add("dirichlet", dirichlet_partition)
PARTITIONERS.add("sorted", sorted_partition)
PARTITIONERS.add("shards", shards_partition)
PARTITIONERS.add("powerlaw", powerlaw_partition)
PARTITIONERS.add("groups", groups_partition)


def _load_user_partitioner(spec: str) -> Partitioner:
    try:
        fn: Partitioner = resolve(spec, "partition scheme")
    except PluginError as exc:
        raise PartitionError(str(exc)) from None
    return fn


def validate_partition(parts: object, n: int, num_samples: int, *, scheme: str) -> list[np.ndarray]:
    """Check that ``parts`` is n integer index arrays covering 0..num_samples−1 exactly once.

    Returns them as int64 arrays; raises PartitionError naming the peer / index at fault.
    """
    where = f"partition scheme {scheme!r}"
    if isinstance(parts, np.ndarray) or not isinstance(parts, Sequence):
        raise PartitionError(f"{where} returned {type(parts).__name__}; expected a list of arrays")
    if len(parts) != n:
        raise PartitionError(f"{where} returned {len(parts)} parts for n={n} peers")
    out: list[np.ndarray] = []
    for i, part in enumerate(parts):
        a = np.asarray(part)
        if a.ndim != 1:
            raise PartitionError(f"{where}: peer {i}'s part has shape {a.shape}; expected 1-D")
        if a.size == 0:
            a = a.astype(np.int64)
        if not np.issubdtype(a.dtype, np.integer):
            raise PartitionError(
                f"{where}: peer {i}'s part has dtype {a.dtype}; expected integer indices"
            )
        a = a.astype(np.int64)
        bad = a[(a < 0) | (a >= num_samples)]
        if bad.size:
            raise PartitionError(
                f"{where}: peer {i} has index {int(bad[0])} outside 0..{num_samples - 1}"
            )
        out.append(a)
    owners = np.concatenate([np.full(a.shape[0], i, np.int64) for i, a in enumerate(out)])
    flat = np.concatenate(out) if out else np.zeros(0, np.int64)
    counts = np.bincount(flat, minlength=num_samples)
    dup = np.flatnonzero(counts > 1)
    if dup.size:
        j = int(dup[0])
        peers = sorted({int(p) for p in owners[flat == j]})
        twice = " (twice)" if len(peers) == 1 else ""
        raise PartitionError(
            f"{where}: index {j} is assigned to peers {peers}{twice}"
            f" ({dup.size} duplicated indices in total)"
        )
    missing = np.flatnonzero(counts == 0)
    if missing.size:
        raise PartitionError(
            f"{where}: index {int(missing[0])} is assigned to no peer "
            f"({missing.size} missing indices in total, e.g. {missing[:5].tolist()})"
        )
    return out


def partition(
    labels: np.ndarray,
    n: int,
    scheme: str = "iid",
    *,
    seed: int = 0,
    alpha: float = 1.0,
    shuffled_fraction: float = 0.0,
    shards_per_peer: int = 2,
    exponent: float = 1.0,
    num_classes: int | None = None,
    features: np.ndarray | None = None,
    groups: np.ndarray | None = None,
    **options: Any,
) -> list[np.ndarray]:
    """Split sample indices 0..N−1 (``labels`` [N] integer) over ``n`` peers with ``scheme``.

    Returns n int64 arrays covering every index exactly once. Built-in schemes take the keyword
    parameters they use (alpha for dirichlet, shuffled_fraction for sorted, shards_per_peer for
    shards, exponent for powerlaw, groups for groups) and no extra ``options``; a
    "module:callable" scheme receives labels, n, seed and ``options``, and ``features`` (the
    training inputs) and ``groups`` (natural group ids or None) when it declares them.
    Deterministic given (labels, n, scheme, seed, parameters).
    """
    y = np.asarray(labels)
    if y.ndim != 1 or (y.size and not np.issubdtype(y.dtype, np.integer)):
        raise PartitionError(f"labels must be a 1-D integer array, got {y.dtype} shape {y.shape}")
    if y.size and y.min() < 0:
        raise PartitionError(f"labels must be ≥ 0, got {int(y.min())}")
    N = y.shape[0]
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or not 1 <= n <= max(N, 1):
        raise PartitionError(f"n must be an integer in 1..{N} (number of samples), got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise PartitionError(f"seed must be an integer ≥ 0, got {seed!r}")
    if num_classes is not None and y.size and y.max() >= num_classes:
        raise PartitionError(f"num_classes={num_classes} but labels reach {int(y.max())}")
    n, seed = int(n), int(seed)
    if ":" in scheme:
        fn = _load_user_partitioner(scheme)
        extra = {k: v for k, v in (("features", features), ("groups", groups)) if accepts(fn, k)}
        parts = fn(labels=y, n=n, seed=seed, **extra, **options)
        return validate_partition(parts, n, N, scheme=scheme)
    fn = PARTITIONERS.get(scheme)
    if options:
        raise PartitionError(
            f"partition scheme {scheme!r} takes no option(s) {', '.join(sorted(options))}"
        )
    given = {
        "alpha": alpha,
        "shuffled_fraction": shuffled_fraction,
        "shards_per_peer": shards_per_peer,
        "exponent": exponent,
        "num_classes": num_classes,
        "groups": groups,
    }
    accepted = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in given.items() if k in accepted}
    return validate_partition(fn(y, n, seed=seed, **kwargs), n, N, scheme=scheme)


def partition_digest(parts: Sequence[np.ndarray]) -> str:
    """SHA-256 (hex) of a partition: each peer's int64 little-endian indices in order, each
    preceded by its length — equal on two machines exactly when they built the same partition
    (recorded in ``partition.json`` and ``summary.json``)."""
    h = hashlib.sha256()
    for part in parts:
        a = np.ascontiguousarray(np.asarray(part, dtype="<i8"))
        h.update(int(a.shape[0]).to_bytes(8, "little"))
        h.update(a.tobytes())
    return h.hexdigest()


def label_histograms(
    labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int
) -> np.ndarray:
    """[n, num_classes] int64: row i counts the labels of peer i's samples."""
    y = np.asarray(labels)
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(
            f"labels span {int(y.min())}..{int(y.max())}, beyond num_classes={num_classes}"
        )
    rows = [np.bincount(y[np.asarray(p, np.int64)], minlength=num_classes) for p in parts]
    return np.stack(rows).astype(np.int64) if rows else np.zeros((0, num_classes), np.int64)


def partition_stats(
    labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int
) -> dict[str, Any]:
    """JSON-able summary of a partition's sizes and label skew.

    Keys: n, num_samples, sizes, histograms, min/mean/max_size, min_share and max_share (size ÷ mean
    size), labels_per_peer (distinct labels held), mean_tv_distance and max_tv_distance — the total
    variation distance ½ Σ_c |p_i(c) − p(c)| of each non-empty peer's label distribution from the
    global one (0 = same distribution, → 1 = disjoint labels) and tv_distances, each peer's (None:
    an empty peer, left out of the mean and max);
    sha256, the `partition_digest`.
    """
    H = label_histograms(labels, parts, num_classes)
    sizes = H.sum(1)
    total = np.bincount(np.asarray(labels), minlength=num_classes).astype(np.float64)
    glob = total / max(total.sum(), 1.0)
    nonempty = sizes > 0
    local = H[nonempty] / sizes[nonempty, None]
    tv = 0.5 * np.abs(local - glob[None, :]).sum(1)
    per_peer: list[float | None] = [None] * len(parts)
    for i, value in zip(np.flatnonzero(nonempty), tv, strict=True):
        per_peer[int(i)] = float(value)
    mean_size = float(sizes.mean()) if sizes.size else 0.0
    return {
        "n": len(parts),
        "num_samples": int(sizes.sum()),
        "sizes": sizes.tolist(),
        "histograms": H.tolist(),
        "min_size": int(sizes.min()) if sizes.size else 0,
        "mean_size": mean_size,
        "max_size": int(sizes.max()) if sizes.size else 0,
        "min_share": float(sizes.min() / mean_size) if mean_size else 0.0,
        "max_share": float(sizes.max() / mean_size) if mean_size else 0.0,
        "labels_per_peer": (H > 0).sum(1).tolist(),
        "tv_distances": per_peer,
        "mean_tv_distance": float(tv.mean()) if tv.size else 0.0,
        "max_tv_distance": float(tv.max()) if tv.size else 0.0,
        "sha256": partition_digest(parts),
    }
