"""The peer processes' asynchronous algorithms (`concord.peer.asynchronous`) with their real step
runners, update rules and event-loop handlers, but an in-memory wire instead of gRPC: the order
of every step end and message is forced by the test.

* a forced interleaving equals the simulator's replay of it: equal speeds with a one-way delay
  δ shorter than half a step (a round trip lands inside the next step) — the interleaving
  "every peer ends step k (passive before active peers), then every message of step k is
  delivered" — gives the vectorized engine's models after the same steps;
* AD-PSGD preserves the mean of the models under random interleavings (lr = 0, distinct initial
  models), and async-sgp keeps Σ w = n and the numerators' sum at quiescence;
* ``async.budget = "global"``: peers at unequal speeds stop once their progress vectors say
  Σ k ≥ n·T, within the documented overshoot, async-sgp quiescent with Σ w = n, and a slow
  peer's learning rate follows the global progress, not its own steps.

The real wire is covered end to end by tests/integration/test_async_processes.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from concord.core.comm import Comm, CommCounters, Edge, MixResult
from concord.core.config import RunConfig, load_config
from concord.core.records import StepRecord
from concord.core.task import ClassificationTask
from concord.peer.async_wire import ACK, REQUEST, SHARE, Message, WireView
from concord.peer.asynchronous import (
    EARLY_LIMIT,
    ADPSGDPeer,
    AsyncInbox,
    AsyncPeer,
    AsyncSGPPeer,
    AsyncStepRunner,
)
from concord.sim.engine import Trainer

torch.set_num_threads(1)

SMALL = [
    "peers=4",
    "dataset.samples=800",
    "model=mlp",
    "model.hidden=[16]",
    "epochs=2",
    "optim.batch_size=16",
    "control.mode=none",
    "engine=vectorized",
    "async.budget=per-peer",  # T local steps each (the global budget: tests at the end)
]


class _Comm(Comm):
    """The comm a peer's runner holds: counters only (the asynchronous path never mixes)."""

    def __init__(self, rank: int, n: int) -> None:
        self.rank, self.n = rank, n
        self.counters = CommCounters()

    @property
    def world_size(self) -> int:
        return self.n

    @property
    def ranks(self) -> Sequence[int]:
        return (self.rank,)

    def mix(self, *args: object, **kwargs: object) -> MixResult:
        raise AssertionError("an asynchronous step mixed through the Comm")

    def allreduce_mean(self, x: torch.Tensor, *, step: int = 0) -> torch.Tensor:
        raise AssertionError("an asynchronous step averaged through the Comm")

    def exchange(self, *args: object, **kwargs: object) -> dict[Edge, torch.Tensor]:
        raise AssertionError("an asynchronous step exchanged through the Comm")


class _NoLearning:
    def __init__(self, total_steps: int) -> None:
        self.total_steps = total_steps

    def lr(self, step: int) -> float:
        return 0.0


class _Transport:
    def __init__(self, rank: int) -> None:
        self.peer_id = rank
        self.links: dict[int, object] = {}


class Network:
    """n peers on one background event loop; requests are answered at once, shares are held
    until `deliver` (or delivered at once with ``immediate``)."""

    def __init__(
        self, cfg: RunConfig, x0: list[torch.Tensor] | None = None, *, learn: bool = True
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.held: list[tuple[int, Message]] = []
        self.immediate = False
        self.runners: list[AsyncStepRunner] = []
        self.peers: list[AsyncPeer] = []
        kind = ADPSGDPeer if cfg.algorithm == "ad-psgd" else AsyncSGPPeer
        for i in range(cfg.peers):
            task = ClassificationTask(cfg, [i], device=torch.device("cpu"))
            if x0 is not None:
                task.x[0].copy_(x0[i])
            runner = AsyncStepRunner(cfg, task, _Comm(i, cfg.peers))
            if not learn:  # lr = 0 (the config refuses it): only the communication moves x
                runner.schedule = _NoLearning(runner.total_steps)  # type: ignore[assignment]
            peer = kind(runner, _Transport(i), self.loop)  # type: ignore[arg-type]
            peer._send = self._sender()  # type: ignore[method-assign, assignment]
            runner.peer = peer
            self.runners.append(runner)
            self.peers.append(peer)

    def _sender(self) -> Callable[[int, Message], Coroutine[None, None, Message | None]]:
        async def send(j: int, msg: Message) -> Message | None:
            if msg.kind == REQUEST or self.immediate:
                return self.peers[j].on_message(msg)
            self.held.append((j, msg))
            return Message(ACK, j, msg.step)

        return send

    def deliver(self) -> None:
        held, self.held = self.held, []
        for j, msg in held:
            self.peers[j].on_message(msg)

    def step(self, i: int, k: int) -> None:
        self.runners[i].run_step(k)
        peer = self.peers[i]
        if isinstance(peer, ADPSGDPeer) and peer.outstanding is not None:
            peer.outstanding.result(timeout=10)  # the reply is queued before the next step
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self.loop).result(timeout=10)

    def models(self) -> torch.Tensor:
        return torch.stack([r.task.x[0] for r in self.runners])

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def _weights(net: Network) -> np.ndarray:
    """Every peer's push-sum weight."""
    return np.array([float(p.weights()[0]) for p in net.peers if isinstance(p, AsyncSGPPeer)])


def _sim_weights(sim: Trainer) -> np.ndarray:
    weights = getattr(sim.algorithm, "weights", None)
    assert isinstance(weights, np.ndarray)
    return weights


def _together(net: Network, k: int) -> None:
    """Every peer runs step ``k`` in a thread of its own, shares delivered at once (a barrier
    step waits for the others' shares, like peer processes)."""
    before, net.immediate = net.immediate, True
    threads = [threading.Thread(target=r.run_step, args=(k,)) for r in net.runners]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    net.immediate = before


@contextlib.contextmanager
def _network(
    cfg: RunConfig, x0: list[torch.Tensor] | None = None, *, learn: bool = True
) -> Iterator[Network]:
    net = Network(cfg, x0, learn=learn)
    try:
        yield net
    finally:
        net.close()


@pytest.mark.parametrize(
    ("algorithm", "topology"),
    [("ad-psgd", "ring"), ("ad-psgd", "bipartite-exponential"), ("async-sgp", "ring")],
)
def test_forced_interleaving_equals_the_simulator(algorithm: str, topology: str) -> None:
    peers = "peers=6" if topology == "bipartite-exponential" else "peers=4"  # n = 4: one hop
    # δ = 0.2 of a step: in the simulator a request reaches the passive peer, and its reply the
    # active one, during the next step; a push-sum share is mixed at the next step's end
    over = [*SMALL, peers, f"algorithm={algorithm}", f"topology={topology}", "async.delays=0.2"]
    cfg = load_config(None, over, environ={})
    sim = Trainer(cfg)
    # the peers' last step is special (AD-PSGD sends nothing, async-sgp drains every share):
    # compare after all but the last
    steps = sim.total_steps - 1
    sim_records = [sim.train_step(k) for k in range(steps)]
    with _network(cfg) as net:
        order = sorted(range(cfg.peers), key=lambda i: (i % 2, i))  # passive peers first
        # async-sgp's first step ends 0.2 later in the simulator (it waits for the first
        # shares): by the end of its window `steps − 1`, local step `steps − 1` has not ended
        done = steps - 1 if algorithm == "async-sgp" else steps
        for k in range(done):
            if k == 0 and algorithm == "async-sgp":  # a barrier: the first shares are mixed now
                _together(net, 0)
                continue
            for i in order:
                net.step(i, k)
            net.deliver()
        # float32 sums of the same terms in another order (a delta added after the local
        # update here, averaged before it there): ~1e-7 per step over ~100 steps
        torch.testing.assert_close(net.models(), sim.task.x, rtol=0, atol=2e-5)
        if algorithm == "async-sgp":
            weights = _weights(net)
            np.testing.assert_allclose(weights, _sim_weights(sim), rtol=0, atol=1e-12)
    assert all(r.staleness_max in (None, 0, 1) for r in sim_records)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_adpsgd_preserves_the_mean_under_random_interleavings(seed: int) -> None:
    # lr = 0: only averagings move the models. Each averaging adds ½ (b − a) to one model and
    # ½ (a − b) to the other — exact negatives — so Σ x moves only by the rounding of the
    # additions: ≲ 4 · 2⁻²⁴ · |x| per averaging, ~1e-6 after ~100 of them at |x| ≲ 1
    cfg = load_config(None, [*SMALL, "algorithm=ad-psgd", "topology=ring"], environ={})
    gen = torch.Generator().manual_seed(seed)
    dim = ClassificationTask(cfg, [0], device=torch.device("cpu")).x.shape[1]
    x0 = [torch.randn(dim, generator=gen) for _ in range(cfg.peers)]
    rng = random.Random(seed)
    with _network(cfg, x0, learn=False) as net:
        mean0 = net.models().double().mean(0)
        spread0 = float((net.models() - net.models().mean(0)).norm())
        _together(net, 0)  # the start-up barrier: every first share is mixed at step 0
        done = [1] * cfg.peers
        total = net.runners[0].total_steps
        while min(done) < total:  # random peer order, replies waited for or not
            i = rng.choice([j for j in range(cfg.peers) if done[j] < total])
            net.runners[i].run_step(done[i])
            done[i] += 1
        for p in net.peers:  # let every reply land, then one more boundary applies nothing new
            if isinstance(p, ADPSGDPeer):
                p.wait_outstanding()
        models = net.models().double()
        torch.testing.assert_close(models.mean(0), mean0, rtol=0, atol=1e-5)
        assert float((net.models() - net.models().mean(0)).norm()) < 0.5 * spread0  # it mixed


def test_async_sgp_conserves_weight_and_mass_at_quiescence() -> None:
    cfg = load_config(None, [*SMALL, "algorithm=async-sgp", "topology=ring"], environ={})
    gen = torch.Generator().manual_seed(0)
    dim = ClassificationTask(cfg, [0], device=torch.device("cpu")).x.shape[1]
    x0 = [torch.randn(dim, generator=gen) for _ in range(cfg.peers)]
    rng = random.Random(0)
    with _network(cfg, x0, learn=False) as net:
        net.immediate = True
        mass0 = net.models().double().sum(0)
        _together(net, 0)  # the start-up barrier: every first share is mixed at step 0
        done = [1] * cfg.peers
        total = net.runners[0].total_steps
        # τ = 2: a peer waits for shares two rounds old, so random order never more than one
        # step ahead of the slowest; the last steps drain every share of every round and wait
        # for each other: they run in parallel threads, like peer processes
        while min(done) < total - 1:
            ready = [
                j for j in range(cfg.peers) if done[j] < total - 1 and done[j] <= min(done) + 1
            ]
            i = rng.choice(ready)
            net.runners[i].run_step(done[i])
            done[i] += 1
        last = [threading.Thread(target=r.run_step, args=(total - 1,)) for r in net.runners]
        for t in last:
            t.start()
        for t in last:
            t.join(timeout=60)
        w = _weights(net)
        # float64 weights: Σ w = n to rounding of ~n·steps additions
        assert abs(w.sum() - cfg.peers) < 1e-9
        numerators = (net.models().double() * torch.from_numpy(w).unsqueeze(1)).sum(0)
        # float32 numerators split and summed: 1e-4 relative over the run
        torch.testing.assert_close(numerators, mass0, rtol=0, atol=1e-3)


def test_async_sgp_first_step_waits_for_the_in_neighbours() -> None:
    # the start-up barrier (`due_rounds`: round 0 is due at the end of step 0, whatever τ): a
    # peer that starts alone does not run ahead pushing its weight away (w would halve at each
    # of its first τ steps, and its steps on z = x / w grow as η / w)
    over = [*SMALL, "algorithm=async-sgp", "topology=ring", "async.max_staleness=16"]
    cfg = load_config(None, over, environ={})
    with _network(cfg) as net:
        net.immediate = True
        alone = threading.Thread(target=net.runners[0].run_step, args=(0,))
        alone.start()
        alone.join(timeout=0.5)
        assert alone.is_alive()  # still waiting for peers 1 and 3's first shares
        others = [threading.Thread(target=r.run_step, args=(0,)) for r in net.runners[1:]]
        for t in others:
            t.start()
        for t in [alone, *others]:
            t.join(timeout=60)
        assert not alone.is_alive()
        # the ring's matrix is doubly stochastic: after a complete round every weight is 1
        # again (float64 sums of three terms: 1e-12)
        np.testing.assert_allclose(_weights(net), np.ones(cfg.peers), rtol=0, atol=1e-12)


def test_async_sgp_below_min_weight_sends_empty_shares() -> None:
    # ring of 4, P = ⅓ everywhere on the band: peer 0 at w = 0.1 < async.min_weight keeps its
    # whole numerator and weight; its neighbours' rounds still complete (empty shares: nothing
    # lost, nobody waits) and Σ w is unchanged. float64 sums of three terms: 1e-12
    over = [*SMALL, "algorithm=async-sgp", "topology=ring", "async.min_weight=0.25"]
    cfg = load_config(None, over, environ={})
    with _network(cfg) as net:
        sgp = [p for p in net.peers if isinstance(p, AsyncSGPPeer)]
        sgp[0].weights()[0] = 0.1
        _together(net, 0)
        np.testing.assert_allclose(
            _weights(net), [0.1 + 2 / 3, 2 / 3, 1.0, 2 / 3], rtol=0, atol=1e-12
        )
        assert all(not p.suspect for p in sgp)


def test_async_sgp_holds_shares_of_rounds_ahead_until_its_own_step() -> None:
    # Ring of 4 (P = ⅓ on the band: doubly stochastic), τ = 8. Peers 0, 2, 3 run steps 1..8
    # while peer 1 computes nothing; every share is delivered at once. Peer 1 then catches up:
    # at its step 1 it holds the shares of rounds 2..8 from peers 0 and 2 (`mixable`) and mixes
    # only round 1's. Each of its steps then mixes round k of both in-neighbours, so its weight
    # is a convex combination (rows of P sum to 1) of weights ≥ the smallest any peer had: it
    # never falls below that floor. The old rule (mix every arrived share at once) gave peer 1
    # all the income of rounds 1..8 at step 1 (w ≤ n = 4) and none at steps 2..8, where it
    # still pushed ⅔ of its weight out: w ≤ 4 · 3⁻⁷ ≈ 2e-3 after step 8, its steps on
    # z = x / w ~500 times η — the divergence seen under load.
    over = [*SMALL, "algorithm=async-sgp", "topology=ring", "async.max_staleness=8"]
    over += ["async.min_weight=0"]  # the hold rule alone: the peers ahead drain below 0.25
    cfg = load_config(None, over, environ={})
    with _network(cfg, learn=False) as net:
        net.immediate = True
        sgp = [p for p in net.peers if isinstance(p, AsyncSGPPeer)]
        _together(net, 0)
        floor = 1.0
        for k in range(1, 9):
            for i in (0, 2, 3):
                net.step(i, k)  # its shares are delivered before the next step
                floor = min(floor, float(_weights(net)[i]))
        # each of these steps keeps at least p_ii = ⅓ of the weight, and they ran τ = 8 steps
        # with nothing from peer 1: ≥ 3⁻⁸ (the drain a τ-step lead allows)
        assert floor >= 3.0**-8
        catch_up: list[StepRecord] = []
        for k in range(1, 9):
            record, _ = net.runners[1].run_step(k)
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), net.loop).result(timeout=10)
            catch_up.append(record)
            if k == 1:  # rounds 2..8 of peers 0 and 2 are held, not mixed
                assert sorted(m.step for m in sgp[1].inbox) == sorted(2 * list(range(2, 9)))
            # float64 convex combinations: rounding only, 1e-12
            assert float(_weights(net)[1]) >= floor - 1e-12
        assert not sgp[1].inbox
        assert all(r.staleness_max == 0 for r in catch_up)  # each share mixed at its round
        # not vacuous: the old rule's bound, 4 · 3⁻⁷ ≈ 1.8e-3, is far below
        assert float(_weights(net)[1]) > 50 * 4 * 3.0**-7
        # the run to its end: the last steps mix everything held and Σ w = n (float64: 1e-9)
        total = net.runners[0].total_steps
        for k in range(9, total - 1):
            for r in net.runners:
                r.run_step(k)
        last = [threading.Thread(target=r.run_step, args=(total - 1,)) for r in net.runners]
        for t in last:
            t.start()
        for t in last:
            t.join(timeout=60)
        assert not any(p.inbox for p in sgp)
        assert abs(_weights(net).sum() - cfg.peers) < 1e-9


def _global(net: Network, periods: list[int], limit: int = 1000) -> list[list[StepRecord]]:
    """Run every peer until it decides its last step (``async.budget = "global"``): at tick t
    (from 1) peer i ends a step when t is a multiple of ``periods[i]``, in rank order; the
    records of each peer."""
    records: list[list[StepRecord]] = [[] for _ in net.peers]
    # async-sgp: step 0 ran together (`_together`: the start-up barrier)
    k = [1 if isinstance(p, AsyncSGPPeer) else 0 for p in net.peers]
    for tick in range(1, limit):
        for i, peer in enumerate(net.peers):
            if peer.last_step is None and tick % periods[i] == 0:
                records[i].append(net.runners[i].run_step(k[i])[0])
                if isinstance(peer, ADPSGDPeer):
                    peer.wait_outstanding()
                asyncio.run_coroutine_threadsafe(asyncio.sleep(0), net.loop).result(timeout=10)
                k[i] += 1
        if all(p.last_step is not None for p in net.peers):
            return records
    raise AssertionError(f"the peers did not stop within {limit} ticks: {k}")


def _overshoot_bound(periods: list[int], diameter: int) -> int:
    """docs/algorithms.md: after Σ k reaches n·T, peer i takes at most 1 + ⌈D · t_max / t_i⌉
    more steps (news crosses D hops, one step of the slowest sender each; no delay here)."""
    slowest = max(periods)
    return sum(1 + -(-diameter * slowest // t) for t in periods)


def test_global_budget_async_sgp_stops_at_n_t_quiescent() -> None:
    # ring of 4 (diameter 2), peer 0 at half speed; τ = 16 so that the others never wait for
    # it before the budget is spent (lr = 0: the numerators' sum is conserved too)
    over = [*SMALL, "algorithm=async-sgp", "topology=ring", "async.max_staleness=16"]
    cfg = load_config(None, [*over, "async.budget=global"], environ={})
    gen = torch.Generator().manual_seed(0)
    dim = ClassificationTask(cfg, [0], device=torch.device("cpu")).x.shape[1]
    x0 = [torch.randn(dim, generator=gen) for _ in range(cfg.peers)]
    periods = [2, 1, 1, 1]
    with _network(cfg, x0, learn=False) as net:
        net.immediate = True
        mass0 = net.models().double().sum(0)
        _together(net, 0)
        records = _global(net, periods)
        total = net.runners[0].total_steps * cfg.peers
        steps = [len(r) + 1 for r in records]  # + step 0
        assert total <= sum(steps) <= total + _overshoot_bound(periods, 2)
        assert steps[0] < min(steps[1:])  # the slow peer did fewer
        sgp = [p for p in net.peers if isinstance(p, AsyncSGPPeer)]
        assert all(not p.inbox and not p.inflight and p.closed for p in sgp)
        w = _weights(net)
        assert abs(w.sum() - cfg.peers) < 1e-9  # float64: rounding of ~n·steps additions
        numerators = (net.models().double() * torch.from_numpy(w).unsqueeze(1)).sum(0)
        torch.testing.assert_close(numerators, mass0, rtol=0, atol=1e-3)  # float32 shares
        # every record's epoch is the peer's g: non-decreasing, and ≥ T at each last step
        for i, rows in enumerate(records):
            assert [r.epoch for r in rows] == sorted(r.epoch for r in rows)
            assert rows[-1].extra.get("budget_spent") is True
            assert rows[-1].epoch * net.runners[i].task.steps_per_epoch >= total / cfg.peers


def test_global_budget_slow_peer_follows_the_global_learning_rate() -> None:
    # AD-PSGD on a ring of 4, passive peer 0 four times slower: it takes fewer than T / 2
    # local steps, yet its last steps use the learning rate after the milestone at 50 % of the
    # run (the others' progress reached it); per-peer it would still be at the initial lr
    over = [*SMALL, "algorithm=ad-psgd", "topology=ring", "optim.milestones=[0.5]"]
    cfg = load_config(None, [*over, "async.budget=global", "optim.warmup=0"], environ={})
    periods = [4, 1, 1, 1]
    with _network(cfg) as net:
        records = _global(net, periods)
        T = net.runners[0].total_steps
        steps = [len(r) for r in records]
        assert cfg.peers * T <= sum(steps) <= cfg.peers * T + _overshoot_bound(periods, 2)
        assert steps[0] < T / 2
        lr0 = cfg.optim.lr
        assert records[0][0].lr == pytest.approx(lr0)
        assert records[0][-1].lr == pytest.approx(lr0 * cfg.optim.gamma)
        # a fast peer's records: the lr falls once, when its estimate of g passes T / 2
        lrs = [r.lr for r in records[1]]
        assert lrs == sorted(lrs, reverse=True)
        assert sorted(set(lrs)) == pytest.approx([lr0 * cfg.optim.gamma, lr0])
        assert all(p.last_step is not None for p in net.peers)


def _global_sgp(*extra: str) -> RunConfig:
    over = [*SMALL, "algorithm=async-sgp", "topology=ring", *extra]
    return load_config(None, [*over, "async.budget=global"], environ={})


def test_progress_vectors_cannot_raise_the_receivers_own_count_or_pass_n_t() -> None:
    cfg = _global_sgp()
    with _network(cfg) as net:
        peer = net.peers[0]
        limit = cfg.peers * net.runners[0].total_steps
        peer.progress = [3, 0, 0, 0]
        with peer.cond:  # only peer 0 counts its own steps; the others' entries merge
            peer.heard(Message(ACK, 1, 0, progress=(9, 4, 0, 2)))
        assert peer.progress == [3, 4, 0, 2]
        with peer.cond:  # an entry above n·T: the whole vector is dropped
            peer.heard(Message(ACK, 1, 0, progress=(0, limit + 1, 5, 2**62)))
        assert peer.progress == [3, 4, 0, 2]
        assert not peer.decide_final(3)  # g = (4 + 4 + 2) / 4, far from T
        # attaching sets the wire's bound: the servicer refuses such vectors from now on
        inbox = AsyncInbox.__new__(AsyncInbox)
        inbox.view = WireView(peer_id=0, world_size=4, dim=10, key=b"k" * 8, chunk_bytes=1024)
        inbox.servicer = SimpleNamespace(view=inbox.view)  # type: ignore[assignment]
        inbox.channels = None  # type: ignore[assignment]
        inbox.peer, inbox.early = None, []
        peer.attach(inbox)
        assert inbox.view.max_step == limit
        assert inbox.servicer.view is inbox.view
        assert peer.wire is inbox.view


def test_closed_from_a_late_starter_does_not_end_the_neighbour() -> None:
    # forced interleaving: peer 1's process has not attached its stage yet and its early queue
    # is full, so it answers peer 0's share CLOSED ("not training yet", progress all zeros);
    # peer 0 takes its share back but keeps sending to it. Later peer 1 has ended (closed, its
    # vector sums to n·T): that CLOSED marks it ended
    cfg = _global_sgp()
    with _network(cfg) as net:
        sender, late = net.peers[0], net.peers[1]
        assert isinstance(sender, AsyncSGPPeer)
        dim = net.runners[0].task.x.shape[1]
        inbox = AsyncInbox.__new__(AsyncInbox)
        inbox.view = WireView(peer_id=1, world_size=4, dim=dim, key=b"k" * 8, chunk_bytes=1024)
        inbox.peer = None
        early = Message(SHARE, 2, 0, 0.5, torch.zeros(dim), progress=(0, 0, 1, 0))
        inbox.early = [early] * EARLY_LIMIT
        attached = False

        async def send(j: int, msg: Message) -> Message | None:
            assert j == 1
            if attached:
                return late.on_message(msg)
            answer = await inbox.handle(msg)
            answer.progress = answer.progress or (0,) * cfg.peers  # as `AsyncServicer.push`
            return answer

        sender._send = send  # type: ignore[method-assign]
        share = Message(SHARE, 0, 0, 0.5, torch.ones(dim), progress=(1, 0, 0, 0))

        def push() -> None:
            asyncio.run_coroutine_threadsafe(sender._share(1, share), net.loop).result(10)

        push()
        assert 1 not in sender.ended  # a live neighbour that starts late
        assert 1 in sender.unreachable  # its share came back (the sender mixes it)
        assert sender.notes.returned == 1
        T = net.runners[1].total_steps
        late.progress = [T, 2 * T, T, 0]  # Σ = n·T: its budget is spent
        late.closed = attached = True
        push()
        assert sender.ended == {1: 0}


def test_contacts_cover_the_schedules_whole_period(monkeypatch: pytest.MonkeyPatch) -> None:
    # exponential-one-peer-directed on 8 peers: period 3, peer 0 pushes to 1, 2, 4 and hears
    # from 7, 6, 4. A stage of 2 steps saw only the first two rounds before (range(min(T, 64)))
    over = [*SMALL, "peers=8", "algorithm=async-sgp", "topology=exponential-one-peer-directed"]
    cfg = load_config(None, over, environ={})
    with _network(cfg) as net:
        peer = net.peers[0]
        assert isinstance(peer, AsyncSGPPeer)
        monkeypatch.setattr(AsyncStepRunner, "total_steps", property(lambda self: 2))
        assert peer.contacts() == ({4, 6, 7}, {1, 2, 4})
        assert peer.out_neighbours() == {1, 2, 4}
        assert peer.neighbours() == {1, 2, 4, 6, 7}


def test_global_learning_rate_is_read_as_the_step_ends() -> None:
    # the simulation's rule: a local step uses the lr of ⌊g⌋ at its end instant. News that
    # arrives during the step (here: the others at T / 2 steps each, past the milestone at
    # 50 % of the run) sets the lr of that very step
    over = [*SMALL, "algorithm=ad-psgd", "topology=ring", "optim.milestones=[0.5]"]
    cfg = load_config(None, [*over, "async.budget=global", "optim.warmup=0"], environ={})
    with _network(cfg) as net:
        runner, peer = net.runners[0], net.peers[0]
        T = runner.total_steps
        peer.started = 0.0  # past the start-up barrier
        compute = runner.task.loss_and_grad

        def during(step: int, x: torch.Tensor) -> object:
            with peer.cond:
                peer.heard(Message(ACK, 1, 0, progress=(0, T, T, 0)))  # g = T / 2
            return compute(step, x)

        runner.task.loss_and_grad = during  # type: ignore[method-assign, assignment]
        record = runner.run_step(0)[0]
        assert record.lr == pytest.approx(cfg.optim.lr * cfg.optim.gamma)


def test_contacts_of_a_random_schedule_are_every_member() -> None:
    over = [*SMALL, "algorithm=async-sgp", "topology=random-matching"]
    with _network(load_config(None, over, environ={})) as net:
        assert net.peers[2].contacts() == ({0, 1, 3}, {0, 1, 3})


@pytest.mark.parametrize("algorithm", ["ad-psgd", "async-sgp"])
def test_the_start_up_barrier_waits_for_peers_beyond_the_neighbours(algorithm: str) -> None:
    # a ring of 6: peer 3 is 3 hops from peer 0. With peer 0 still joining, peers 2 and 4
    # (its neighbours' neighbours) and 3 have every neighbour at its barrier, yet must not
    # start: alone they would spend the global budget (`AsyncPeer.await_neighbours`)
    over = [*SMALL, "peers=6", f"algorithm={algorithm}", "topology=ring", "async.budget=global"]
    cfg = load_config(None, over, environ={})
    with _network(cfg) as net:
        net.immediate = True  # PROGRESS and its ack at once
        assert [p.eccentricity() for p in net.peers] == [3] * 6
        started: dict[int, float] = {}

        def barrier(i: int) -> None:
            net.peers[i].await_neighbours(20.0)
            started[i] = time.perf_counter()

        threads = {i: threading.Thread(target=barrier, args=(i,)) for i in range(6)}
        for i in range(1, 6):
            threads[i].start()
        time.sleep(1.0)  # 50 polls each: ample for levels to settle
        assert started == {}, "a peer started while peer 0 had not reached its barrier"
        levels = [net.peers[i].levels[i] for i in range(6)]
        assert levels == [-1, 0, 1, 2, 1, 0]  # within L hops of peer i, all are at theirs
        joined = time.perf_counter()
        threads[0].start()
        for t in threads.values():
            t.join(timeout=20)
        # the PROGRESS messages still in flight when the barriers passed: run them before the
        # loop closes (a coroutine never awaited warns)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), net.loop).result(timeout=10)
        assert sorted(started) == list(range(6))
        assert max(started.values()) - joined < 5.0  # a few polls of 20 ms per hop, not 20 s
        assert all(net.peers[i].levels[i] >= 3 for i in range(6))
