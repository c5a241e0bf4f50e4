"""Asynchronous algorithms in the vectorized engine: wait-free local steps on a virtual clock.

`AsyncSimulation` drives ``ad-psgd`` (`ADPSGDSimulation`) and ``async-sgp``
(`AsyncSGPSimulation`) over `concord.sim.events`: peer i's local steps take
``async.compute_s × speeds[i]`` virtual seconds back to back (plus any wait), a message on link
i → j takes ``delays[i][j]``. The update rules are those of `concord.core.algorithms.ad_psgd`
and `concord.core.algorithms.async_sgp`, applied to rows of the replica-stacked [n, d] tensor.

One engine step (one `StepRecord`) is a *window*. With ``async.budget = "global"`` (the
default) window t runs until the instant at which the peers' local steps add up to n·(t + 1), so
the run's T windows hold exactly n·T local steps (the last instant's surplus step ends, lower
ranks first, are dropped as in progress), and a local step that ends when s steps have been
taken in all uses the learning rate of step ⌊s / n⌋. With ``"per-peer"`` it is a stretch of
virtual time as long as the fastest peer's local step: step t covers (t·Δ, (t + 1)·Δ], the
fastest peer takes at most T local steps (exactly T unless it waits: ``async-sgp`` under its
staleness bound) and slower peers fewer, a window in which no step ends has ``loss`` None, and
local step k uses the learning rate of step k. Either way peer i's local step k uses its batch
k. A record's ``rounds`` is 1 when any message was sent in its
window (so ``rounds_total`` counts windows with communication), and ``wait_s`` counts a wait in
the window where it ends.

The end of the run (after the last window's events, `AsyncSimulation.drain`): the peers stop
computing (steps in progress are dropped, as if never started) and the network settles — every
message still in flight is delivered at its arrival time (AD-PSGD: a request's reply too, so
Σ x is again Σ x⁰ minus the applied updates), then every ``async-sgp`` peer mixes what it holds,
whatever its round (shares of rounds ahead of its step included):
a waiting peer stops waiting (the wait counts up to the end of the last window, in the last
record) and mixes its kept numerator with its inbox, a computing peer mixes its inbox into
w_i z_i; nothing is then in flight or unmixed and Σ w = n. The final evaluation and Ξ read that
settled state.

Semantics of a local step (the papers'): the model is read when the step starts, the gradient is
taken there, and the local optimizer's direction (momentum, weight decay at the read point) is
applied when the step ends, to the model as it is then. Gradients are computed lazily and in
batches: a peer's gradient is needed only when its step ends, and then the gradients of every
peer in the middle of a step are computed at once (each row at its own read point with its own
batch) by one forward/backward of all n replicas — about one batched gradient per window, however
the step ends are spread in time.

Within one instant (a wave): arrivals, then the ending peers' updates, then their communication,
then the new steps start. With equal speeds and no delay every wave is a synchronous step:
``ad-psgd`` is then D-SGD on the same matchings and ``async-sgp`` is ``sgp`` on the same matrices
(bit for bit on one-peer graphs, where a mix adds two halves; to rounding on denser ones).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from concord.core.algorithms.ad_psgd import absorb_reply, is_active, pairwise_average, partner
from concord.core.algorithms.async_sgp import absorb, due_rounds, mixable, push_split
from concord.core.algorithms.bipartite import round_partner
from concord.core.algorithms.optim import LocalSGD
from concord.core.config import RunConfig
from concord.core.loop import StepRunner
from concord.core.models.flat import loss_and_grad
from concord.core.records import StepRecord
from concord.sim.events import TICKS_PER_SECOND, Event, EventQueue, Kind, VirtualClock
from concord.sim.vectorized import VectorizedComm

_NEVER = 2**62  # ticks: no deadline (`EventQueue.pop_wave`)


@dataclass
class _Window:
    """What happened in one engine step (window)."""

    losses: list[float] = field(default_factory=list)
    correct: int = 0
    samples: int = 0
    grad_norms: list[float] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)
    wait: int = 0  # ticks
    exchanges: int = 0


class AsyncSimulation:
    """The machinery both asynchronous algorithms share: clock, lazy batched gradients, the
    local optimizer on rows, windows → `StepRecord`s. Subclasses say what a peer does when a
    message arrives (`arrive`), what its update is (`update`) and how it communicates
    (`communicate`)."""

    def __init__(self, cfg: RunConfig, runner: StepRunner, comm: VectorizedComm) -> None:
        self.cfg = cfg
        self.runner = runner
        self.task = runner.task
        self.comm = comm
        self.x = self.task.x
        self.n = self.x.shape[0]
        if any(b.numel() for b in self.task.model.buffers()):
            raise ValueError(
                f"algorithm {cfg.algorithm!r}: the asynchronous simulation computes gradients of "
                "replicas that are not stepping (and ignores them); a model with buffers "
                "(BatchNorm) would have its statistics moved by them — use a model without"
            )
        self.clock = VirtualClock.from_config(cfg)
        optimizer = getattr(runner.algorithm, "optimizer", None)
        if not isinstance(optimizer, LocalSGD):
            raise TypeError(f"{type(runner.algorithm).__name__} has no LocalSGD optimizer")
        self.optimizer = optimizer
        self.queue = EventQueue()
        self.steps = [0] * self.n  # local steps each peer has completed
        self.running: set[int] = set()  # peers in the middle of a local step
        self.ready = [False] * self.n  # its current step's gradient is computed
        self.point = self.x.clone()  # the model each peer read when its step started
        self.grad = torch.zeros_like(self.x)
        self.loss = torch.zeros(self.n, dtype=torch.float64)
        self.correct = torch.zeros(self.n, dtype=torch.int64)
        self.norms = torch.zeros(self.n, dtype=torch.float64)
        # has a momentum buffer row
        self.stepped = torch.zeros(self.n, dtype=torch.bool, device=self.x.device)
        self._saved = torch.empty_like(self.x)
        self._out = torch.empty_like(self.x)
        self._idx = self.task.sampler.batch_indices(0).to(self.x.device).clone()
        self._matrices: dict[int, np.ndarray] = {}
        self.gradient_batches = 0  # batched forward/backward passes (the cost driver)
        # async.budget = "global": the run is n·T local steps in all, window t ends at the wave
        # that brings them to n·(t + 1), and the learning rate follows Σ k / n
        self.global_budget = cfg.asynchrony.global_budget
        self.budget = self.n * runner.total_steps
        self.total = 0  # local steps completed, all peers together
        self.now = 0
        self._window = _Window()
        self.start(0, list(range(self.n)))

    # -- shared machinery ----------------------------------------------------------------------

    def matrix(self, k: int) -> np.ndarray:
        """The mixing matrix of round k (a peer's local step k) of the run's topology."""
        hit = self._matrices.get(k)
        if hit is None:
            phase = self.runner.plan.phase_at(min(k, self.runner.total_steps - 1))
            hit = self._matrices[k] = self.checked(k, self.runner.schedules.get(phase).matrix(k))
            if len(self._matrices) > 1024:
                self._matrices = {k: hit}
        return hit

    def checked(self, k: int, W: np.ndarray) -> np.ndarray:
        """Round k's matrix ``W``, once when it is built (ValueError if the algorithm cannot
        use it)."""
        return W

    def start(self, now: int, peers: list[int]) -> None:
        """Peers ``peers`` start a local step at ``now``: they read their model."""
        if not peers:
            return
        rows = torch.tensor(peers, device=self.x.device)
        self.point.index_copy_(0, rows, self.x.index_select(0, rows))
        for i in peers:
            self.ready[i] = False
            self.running.add(i)
            self.queue.push(now + self.clock.compute[i], Kind.END, i)

    def _gradients(self) -> None:
        """The gradients of every running peer without one, in one batched pass: row i at its
        read point with its batch (its local step)."""
        pending = sorted(i for i in self.running if not self.ready[i])
        by_step: dict[int, list[int]] = {}
        for i in pending:
            by_step.setdefault(self.steps[i], []).append(i)
        for k in sorted(by_step):
            rows = torch.tensor(by_step[k], device=self.x.device)
            batch = self.task.sampler.batch_indices(k).to(self.x.device)
            self._idx.index_copy_(0, rows, batch.index_select(0, rows))
        self._saved.copy_(self.x)
        self.x.copy_(self.point)
        try:
            xb = self.task.x_train[self._idx]
            yb = self.task.y_train[self._idx]
            loss, grad, correct = loss_and_grad(
                self.task.model, self.task.flat, xb, yb, out=self._out
            )
        finally:
            self.x.copy_(self._saved)
        self.gradient_batches += 1
        norms = grad.norm(dim=1)
        clip = self.cfg.optim.clip_norm
        if clip is not None:  # per replica, like StepRunner
            grad.mul_((clip / (norms + 1e-6)).clamp_(max=1.0).unsqueeze(1))
        rows = torch.tensor(pending, device=self.x.device)
        self.grad.index_copy_(0, rows, grad.index_select(0, rows))
        for i in pending:
            self.loss[i] = float(loss[i])
            self.correct[i] = int(correct[i])
            self.norms[i] = float(norms[i])
            self.ready[i] = True

    def directions(self, peers: list[int]) -> torch.Tensor:
        """The local optimizer's directions of ``peers``' ending steps ([m, d]): weight decay at
        their read points, their momentum rows updated — `LocalSGD`'s arithmetic, row by row
        (torch.optim.SGD: a row's first buffer is its first gradient)."""
        rows = torch.tensor(peers, device=self.x.device)
        g = self.optimizer.effective_grad(self.point[rows], self.grad[rows])
        mu = self.optimizer.config.momentum
        if mu == 0:
            return g
        if self.optimizer.momentum is None:
            self.optimizer.momentum = torch.zeros_like(self.x)
        m = self.optimizer.momentum[rows].mul_(mu).add_(g)
        first = ~self.stepped[rows]
        if bool(first.any()):
            m = torch.where(first.unsqueeze(1), g, m)
            self.stepped[rows] = True
        self.optimizer.momentum.index_copy_(0, rows, m)
        if self.optimizer.config.nesterov:
            return g.add_(m, alpha=mu)
        return m.clone()

    def lrs(self, peers: list[int]) -> list[float]:
        """The learning rate of each peer's ending step: of its local step index, or with the
        global budget of the global progress ⌊Σ k / n⌋ before this instant's step ends (equal
        speeds: step t of the synchronous run)."""
        last = self.runner.total_steps - 1
        if self.global_budget:
            return [self.runner.schedule.lr(min(self.total // self.n, last))] * len(peers)
        return [self.runner.schedule.lr(min(self.steps[i], last)) for i in peers]

    @staticmethod
    def scaled_sub(target: torch.Tensor, d: torch.Tensor, lrs: list[float]) -> torch.Tensor:
        """target − lr_i · d_i row by row (one scalar when all agree: the synchronous bits)."""
        if len(set(lrs)) == 1:
            return target.sub_(d, alpha=lrs[0])
        col = torch.tensor(lrs, dtype=d.dtype, device=d.device).unsqueeze(1)
        return target.sub_(d * col)

    def mixed(self, staleness: int) -> None:
        """Account one mix of neighbour information ``staleness`` steps old."""
        self._window.staleness.append(max(0, staleness))

    def send(self, src: int, dst: int) -> None:
        """Account one d-vector message on link src → dst (raw float32, like gossip)."""
        nbytes = self.x.shape[1] * self.x.element_size()
        self.comm.counters.add_edges([(src, dst)], raw=nbytes, wire=nbytes)
        self._window.exchanges += 1

    # -- one engine step -----------------------------------------------------------------------

    def step(self, t: int) -> StepRecord:
        """Run every event of window t (virtual time (tΔ, (t + 1)Δ]); its record."""
        self._window = _Window()
        if self.global_budget:  # until the local steps add up to n·(t + 1)
            goal = min(self.n * (t + 1), self.budget)
            while self.total < goal:
                wave = self.queue.pop_wave(_NEVER)
                if wave is None:  # cannot happen: a peer that waits is owed a message in flight
                    raise RuntimeError(f"asynchronous simulation: no event left at step {t}")
                self.now, events = wave
                self._wave(events)
            until = self.now
        else:
            until = (t + 1) * self.clock.window
            while (wave := self.queue.pop_wave(until)) is not None:
                self.now, events = wave
                self._wave(events)
        if t == self.runner.total_steps - 1:
            self.drain(until)
        w = self._window
        phase = self.runner.plan.phase_at(t)
        done = len(w.losses)
        rounds = 1 if w.exchanges else 0
        self.runner.rounds_total += rounds
        return StepRecord(
            step=t,
            epoch=(t + 1) / self.task.steps_per_epoch,
            phase=phase.index,
            lr=self.runner.schedule.lr(t),
            loss=sum(w.losses) / done if done else None,
            train_acc=w.correct / w.samples if w.samples else None,
            rounds=rounds,
            theta=None,
            target=None,
            grad_norm=sum(w.grad_norms) / done if done else None,
            bytes_sent=self.comm.counters.bytes_wire,
            rounds_total=self.runner.rounds_total,
            virtual_time=until / TICKS_PER_SECOND,
            local_steps=done,
            staleness_mean=sum(w.staleness) / len(w.staleness) if w.staleness else None,
            staleness_max=max(w.staleness) if w.staleness else None,
            wait_s=w.wait / TICKS_PER_SECOND,
        )

    def drain(self, end: int) -> None:
        """Settle the run after its last window, which ends at ``end`` (module docstring):
        deliver every message in flight in time order (steps in progress are dropped), then
        `settle`."""
        while (wave := self.queue.pop_kind_wave(Kind.ARRIVE)) is not None:
            self.now, events = wave
            for e in events:
                self.arrive(e)
        self.settle(end)

    def settle(self, end: int) -> None:
        """What peers do with delivered information once nothing is in flight (nothing by
        default)."""

    def _wave(self, events: list[Event]) -> None:
        arrivals = [e for e in events if e.kind == Kind.ARRIVE]
        ends = sorted(e.peer for e in events if e.kind == Kind.END)
        if self.global_budget and self.total + len(ends) > self.budget:
            ends = ends[: self.budget - self.total]  # the rest are in progress at the end
        for e in arrivals:
            self.arrive(e)
        if ends:
            if any(not self.ready[i] for i in ends):
                self._gradients()
            w = self._window
            batch = self.task.batch_size
            for i in ends:
                w.losses.append(float(self.loss[i]))
                w.grad_norms.append(float(self.norms[i]))
                w.correct += int(self.correct[i])
                w.samples += batch
                self.running.discard(i)
            self.update(ends, self.directions(ends), self.lrs(ends))
            for i in ends:
                self.steps[i] += 1
            self.total += len(ends)
        self.start(self.now, self.communicate(ends))

    # -- the algorithm -------------------------------------------------------------------------

    def arrive(self, event: Event) -> None:
        raise NotImplementedError

    def update(self, peers: list[int], directions: torch.Tensor, lrs: list[float]) -> None:
        raise NotImplementedError

    def communicate(self, ended: list[int]) -> list[int]:
        """Communication of the peers whose step just ended (their ``steps`` already count it);
        returns the peers that start a new step now."""
        raise NotImplementedError


class ADPSGDSimulation(AsyncSimulation):
    """AD-PSGD (`concord.core.algorithms.ad_psgd`): x_i ← x_i − η d_i at step end, then an
    active peer averages with one passive neighbour — atomically when the link has no delay,
    else request (passive averages at arrival) and reply (the active peer absorbs the
    difference). Nobody ever waits."""

    def update(self, peers: list[int], directions: torch.Tensor, lrs: list[float]) -> None:
        rows = torch.tensor(peers, device=self.x.device)
        self.x.index_copy_(0, rows, self.scaled_sub(self.x[rows], directions, lrs))

    def checked(self, k: int, W: np.ndarray) -> np.ndarray:
        partner(W, 1, k)  # ValueError naming a same-parity pair (the config refuses it first)
        return W

    def communicate(self, ended: list[int]) -> list[int]:
        for i in ended:
            if not is_active(i):
                continue
            k = self.steps[i] - 1  # the local step that just ended
            j = round_partner(self.matrix(k), i, k)  # the matrix is `checked`
            if j is None:
                continue
            self.send(i, j)
            delay = self.clock.delay[i][j]
            if delay == 0 and self.clock.delay[j][i] == 0:  # one atomic averaging
                self.send(j, i)
                avg = pairwise_average(self.x[i], self.x[j])
                self.x[i] = avg
                self.x[j] = avg
                self.mixed(0)
                self.mixed(0)
            else:
                request = ("request", i, self.x[i].clone(), self.steps[i])
                self.queue.push(self.now + delay, Kind.ARRIVE, j, request)
        return ended

    def arrive(self, event: Event) -> None:
        what, sender, sent, *rest = event.payload
        j = event.peer
        if what == "request":  # passive j averages with the active sender's sent model
            (sender_steps,) = rest
            answer = self.x[j].clone()
            self.x[j] = pairwise_average(self.x[j], sent)
            self.mixed(self.steps[sender] - sender_steps)
            self.send(j, sender)
            reply = ("reply", j, sent, answer, self.steps[j])
            self.queue.push(self.now + self.clock.delay[j][sender], Kind.ARRIVE, sender, reply)
        else:  # the active peer j absorbs the passive sender's answer
            answer, sender_steps = rest
            absorb_reply(self.x[j], sent, answer)
            self.mixed(self.steps[sender] - sender_steps)


@dataclass
class _Message:
    src: int
    round: int  # the sender's local step (the schedule round of P)
    share: torch.Tensor  # p_ji x_i
    weight: float  # p_ji w_i


class AsyncSGPSimulation(AsyncSimulation):
    """Asynchronous SGP (`concord.core.algorithms.async_sgp`): at step end the numerator is
    formed and split by column i of P^k (kept part and messages); the peer then mixes every
    delivered message of a round ≤ k (later rounds are held until its step of their round
    ends, `mixable`), unless a message of a round ≤ k − τ has not arrived, in which case it
    waits for it. The engine tensor holds the de-biased models z; the push-sum weights live in
    the algorithm object (`SGP.weights`)."""

    def __init__(self, cfg: RunConfig, runner: StepRunner, comm: VectorizedComm) -> None:
        weights = getattr(runner.algorithm, "weights", None)
        if not isinstance(weights, np.ndarray):
            raise TypeError(f"{type(runner.algorithm).__name__} has no push-sum weights")
        self.weights: np.ndarray = weights
        self.tau = cfg.asynchrony.max_staleness
        self.min_weight = cfg.asynchrony.min_weight
        n = runner.task.x.shape[0]
        self.kept = torch.zeros_like(runner.task.x)  # numerators kept at the last step end
        self.kept_w = np.zeros(n, dtype=np.float64)
        self.inbox: list[list[_Message]] = [[] for _ in range(n)]
        self.arrived: dict[tuple[int, int], int] = {}  # (peer, round) → messages delivered
        self.complete = [0] * n  # every round < this has been delivered to the peer
        self.waiting: dict[int, int] = {}  # peer → when its compute ended
        super().__init__(cfg, runner, comm)

    def weight_total(self) -> float:
        """Σ_i w_i plus the weight in messages not yet mixed: n at every instant (push-sum's
        conservation, to float64 rounding)."""
        inboxes = sum(m.weight for box in self.inbox for m in box)
        transit = sum(float(m.weight) for m in self.queue.payloads(Kind.ARRIVE))
        return float(self.weights.sum()) + inboxes + transit

    def quiescent(self) -> bool:
        """No message is in flight or unmixed."""
        return not any(self.inbox) and self.queue.pending(Kind.ARRIVE) == 0

    def update(self, peers: list[int], directions: torch.Tensor, lrs: list[float]) -> None:
        rows = torch.tensor(peers, device=self.x.device)
        w = torch.from_numpy(self.weights[peers]).to(device=self.x.device, dtype=self.x.dtype)
        w = w.unsqueeze(1)
        numerators = self.scaled_sub(self.x[rows] * w, directions, lrs)
        by_round: dict[int, list[int]] = {}
        for pos, i in enumerate(peers):
            by_round.setdefault(self.steps[i], []).append(pos)
        for k, positions in sorted(by_round.items()):
            senders = [peers[p] for p in positions]
            before = self.weights[senders].copy()
            kept, kept_w, messages = push_split(
                numerators[positions], before, self.matrix(k), senders, self.min_weight
            )
            self.kept.index_copy_(0, rows[positions], kept)
            self.kept_w[senders] = kept_w
            self.weights[senders] = kept_w  # the rest travels until it is mixed
            for row, j, p in messages:
                i = senders[row]
                msg = _Message(i, k, numerators[positions[row]] * p, float(p * before[row]))
                if p:  # p = 0: an empty share below async.min_weight (no model on the wire)
                    self.send(i, j)
                delay = self.clock.delay[i][j]
                if delay == 0:
                    self.deliver(j, msg)
                else:
                    self.queue.push(self.now + delay, Kind.ARRIVE, j, msg)

    def deliver(self, j: int, msg: _Message) -> None:
        self.inbox[j].append(msg)
        key = (j, msg.round)
        self.arrived[key] = self.arrived.get(key, 0) + 1

    def arrive(self, event: Event) -> None:
        self.deliver(event.peer, event.payload)

    def _expected(self, j: int, m: int) -> int:
        P = self.matrix(m)
        return int(np.count_nonzero(P[j])) - int(P[j, j] != 0)

    def _ready(self, j: int) -> bool:
        """Every message to j of the rounds that must be mixed now has arrived."""
        due = due_rounds(self.steps[j] - 1, self.tau)
        while self.complete[j] <= due:
            m = self.complete[j]
            if self.arrived.get((j, m), 0) < self._expected(j, m):
                return False
            self.arrived.pop((j, m), None)
            self.complete[j] += 1
        return True

    def communicate(self, ended: list[int]) -> list[int]:
        for i in ended:
            self.waiting[i] = self.now
        mixing = [j for j in sorted(self.waiting) if self._ready(j)]
        for j in mixing:
            self._window.wait += self.now - self.waiting.pop(j)
            self._mix(j, self.kept[j], float(self.kept_w[j]))
        return mixing

    def _mix(self, j: int, numerator: torch.Tensor, weight: float, final: bool = False) -> None:
        """Peer j mixes its inbox into ``numerator`` and ``weight``: z_j = x_j / w_j. Messages
        of rounds after its step k are held for its step of their round (`mixable`), unless
        ``final`` (the run settles)."""
        k = self.steps[j] - 1
        box = [m for m in self.inbox[j] if mixable(m.round, k, final)]
        self.inbox[j] = [m for m in self.inbox[j] if not mixable(m.round, k, final)]
        for m in box:
            self.mixed(k - m.round)
        shares = [m.share for m in box]
        x, w = absorb(numerator, weight, shares, [m.weight for m in box])
        self.weights[j] = w
        self.x[j] = x / torch.tensor(w, dtype=self.x.dtype)

    def settle(self, end: int) -> None:
        """Waiting peers stop waiting (counted up to ``end``) and mix their kept numerator;
        the others mix their inbox into w_j z_j (module docstring)."""
        for j in sorted(self.waiting):
            self._window.wait += end - self.waiting.pop(j)
            self._mix(j, self.kept[j], float(self.kept_w[j]), final=True)
        for j in range(self.n):
            if self.inbox[j]:
                w = float(self.weights[j])
                self._mix(j, self.x[j] * torch.tensor(w, dtype=self.x.dtype), w, final=True)


def make_simulation(cfg: RunConfig, runner: StepRunner, comm: VectorizedComm) -> AsyncSimulation:
    """The simulation of ``cfg.algorithm`` (an asynchronous algorithm of the catalog)."""
    if cfg.algorithm == "ad-psgd":
        return ADPSGDSimulation(cfg, runner, comm)
    if cfg.algorithm == "async-sgp":
        return AsyncSGPSimulation(cfg, runner, comm)
    raise ValueError(f"algorithm {cfg.algorithm!r} has no asynchronous simulation")
