"""The k-peer exponential graphs ``exponential:K`` (`concord.core.graphs.topology`): the family the
Ada interpretations move along — nested, valid Metropolis weights, spectral gap growing with K, the
ring and the full exponential graph at its ends, clear errors, and ``concord topology``."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from click.testing import CliRunner

from concord.core.control.runplan import Schedules
from concord.core.graphs.graph import TopologyError
from concord.core.graphs.mixing import validate_mixing
from concord.core.graphs.topology import (
    build_graph,
    describe,
    exponential_k,
    exponential_name,
    make_schedule,
    max_exponential_k,
)
from concord.lab.cli import main

# Doubly-stochastic checks sum ≤ 2⌈log2 n⌉ + 1 weights like 1/(deg + 1): a few ulps, ≪ 1e-12.
ATOL = 1e-12


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 12, 16, 33, 64])
def test_every_k_builds_valid_weights_and_the_family_is_nested(n: int) -> None:
    k_max = max_exponential_k(n)
    assert k_max == int(np.ceil(np.log2(n)))
    previous: set[tuple[int, int]] = set()
    for k in range(1, k_max + 1):
        sched = make_schedule(exponential_name(k), n)
        assert not sched.time_varying
        assert sched.weights == "metropolis"
        W = sched.matrix(0)
        validate_mixing(W, graph=sched.graph(0), what=f"exponential:{k}")
        np.testing.assert_allclose(W.sum(axis=0), 1.0, rtol=0, atol=ATOL)
        np.testing.assert_allclose(W, W.T, rtol=0, atol=0)
        edges = set(sched.graph(0).edges)
        hops = {min((j - i) % n, (i - j) % n) for i, j in edges}
        assert hops == {min(1 << h, n - (1 << h)) for h in range(k)}  # i ± 2^h, circularly
        assert previous <= edges  # each K contains K − 1's edges
        previous = edges


@pytest.mark.parametrize("n", [4, 5, 8, 12, 16, 33, 64])
def test_spectral_gap_grows_with_k(n: int) -> None:
    gaps = [
        describe(exponential_name(k), n)["spectral_gap"] for k in range(1, max_exponential_k(n) + 1)
    ]
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(gaps)), gaps
    assert gaps[-1] > gaps[0]  # the densest mixes strictly faster than the ring


def test_spectral_gap_strictly_grows_for_powers_of_two() -> None:
    # n = 16: 0.0507 (ring, docs/algorithms.md#spectral-quantities), 0.1476, 0.3911, 0.5 (the static
    # exponential)
    gaps = [describe(exponential_name(k), 16)["spectral_gap"] for k in range(1, 5)]
    assert gaps == sorted(gaps)
    assert len(set(gaps)) == 4
    assert gaps[0] == pytest.approx(0.0507, abs=1e-4)
    assert gaps[-1] == pytest.approx(0.5, abs=1e-12)


@pytest.mark.parametrize("n", [2, 5, 8, 16, 33])
def test_ends_are_the_ring_and_the_full_exponential_graph(n: int) -> None:
    assert build_graph("exponential:1", n) == build_graph("ring", n)
    k_max = exponential_name(max_exponential_k(n))
    assert build_graph(k_max, n) == build_graph("exponential", n)
    np.testing.assert_array_equal(
        make_schedule(k_max, n).matrix(0), make_schedule("exponential", n).matrix(0)
    )


def test_exponential_k_parses_the_family() -> None:
    assert exponential_k("exponential:3") == 3
    assert exponential_k("ring") == 1
    assert exponential_k("exponential", 16) == 4
    assert exponential_k("exponential") is None  # K of the full graph depends on n
    assert exponential_k("torus", 16) is None


@pytest.mark.parametrize(
    ("name", "n", "pattern"),
    [
        ("exponential:0", 8, r"K in 'exponential:K' must be an integer >= 1"),
        ("exponential:x", 8, r"must be an integer >= 1"),
        ("exponential:02", 8, r"must be an integer >= 1"),
        ("exponential:-1", 8, r"must be an integer >= 1"),
        ("exponential:", 8, r"must be an integer >= 1"),
        ("exponential:4", 8, r"needs K <= ceil\(log2 n\) = 3 for n=8 \(hop 2\^\(K-1\) = 8"),
        ("exponential:2", 2, r"needs K <= ceil\(log2 n\) = 1 for n=2"),
    ],
)
def test_clear_errors(name: str, n: int, pattern: str) -> None:
    with pytest.raises(TopologyError, match=pattern):
        make_schedule(name, n)


def test_unknown_topology_names_the_family() -> None:
    with pytest.raises(TopologyError, match="exponential:K, or file:PATH"):
        make_schedule("exponentail", 8)


def test_concord_topology_describes_exponential_k() -> None:
    r = CliRunner().invoke(main, ["topology", "exponential:2", "--peers", "16", "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert (info["name"], info["peers"], info["max_degree"], info["edges"]) == (
        "exponential:2",
        16,
        4,
        32,
    )
    assert info["spectral_gap"] == pytest.approx(0.1476, abs=1e-4)
    r = CliRunner().invoke(main, ["topology", "exponential:5", "--peers", "16"])
    assert r.exit_code != 0
    assert "needs K <= ceil(log2 n) = 4" in r.output


def test_schedules_cap_k_over_fewer_live_members() -> None:
    from concord.core.config import load_config
    from concord.core.control.runplan import make_lr_schedule, make_plan

    cfg = load_config(None, ["peers=8", "topology=exponential:3", "epochs=2"], environ={})
    phase = make_plan(cfg, make_lr_schedule(cfg, 10)).phases[0]
    schedules = Schedules(cfg)
    full = schedules.get(phase)
    assert full.inner is not None
    assert full.inner.name == "exponential:3"
    three = schedules.get(phase, members=[0, 3, 5])  # ⌈log2 3⌉ = 2: hop 4 would wrap around
    assert three.inner is not None
    assert three.inner.name == "exponential:2"
