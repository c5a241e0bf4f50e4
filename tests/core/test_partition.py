"""Partitioners: coverage, Dirichlet skew and minimum share, DeTAG sorted split, user code."""

from __future__ import annotations

import itertools
import json
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from concord.core.data import (
    PARTITION_NAMES,
    PARTITIONERS,
    PartitionError,
    label_histograms,
    partition,
    partition_stats,
    validate_partition,
)
from concord.core.registry import UnknownNameError

RNG_LABELS = np.random.default_rng(0).integers(0, 10, size=1003)  # N = 1003: no n divides it
BALANCED = np.repeat(np.arange(10), 1000)  # 10 000 labels, 1000 per class
GROUPS = np.random.default_rng(1).integers(0, 40, size=1003)  # natural groups ("writers")


def _covers_once(parts: list[np.ndarray], N: int) -> None:
    flat = np.concatenate(parts)
    assert all(p.dtype == np.int64 for p in parts)
    assert flat.shape == (N,)
    assert np.array_equal(np.sort(flat), np.arange(N))


def test_registry_holds_every_scheme() -> None:
    assert PARTITIONERS.names() == list(PARTITION_NAMES)


@pytest.mark.parametrize("scheme", PARTITION_NAMES)
@pytest.mark.parametrize("n", [1, 3, 7, 10, 16])
def test_every_sample_is_assigned_exactly_once(scheme: str, n: int) -> None:
    parts = partition(
        RNG_LABELS, n, scheme, seed=1, alpha=0.5, shuffled_fraction=0.3, groups=GROUPS
    )
    assert len(parts) == n
    _covers_once(parts, len(RNG_LABELS))


@pytest.mark.parametrize("scheme", PARTITION_NAMES)
def test_partitions_are_deterministic_per_seed(scheme: str) -> None:
    kw: dict[str, Any] = {"alpha": 0.3, "shuffled_fraction": 0.5, "groups": GROUPS}
    a = partition(RNG_LABELS, 7, scheme, seed=3, **kw)
    b = partition(RNG_LABELS, 7, scheme, seed=3, **kw)
    c = partition(RNG_LABELS, 7, scheme, seed=4, **kw)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_shard_sizes_differ_by_at_most_one() -> None:
    sizes = [len(p) for p in partition(RNG_LABELS, 16, "iid")]
    assert max(sizes) - min(sizes) <= 1
    stats = partition_stats(BALANCED, partition(BALANCED, 8, "iid"), 10)
    assert stats["mean_tv_distance"] < 0.05  # 1250 samples per peer: sampling noise only


def test_dirichlet_skew_grows_as_alpha_shrinks() -> None:
    tv = []
    for alpha in (10.0, 1.0, 0.1, 0.01):
        parts = partition(BALANCED, 16, "dirichlet", alpha=alpha, seed=0)
        _covers_once(parts, len(BALANCED))
        stats = partition_stats(BALANCED, parts, 10)
        tv.append(stats["mean_tv_distance"])
        # minimum-share rule: ≥ 50 % of the average share (chunk sizes are floored: −1 slack)
        assert stats["min_size"] >= 0.5 * len(BALANCED) / 16 - 1
    assert tv == sorted(tv), tv
    assert tv[0] < 0.2  # α = 10 is close to i.i.d.
    assert tv[-1] > 0.75  # α = 0.01: mostly one class per worker


def test_dirichlet_groups_workers_by_ten() -> None:
    N = len(BALANCED)
    parts = partition(BALANCED, 16, "dirichlet", alpha=0.1, seed=2)
    # the first group of 10 workers shares the first ⌊10/16 · N⌋ shuffled samples
    assert sum(len(p) for p in parts[:10]) == int(10 / 16 * N)
    assert sum(len(p) for p in parts[10:]) == N - int(10 / 16 * N)


def test_dirichlet_impossible_minimum_share_raises() -> None:
    two_classes = np.repeat([0, 1], 50)
    with pytest.raises(PartitionError, match="alpha=1e-05"):
        partition(two_classes, 10, "dirichlet", alpha=1e-5)
    with pytest.raises(PartitionError, match="alpha"):
        partition(two_classes, 2, "dirichlet", alpha=0.0)


def test_sorted_split_zero_fraction_gives_one_or_two_labels_per_peer() -> None:
    stats = partition_stats(BALANCED, partition(BALANCED, 10, "sorted"), 10)
    assert stats["labels_per_peer"] == [1] * 10
    parts = partition(BALANCED, 8, "sorted", shuffled_fraction=0.0)
    assert max(partition_stats(BALANCED, parts, 10)["labels_per_peer"]) <= 2
    for a, b in itertools.pairwise(parts):  # contiguous in label order
        assert BALANCED[a].max() <= BALANCED[b].min()


def test_sorted_split_skew_decreases_with_the_shuffled_fraction() -> None:
    tv = [
        partition_stats(BALANCED, partition(BALANCED, 8, "sorted", shuffled_fraction=f), 10)[
            "mean_tv_distance"
        ]
        for f in (0.0, 0.25, 0.5, 1.0)
    ]
    assert tv == sorted(tv, reverse=True), tv
    assert tv[-1] < 0.05  # fully shuffled = i.i.d. (1250 samples per peer)
    with pytest.raises(PartitionError, match="shuffled_fraction"):
        partition(BALANCED, 8, "sorted", shuffled_fraction=1.5)


def test_shards_give_each_peer_at_most_shards_per_peer_labels() -> None:
    parts = partition(BALANCED, 10, "shards", shards_per_peer=2, seed=5)
    stats = partition_stats(BALANCED, parts, 10)
    assert max(stats["labels_per_peer"]) <= 2  # 20 shards of 500 each lie inside one class
    assert stats["sizes"] == [1000] * 10
    with pytest.raises(PartitionError, match="shards"):
        partition(np.zeros(5, np.int64), 3, "shards", shards_per_peer=2)


def test_histograms_and_stats_are_consistent_and_json_able() -> None:
    parts = partition(RNG_LABELS, 5, "dirichlet", alpha=0.5)
    H = label_histograms(RNG_LABELS, parts, 10)
    assert H.shape == (5, 10)
    assert H.dtype == np.int64
    assert H.sum(1).tolist() == [len(p) for p in parts]
    assert np.array_equal(H.sum(0), np.bincount(RNG_LABELS, minlength=10))
    stats = partition_stats(RNG_LABELS, parts, 10)
    json.dumps(stats)
    assert stats["min_share"] <= 1.0 <= stats["max_share"]
    assert 0.0 <= stats["mean_tv_distance"] <= stats["max_tv_distance"] <= 1.0


def test_bad_arguments_name_the_parameter() -> None:
    with pytest.raises(UnknownNameError, match="dirichlet"):
        partition(RNG_LABELS, 4, "random")
    with pytest.raises(PartitionError, match="n must be"):
        partition(RNG_LABELS, 0)
    with pytest.raises(PartitionError, match="n must be"):
        partition(np.arange(3), 4)
    with pytest.raises(PartitionError, match="labels"):
        partition(np.array([0.5, 1.0]), 2)
    with pytest.raises(PartitionError, match="takes no option"):
        partition(RNG_LABELS, 4, "iid", stride=2)


USER_MODULE = textwrap.dedent(
    """
    import numpy as np

    def round_robin(labels, n, seed, stride=1):
        idx = np.roll(np.arange(len(labels)), seed * stride)
        return [idx[i::n] for i in range(n)]

    def wrong_count(labels, n, seed):
        return [np.arange(len(labels))]

    def duplicate(labels, n, seed):
        parts = [np.arange(len(labels))[i::n] for i in range(n)]
        parts[2] = np.append(parts[2], parts[0][0])
        return parts

    def missing(labels, n, seed):
        parts = [np.arange(len(labels))[i::n] for i in range(n)]
        parts[1] = parts[1][1:]
        return parts

    def out_of_range(labels, n, seed):
        parts = [np.arange(len(labels))[i::n] for i in range(n)]
        parts[3] = np.append(parts[3], len(labels) + 7)
        return parts

    def floats(labels, n, seed):
        return [np.arange(len(labels))[i::n].astype(float) for i in range(n)]

    not_callable = 3
    """
)


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = "concord_test_user_partitions"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_user_partitioner_is_called_with_options(user_module: str) -> None:
    parts = partition(RNG_LABELS, 4, f"{user_module}:round_robin", seed=2, stride=3)
    _covers_once(parts, len(RNG_LABELS))
    assert parts[0][0] == np.roll(np.arange(len(RNG_LABELS)), 6)[0]  # seed·stride was applied


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        ("wrong_count", r"returned 1 parts for n=4"),
        ("duplicate", r"index 0 is assigned to peers \[0, 2\]"),
        ("missing", r"index 1 is assigned to no peer"),
        ("out_of_range", r"peer 3 has index 1010 outside 0\.\.1002"),
        ("floats", r"peer 0's part has dtype float64"),
        ("not_callable", r"is not callable"),
        ("absent", r"has no attribute 'absent'"),
    ],
)
def test_bad_user_partitioner_gets_a_specific_error(
    user_module: str, fn: str, message: str
) -> None:
    with pytest.raises(PartitionError, match=message):
        partition(RNG_LABELS, 4, f"{user_module}:{fn}")


def test_user_partitioner_import_failure_is_reported() -> None:
    with pytest.raises(PartitionError, match="cannot import module 'no_such_module_xyz'"):
        partition(RNG_LABELS, 4, "no_such_module_xyz:fn")


def test_validate_partition_reports_a_peer_listing_an_index_twice() -> None:
    with pytest.raises(PartitionError, match=r"index 1 is assigned to peers \[0\] \(twice\)"):
        validate_partition([np.array([0, 1, 1]), np.array([2])], 2, 3, scheme="x")
