"""The asynchronous simulation (`concord.sim.asynchronous`): reduction to the synchronous
algorithms, bit-reproducibility, push-sum conservation, the staleness bound, AD-PSGD's mean, and
``concord sim`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from concord.core.config import load_config
from concord.core.records import StepRecord
from concord.lab.cli import main
from concord.sim.asynchronous import AsyncSGPSimulation
from concord.sim.engine import Trainer
from concord.sim.events import Event, Kind

torch.set_num_threads(1)

SMALL = [
    "peers=8",
    "dataset.samples=1600",
    "model=mlp",
    "model.hidden=[16]",
    "epochs=3",
    "optim.batch_size=16",
    "eval.every=3",
    "control.mode=none",
    "engine=vectorized",
]
UNEQUAL = ['async.speeds="uniform:1:5"', "async.delays=0.4"]


def _train(overrides: list[str], steps: int | None = None) -> tuple[Trainer, list[StepRecord]]:
    trainer = Trainer(load_config(None, [*SMALL, *overrides], environ={}))
    total = trainer.total_steps if steps is None else steps
    return trainer, [trainer.train_step(s) for s in range(total)]


@pytest.mark.parametrize("budget", ["global", "per-peer"])
@pytest.mark.parametrize(
    ("asynchronous", "synchronous", "topology"),
    [
        ("ad-psgd", "dsgd", "bipartite-exponential"),
        ("async-sgp", "sgp", "exponential-one-peer-directed"),
    ],
)
def test_equal_speeds_and_no_delay_is_the_synchronous_run(
    asynchronous: str, synchronous: str, topology: str, budget: str
) -> None:
    # bit for bit: the same batches, gradients and elementwise optimizer arithmetic, and a mix of
    # two terms p_ii x_i + p_ij x_j with p = ½ (exact products, one rounding) in both engines;
    # either budget (global: every instant is n step ends, Σ k / n = t)
    a, ra = _train([f"algorithm={asynchronous}", f"topology={topology}", f"async.budget={budget}"])
    s, rs = _train([f"algorithm={synchronous}", f"topology={topology}"])
    assert len(ra) > 10
    assert torch.equal(a.task.x, s.task.x)
    # the record's loss: a float64 mean of the peers' float32 losses here, torch's float32 mean
    # there — they agree to float32 rounding
    assert [r.loss for r in ra] == pytest.approx([r.loss for r in rs], rel=1e-6)
    assert all(r.local_steps == 8 and r.wait_s == 0 and r.staleness_max == 0 for r in ra)
    assert [r.virtual_time for r in ra[:2]] == [1.0, 2.0]


def test_equal_speeds_async_sgp_on_a_denser_graph_matches_sgp_to_rounding() -> None:
    # the ring's three-term push-sum mixes are summed in another order than the engine's
    # matrix product: the engines' contract tolerance (1e-5) applies, not bit equality
    a, _ = _train(["algorithm=async-sgp", "topology=ring"])
    s, _ = _train(["algorithm=sgp", "topology=ring"])
    torch.testing.assert_close(a.task.x, s.task.x, rtol=0, atol=1e-5)


@pytest.mark.parametrize("algorithm", ["ad-psgd", "async-sgp"])
def test_same_seed_same_run_bit_for_bit(algorithm: str) -> None:
    a, ra = _train([f"algorithm={algorithm}", *UNEQUAL])
    b, rb = _train([f"algorithm={algorithm}", *UNEQUAL])
    assert torch.equal(a.task.x, b.task.x)
    assert ra == rb
    c, _ = _train([f"algorithm={algorithm}", *UNEQUAL, "seed=1"])
    assert not torch.equal(a.task.x, c.task.x)
    assert a.asynchronous is not None
    assert len(set(a.asynchronous.steps)) > 1  # the speeds really differ


@pytest.mark.parametrize("tau", [0, 1, 3])
def test_async_sgp_staleness_never_exceeds_tau(tau: int) -> None:
    _, records = _train(
        [
            "algorithm=async-sgp",
            'async.speeds="uniform:1:8"',
            "async.delays=1.5",
            f"async.max_staleness={tau}",
        ]
    )
    worst = max(r.staleness_max for r in records if r.staleness_max is not None)
    assert worst <= tau
    waited = sum(r.wait_s or 0.0 for r in records)
    assert waited > 0  # slow peers and long delays: the bound is what made fast peers wait
    if tau > 0:
        assert worst == tau  # … and it is reached, so the check above is not vacuous


def _watch_weights(
    overrides: list[str],
) -> tuple[list[float], list[float], tuple[float, float]]:
    """Run async-sgp; after every instant of the virtual clock: Σ w + weight in flight, Σ w at
    the quiescent instants (nothing in flight or unmixed), and the (smallest, largest) w_i
    seen of peers not waiting to mix (a waiting peer holds only its kept p_ii w_i)."""
    trainer = Trainer(load_config(None, [*SMALL, "algorithm=async-sgp", *overrides], environ={}))
    sim = trainer.asynchronous
    assert isinstance(sim, AsyncSGPSimulation)
    totals: list[float] = []
    quiescent: list[float] = []
    extremes = [1.0, 1.0]
    wave = sim._wave

    def checked(events: list[Event]) -> None:
        wave(events)
        totals.append(sim.weight_total())
        mixed = [float(w) for i, w in enumerate(sim.weights) if i not in sim.waiting]
        extremes[0] = min([extremes[0], *mixed])
        extremes[1] = max([extremes[1], *mixed])
        if sim.quiescent():
            quiescent.append(float(sim.weights.sum()))

    sim._wave = checked  # type: ignore[method-assign]
    for s in range(trainer.total_steps):
        trainer.train_step(s)
    return totals, quiescent, (extremes[0], extremes[1])


def test_push_sum_weights_sum_to_n_at_every_quiescent_point() -> None:
    # float64 sums of n = 8 weights, each built from halves and thirds: 1e-12 is rounding only.
    # τ = 0 without delay: the slowest peer's step end is a barrier, nothing left in flight
    totals, quiescent, (smallest, largest) = _watch_weights(
        [
            'async.speeds="uniform:1:5"',
            "async.max_staleness=0",
            "topology=exponential-one-peer-directed",
        ]
    )
    assert quiescent
    assert max(abs(q - 8) for q in quiescent) < 1e-12
    assert max(abs(t - 8) for t in totals) < 1e-12
    # τ = 0: every step end mixes exactly the shares of its own round (a share of a later
    # round that arrives early is held, `mixable`), and this P is doubly stochastic (½ + ½):
    # each weight stays 1 exactly — the synchronous run's. Mixing early rounds at once (the
    # old rule) moved them away from 1
    assert smallest == largest == 1.0
    # with delays something is always in flight: the weight it carries completes the sum
    totals, _, (smallest, largest) = _watch_weights(UNEQUAL)
    assert max(abs(t - 8) for t in totals) < 1e-12
    assert smallest < 1 - 1e-6  # late shares moved the weights away from 1


def test_adpsgd_preserves_the_mean_with_delays_and_unequal_speeds() -> None:
    # lr 1e-30: every local step leaves x unchanged (below half an ulp of the parameters), so
    # only the averagings move x; they preserve the mean up to their roundings (see
    # tests/core/test_async_rules.py: ≤ ~1e-5 here, typically 1e-7)
    trainer = Trainer(
        load_config(None, [*SMALL, "algorithm=ad-psgd", *UNEQUAL, "optim.lr=1e-30"], environ={})
    )
    x = trainer.task.x
    x.add_(torch.randn(x.shape, generator=torch.Generator().manual_seed(0)))
    before = x.double().mean(dim=0)
    spread = float((x - x.mean(dim=0)).norm())
    records = [trainer.train_step(s) for s in range(trainer.total_steps)]
    assert torch.allclose(x.double().mean(dim=0), before, rtol=0, atol=1e-5)
    assert float((x - x.mean(dim=0)).norm()) < 0.5 * spread  # it did average
    assert max(r.staleness_max or 0 for r in records) > 0  # delays made mixes stale
    assert all(r.wait_s == 0 for r in records)  # AD-PSGD never waits


@pytest.mark.parametrize("algorithm", ["ad-psgd", "async-sgp"])
def test_concord_sim_runs_asynchronous_algorithms(tmp_path: Path, algorithm: str) -> None:
    out = tmp_path / "run"
    args = ["sim", "--engine", "vectorized", "--quiet", "--out", str(out)]
    for s in [
        "peers=4",
        "dataset.samples=600",
        "epochs=1",
        "model=mlp",
        f"algorithm={algorithm}",
        'async.speeds="uniform:1:3"',
        "async.delays=0.2",
    ]:
        args += ["--set", s]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithm"] == algorithm
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [d["virtual_time"] for d in lines if "virtual_time" in d]
    assert len(times) == summary["steps"]
    assert times == sorted(times)
    assert times[0] > 0


LATE = ['async.speeds="uniform:1:5"', "async.delays=2.5"]  # messages still in flight at the end


def test_adpsgd_run_ends_with_every_reply_absorbed() -> None:
    # Σ x after the run must be Σ x⁰ minus every applied update (lr_i d_i): the averagings
    # preserve it once their replies are absorbed. Tolerance 1e-5: float32 roundings of 8 rows
    # over ~40 steps (measured 2e-7); a reply left in flight moves it by ~0.1 here.
    trainer = Trainer(load_config(None, [*SMALL, "algorithm=ad-psgd", *LATE], environ={}))
    sim = trainer.asynchronous
    assert sim is not None
    x = trainer.task.x
    before = x.double().sum(dim=0)
    applied = torch.zeros_like(before)
    update = sim.update

    def counted(peers: list[int], directions: torch.Tensor, lrs: list[float]) -> None:
        col = torch.tensor(lrs, dtype=torch.float64).unsqueeze(1)
        applied.add_((directions.double() * col).sum(dim=0))
        update(peers, directions, lrs)

    sim.update = counted  # type: ignore[method-assign]
    for s in range(trainer.total_steps):
        trainer.train_step(s)
    assert sim.queue.pending(Kind.ARRIVE) == 0
    assert float(applied.abs().max()) > 0.1  # the updates are not trivial
    torch.testing.assert_close(x.double().sum(dim=0), before - applied, rtol=0, atol=1e-5)


@pytest.mark.parametrize("tau", [0, 2])
def test_async_sgp_run_ends_settled(tau: int) -> None:
    # nothing in flight, unmixed or waiting; Σ w = n to float64 rounding (1e-12)
    trainer, records = _train(["algorithm=async-sgp", *LATE, f"async.max_staleness={tau}"])
    sim = trainer.asynchronous
    assert isinstance(sim, AsyncSGPSimulation)
    assert sim.quiescent()
    assert not sim.waiting
    assert abs(float(sim.weights.sum()) - 8) < 1e-12
    assert all(r.wait_s is not None and r.wait_s >= 0 for r in records)


def test_async_sgp_min_weight_bounds_the_weights() -> None:
    # τ = 16 with unequal speeds: fast peers run ahead of their in-neighbours and push weight
    # away faster than it comes back. With async.min_weight = 0.25 a peer below it keeps its
    # shares, so no weight falls below 0.25 × p_ii = 0.125 (one-peer graph: p_ii = ½); without
    # it they do. Σ w = n at the end either way (holding keeps the columns stochastic; float64
    # rounding: 1e-12).
    lows = {}
    for floor in (0.0, 0.25):
        over = ["algorithm=async-sgp", "topology=exponential-one-peer-directed", *UNEQUAL]
        trainer = Trainer(
            load_config(
                None,
                [*SMALL, *over, "async.max_staleness=16", f"async.min_weight={floor}"],
                environ={},
            )
        )
        sim = trainer.asynchronous
        assert isinstance(sim, AsyncSGPSimulation)
        low = 1.0
        for s in range(trainer.total_steps):
            trainer.train_step(s)
            low = min(low, float(sim.weights.min()))
        lows[floor] = low
        assert abs(float(sim.weights.sum()) - 8) < 1e-12
    assert lows[0.0] < 0.125
    assert lows[0.25] >= 0.125 - 1e-12


@pytest.mark.parametrize("algorithm", ["ad-psgd", "async-sgp"])
def test_global_budget_is_n_times_t_local_steps(algorithm: str) -> None:
    # async.budget = "global": window t ends at the instant the local steps reach n·(t + 1) (at
    # most n − 1 more when several steps end at that instant), the run at exactly n·T; the
    # learning rate of a step is the schedule's at ⌊Σ k / n⌋ before it ends
    overrides = [f"algorithm={algorithm}", *UNEQUAL, "async.budget=global", "optim.warmup=0.3"]
    trainer = Trainer(load_config(None, [*SMALL, *overrides], environ={}))
    sim = trainer.asynchronous
    assert sim is not None
    n, total = 8, trainer.total_steps
    seen: list[tuple[int, list[float]]] = []
    update = sim.update

    def watched(peers: list[int], directions: torch.Tensor, lrs: list[float]) -> None:
        seen.append((sim.total, lrs))
        update(peers, directions, lrs)

    sim.update = watched  # type: ignore[method-assign]
    done = []
    records = []
    for s in range(total):
        records.append(trainer.train_step(s))
        done.append(sum(sim.steps))
    assert done[-1] == n * total
    assert all(n * (t + 1) <= d < n * (t + 2) for t, d in enumerate(done[:-1]))
    assert all(r.loss is not None and r.local_steps for r in records)
    assert sum(r.local_steps or 0 for r in records) == n * total
    assert len(set(sim.steps)) > 1  # unequal speeds: unequal shares of the budget
    assert max(sim.steps) > total > min(sim.steps)  # fast peers went past T, slow ones not
    schedule = trainer.runner.schedule
    assert len({lr for _, lrs in seen for lr in lrs}) > 3  # the warm-up moves it
    for before, lrs in seen:
        assert lrs == [schedule.lr(min(before // n, total - 1))] * len(lrs)
    times = [r.virtual_time or 0.0 for r in records]
    assert times == sorted(times)


def test_global_budget_async_sgp_ends_settled() -> None:
    # the last instant may end more steps than the budget has left: those are dropped (in
    # progress at the end); the run still settles with Σ w = n (float64 rounding: 1e-12)
    trainer, _ = _train(["algorithm=async-sgp", *LATE, "async.budget=global"])
    sim = trainer.asynchronous
    assert isinstance(sim, AsyncSGPSimulation)
    assert sum(sim.steps) == 8 * trainer.total_steps
    assert sim.quiescent()
    assert not sim.waiting
    assert abs(float(sim.weights.sum()) - 8) < 1e-12
