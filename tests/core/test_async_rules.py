"""The update rules of the asynchronous algorithms (`concord.core.algorithms.ad_psgd`,
`concord.core.algorithms.async_sgp`) and the ``[async]`` config section."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from concord.core.algorithms.ad_psgd import absorb_reply, is_active, pairwise_average, partner
from concord.core.algorithms.async_sgp import absorb, due_rounds, push_split
from concord.core.algorithms.bipartite import schedule_problems, used_edges
from concord.core.config import ConfigError, load_config
from concord.core.graphs.topology import make_schedule

ASYNC = ["algorithm=ad-psgd", "control.mode=none"]


def _interleaved_averagings(x: torch.Tensor, gen: torch.Generator, events: int) -> None:
    """AD-PSGD's averagings of ``x`` ([n, d], n even) in a random interleaving: atomic ones and
    delayed ones whose request and reply are separated by other averagings (the active side
    absorbs the passive side's answer later, `absorb_reply`)."""
    n = x.shape[0]
    pending: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (active, sent, answer)
    for _ in range(events):
        choice = int(torch.randint(3, (1,), generator=gen))
        if choice == 2 and pending:  # a reply arrives
            i, sent, answer = pending.pop(int(torch.randint(len(pending), (1,), generator=gen)))
            absorb_reply(x[i], sent, answer)
            continue
        i = 2 * int(torch.randint(n // 2, (1,), generator=gen)) + 1  # active (odd)
        j = 2 * int(torch.randint(n // 2, (1,), generator=gen))  # passive (even)
        if choice == 0:  # atomic: both set to the average
            avg = pairwise_average(x[i], x[j])
            x[i] = avg
            x[j] = avg
        else:  # the request reaches j now; i gets the answer later
            sent, answer = x[i].clone(), x[j].clone()
            x[j] = pairwise_average(x[j], sent)
            pending.append((i, sent, answer))
    for i, sent, answer in pending:
        absorb_reply(x[i], sent, answer)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_adpsgd_averaging_preserves_the_mean_under_interleavings(seed: int) -> None:
    # Tolerance: every averaging rounds (a + b)/2 once per element and every reply rounds twice
    # (the difference, then the sum), each error ≤ ½ ulp of values ~1 (6e-8 in float32); over
    # 400 events on 8 rows the mean moves by at most ~400 × 3 × 6e-8 / 8 ≈ 1e-5, typically far
    # less (random signs). Mathematically the mean is unchanged.
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 100, generator=gen)
    before = x.double().mean(dim=0)
    _interleaved_averagings(x, gen, 400)
    assert torch.allclose(x.double().mean(dim=0), before, rtol=0, atol=1e-5)
    assert not torch.allclose(x, x[0].expand_as(x))  # the interleavings did not just converge


def test_pairwise_average_is_symmetric_and_exact_in_halves() -> None:
    a = torch.tensor([1.0, 3.0, -2.5])
    b = torch.tensor([3.0, 1.0, 0.5])
    assert torch.equal(pairwise_average(a, b), pairwise_average(b, a))
    assert torch.equal(pairwise_average(a, b), torch.tensor([2.0, 2.0, -1.0]))


def test_partner_follows_the_bipartite_matching_and_refuses_other_graphs() -> None:
    sched = make_schedule("bipartite-exponential", 8)
    for k in range(6):
        W = sched.matrix(k)
        for i in range(1, 8, 2):
            j = partner(W, i, k)
            assert j is not None
            assert not is_active(j)
            assert W[i, j] == 0.5
    ring = make_schedule("ring", 7).matrix(0)
    for rank in (0, 3, 5):  # every edge is checked, not only the rows of the asking peer
        with pytest.raises(ValueError, match=r"peers 0 and 6 .* both passive"):
            partner(ring, rank, 0)  # an odd ring closes on 6 – 0, both passive
    with pytest.raises(ValueError, match="both"):
        partner(make_schedule("complete", 4).matrix(0), 1, 0)


def test_partner_choice_is_round_robin_and_its_used_edges_must_connect() -> None:
    ring = make_schedule("ring", 8).matrix(0)
    assert [partner(ring, 7, k) for k in range(4)] == [0, 6, 0, 6]
    assert schedule_problems("ring", [ring]) == []
    assert len(used_edges([ring])) == 8  # every edge of the even ring is used
    # a period of two rounds, the ring then nobody: round-robin at steps k ≡ 0 (mod 2) only
    # reaches neighbour 0 of each active peer, so peer 2 never averages although the union of
    # the rounds is connected
    rounds = [make_schedule("ring", 4).matrix(0), np.eye(4)]
    assert used_edges(rounds) == [(1, 0), (3, 0)]
    (problem,) = schedule_problems("x", rounds)
    assert "do not connect" in problem
    assert "{2}" in problem


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["topology=star"], "peers 0 and 2 are neighbours but both passive"),
        (["topology=ring", "peers=7"], "peers 0 and 6 are neighbours"),
        (["topology=complete"], "peers 0 and 2"),
        (["topology=exponential-one-peer"], "round 1: peers 0 and 2"),
        (["topology=random-matching"], "draws its rounds at random"),
        (["topology=bipartite-exponential", "kappa=0.5"], "kappa: algorithm 'ad-psgd'"),
        (["topology=bipartite-exponential", "weights=uniform"], "weights: algorithm 'ad-psgd'"),
    ],
)
def test_adpsgd_graph_problems_are_refused_by_the_config(
    overrides: list[str], expected: str
) -> None:
    assert expected in _problem(*ASYNC, *overrides)


def test_adpsgd_accepts_bipartite_schedules() -> None:
    for topology in ("ring", "bipartite-exponential"):
        assert load_config(None, [*ASYNC, f"topology={topology}"], environ={}).topology == topology


def test_push_split_and_absorb_conserve_numerators_and_weights() -> None:
    # column-stochastic P with unequal in-degrees: weights move away from 1
    P = np.array([[0.5, 0.0, 0.5], [0.25, 0.5, 0.5], [0.25, 0.5, 0.0]])
    assert np.allclose(P.sum(axis=0), 1)
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    w = np.array([1.0, 1.2, 0.8])
    kept, kept_w, messages = push_split(x, w, P, [0, 1, 2])
    shares: list[list[torch.Tensor]] = [[], [], []]
    wshares: list[list[float]] = [[], [], []]
    for row, j, p in messages:
        shares[j].append(x[row] * p)
        wshares[j].append(p * w[row])
    mixed = [absorb(kept[j], float(kept_w[j]), shares[j], wshares[j]) for j in range(3)]
    # float64 sums of a few terms: 1e-12 leaves room for their rounding only
    assert abs(sum(m[1] for m in mixed) - w.sum()) < 1e-12
    assert torch.allclose(torch.stack([m[0] for m in mixed]).sum(dim=0), x.sum(dim=0), atol=1e-12)
    assert torch.allclose(torch.stack([m[0] for m in mixed]), torch.from_numpy(P) @ x, atol=1e-12)
    assert due_rounds(10, 3) == 7
    assert due_rounds(1, 2) == -1
    assert due_rounds(0, 16) == 0  # the start-up barrier: round 0 at the end of step 0


def _problem(*overrides: str) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(None, list(overrides), environ={})
    return str(exc.value)


def test_async_config_errors_name_the_key_and_range() -> None:
    assert "async.speeds" in _problem(*ASYNC, 'async.speeds="uniform:8:1"')
    assert "lognormal:SIGMA" in _problem(*ASYNC, 'async.speeds="lognormal:9"')
    assert "async.speeds: lists 2 multipliers for 8 peers" in _problem(
        *ASYNC, "async.speeds=[1.0, 2.0]"
    )
    assert "async.speeds: must be a finite float > 0" in _problem(*ASYNC, "async.speeds=0")
    assert "edge" in _problem(*ASYNC, 'async.delays="moon"')
    assert "async.delays: must be ≥ 0" in _problem(*ASYNC, "async.delays=-1")
    assert "async.delays: a matrix must be 8 × 8" in _problem(
        *ASYNC, "async.delays=[[0.0, 1.0], [1.0, 0.0]]"
    )
    assert "async.max_staleness" in _problem(*ASYNC, "async.max_staleness=-1")
    assert "async.compute_s" in _problem(*ASYNC, "async.compute_s=0")
    tiny = _problem(*ASYNC, "async.compute_s=1e-10")
    assert "async.compute_s: " in tiny
    assert "1 ns" in tiny
    both = _problem(*ASYNC, "async.speeds=[1.0, 2.0]", "topology=star")
    assert "async.speeds: lists 2" in both
    assert "peers 0 and 2" in both


def test_async_refused_combinations_say_why() -> None:
    assert "asynchronous algorithms" in _problem("algorithm=dsgd", "async.max_staleness=1")
    assert "grpc" in _problem(*ASYNC, "engine=processes", "network.transport=torch")
    assert "control.mode" in _problem(*ASYNC[:1], "control.mode=adaptive")
    assert "control.mode" in _problem("algorithm=async-sgp", "control.mode=fixed")
    assert "plan" in _problem(*ASYNC, "plan=dec-phase-1")
    assert "dataset.augment" in _problem(*ASYNC, "dataset.augment=true")


def test_async_config_defaults_and_draws() -> None:
    clock = ['async.speeds="uniform:1:8"', 'async.delays="edge"']
    cfg = load_config(None, [*ASYNC, *clock], environ={})
    assert cfg.engine == "vectorized"  # the only engine that runs it
    speeds = cfg.asynchrony.speed_list(8, cfg.seed)
    assert speeds == cfg.asynchrony.speed_list(8, cfg.seed)  # drawn from the seed
    assert speeds != cfg.asynchrony.speed_list(8, cfg.seed + 1)
    assert all(1 <= s <= 8 for s in speeds)
    delays = cfg.asynchrony.delay_matrix(8)
    assert delays[0][1] == pytest.approx(0.030)  # 2 × 15 ms one way
    assert delays[3][3] == 0
    plain = load_config(None, ["algorithm=dsgd"], environ={})
    assert "async" not in plain.to_dict()  # other algorithms' files are unchanged


def test_push_split_below_min_weight_keeps_everything() -> None:
    # sender 0 (w = 0.1 < 0.25) keeps its whole numerator and weight and sends p = 0 messages;
    # sender 1 (w = 1.9) splits by its column of P as usual. Exact: products by 1 and ½
    P = np.array([[0.5, 0.5], [0.5, 0.5]])
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    w = np.array([0.1, 1.9])
    kept, kept_w, messages = push_split(x, w, P, [0, 1], min_weight=0.25)
    assert torch.equal(kept[0], x[0])
    assert kept_w[0] == 0.1
    assert torch.equal(kept[1], x[1] * 0.5)
    assert kept_w[1] == 0.95
    assert messages == [(0, 1, 0.0), (1, 0, 0.5)]
