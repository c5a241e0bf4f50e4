"""The asynchronous algorithms in peer processes: ``ad-psgd`` and ``async-sgp`` for real
(docs/algorithms.md#ad-psgd, #asynchronous-sgp; the wire: `concord.peer.async_wire`).

The training thread runs local steps back to back and never waits for a round: there are no
rounds, no barrier and no deadline on its path (`AsyncStepRunner.run_step`). The peer's event
loop answers and files the neighbours' messages at any time (`AsyncInbox`, one per process); what
they ask of the model is queued and applied by the training thread at its next step boundary, in
arrival order. The update rules are the plain functions of `concord.core.algorithms.ad_psgd` and
`concord.core.algorithms.async_sgp`, the ones the vectorized engine's simulation applies
(`concord.sim.asynchronous`).

AD-PSGD (`ADPSGDPeer`), in delta form. When a local step ends the peer applies its update
(x ← x − η d), then every averaging delta queued since the last boundary, and publishes a copy of
its model (the *snapshot*). An active (odd) peer i then sends its snapshot x_i^s to its partner j
of that step (`partner`) as a REQUEST — at most one outstanding: while one is in flight further
steps do not send (counted, ``async_busy``). j's event loop answers at once with its model as
it stands — its snapshot x_j^s with the averagings it answered since, the simulator's order when
two requests arrive between two boundaries — and queues (x_i^s, x_j^s); it then counts itself
averaged. i, on the reply, queues (x_j^s, x_i^s). Each side
applies its pair with `absorb_reply` (x ← x + ½ (theirs − ours)): the two changes are exact
negatives (a − b = −(b − a) in floats, halving is exact), so Σ x is unchanged whatever local
steps run meanwhile — up to the rounding of the two additions. A partner that does not answer
within ``network.deadline`` seconds (dead, unreachable) only means no averaging for that step
(``async_lost``); a passive peer whose training has ended answers CLOSED and queues nothing.

async-sgp (`AsyncSGPPeer`). When step k ends: numerator x = w z − η d, split by column i of P^k
(`push_split`): the kept part stays, each out-neighbour j gets (p_ji x, p_ji w) as a SHARE
tagged k, sent by the event loop (the training thread does not wait for the ack). Then it waits
only if a share of a round ≤ k − τ (`due_rounds`; round 0 at the end of step 0: a start-up
barrier) from an in-neighbour has not arrived, at most ``network.deadline`` seconds
(``network.startup_timeout`` at step 0: the neighbours may still be starting); an in-neighbour
that misses it becomes *suspect* (not waited for until one of its shares arrives again;
``async_lost``). It mixes (`absorb`) every share that has arrived of a round ≤ k; a share of a
later round m (a neighbour ahead of it) is held until its own step m ends (`mixable`), except at
its last step, which mixes every share it holds. Push-sum mass: a share the sender could not
deliver (no ack within the deadline) is mixed back into the sender itself, as if p_ii had been
larger, so Σ w = n still holds at quiescence (a share delivered but unacknowledged in time would
be counted twice: the deadline is long); a share lost with a dying peer is lost mass (Σ w < n
afterwards — the de-biased z = x / w are still averages, of fewer contributions). The last step
waits for the acknowledgements of its own shares and for every share of rounds ≤ its own (τ = 0),
then refuses shares (CLOSED: the sender mixes them back): a run whose peers all finish ends
quiescent. An in-neighbour back from suspicion is waited for again from the first round it
sends after its return. A peer keeps the share of a neighbour that is suspect or that its last
share did not reach (``async_held``: p_ii += p_ji, the column still sums to 1) and sends it an
*empty* share (no values, weight 0) that only completes its round: mass sent to a neighbour that
sends none back would drain the sender's weight, and z = x / w divides its gradient steps by
that weight. For the same reason a peer whose weight is below ``async.min_weight`` keeps all its
shares at that step (`push_split` gives them p = 0; empty shares go out, counted ``async_held``):
a peer L steps ahead of its in-neighbours would otherwise hold w ≈ 2^−L.

Budget (``async.budget``, docs/algorithms.md#the-global-budget). Per-peer: T local steps each.
Global (the default): every message carries the sender's progress vector (`AsyncPeer.progress`,
merged by element-wise max); the learning rate follows ⌊g⌋, g = Σ k / n, the record's epoch and
the evaluations (`GlobalBudget`, `concord.runtime.driver.Budget`) follow g, and the peer stops
after the step at which g ≥ T (`AsyncPeer.decide_final`). Before its first step a peer waits
for every peer it can reach to reach theirs (`AsyncPeer.await_neighbours`); AD-PSGD peers
gossip their vectors in body-less PROGRESS messages (`ADPSGDPeer.gossip_progress`). async-sgp's
last shares are flagged LAST so receivers stop expecting later rounds, and its last step waits
only for the answers to its own shares.

Records: every step reports ``local_steps = 1``, ``virtual_time`` (wall-clock seconds since this
stage's first step: a real peer has no virtual clock), ``staleness_mean`` / ``staleness_max`` of
what it mixed and ``wait_s`` (seconds blocked on due shares; AD-PSGD: only the last step's wait
for its outstanding reply). Staleness: async-sgp, k − m for a share of round m mixed at the end of
step k (the simulator's); AD-PSGD, the step boundaries between the snapshot a delta was computed
against and the boundary that applies it, exclusive (0: applied at the next boundary — what a
round trip shorter than one step gives, and the simulator then records 0 too).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np
import structlog
import torch

from concord.core.algorithms import StepReport
from concord.core.algorithms.ad_psgd import absorb_reply, is_active, partner
from concord.core.algorithms.async_sgp import absorb, due_rounds, mixable, push_split
from concord.core.loop import DivergedError, StepRunner
from concord.core.records import JSON, StepRecord
from concord.peer.async_barrier import StartupBarrier
from concord.peer.async_wire import (
    ACK,
    CLOSED,
    PROGRESS,
    REPLY,
    REQUEST,
    SHARE,
    AsyncServicer,
    Channels,
    Message,
    WireView,
    merge_progress,
    push,
)
from concord.peer.mailbox import Counters
from concord.peer.transport import Transport

log = structlog.get_logger(__name__)
EARLY_LIMIT = 256  # shares filed before this process's stage attached its peer


class AsyncInbox:
    """The event loop's side for the whole process: the ``Push`` handler, routed to the stage's
    `AsyncPeer` once attached; shares arriving before that (a faster neighbour) are kept."""

    def __init__(self, transport: Transport, dim: int, key: bytes) -> None:
        o = transport.options
        self.view = WireView(
            peer_id=o.peer_id,
            world_size=o.world_size,
            dim=dim,
            key=key,
            chunk_bytes=o.chunk_bytes,
            max_abs_value=o.max_abs_value,
        )
        self.counters: Counters = transport.counters
        self.servicer = AsyncServicer(
            self.view,
            self.counters,
            self.handle,
            require_identity=transport.require_identity,
            revoked=transport.revocations,
        )
        self.peer: AsyncPeer | None = None
        self.early: list[Message] = []
        self.channels = Channels(o.channel_credentials)  # ours to the neighbours

    async def handle(self, msg: Message) -> Message:
        me = self.view.peer_id
        if self.peer is None:
            if msg.kind == SHARE and len(self.early) < EARLY_LIMIT:
                self.early.append(msg)
                return Message(ACK, me, msg.step)
            return Message(CLOSED, me, 0)
        return self.peer.on_message(msg)

    def attach(self, peer: AsyncPeer) -> None:
        """The stage's peer takes the messages from now on (and those kept so far)."""
        self.peer = peer
        early, self.early = self.early, []
        for msg in early:
            peer.on_message(msg)


@dataclass
class _StepNotes:
    staleness: list[int] = field(default_factory=list)
    wait_s: float = 0.0
    lost: int = 0
    busy: int = 0
    refused: int = 0
    returned: int = 0
    held: int = 0
    weight: float | None = None  # async-sgp: the push-sum weight the step's update was formed with

    def extra(self) -> dict[str, JSON]:
        out: dict[str, JSON] = {}
        for key in ("lost", "busy", "refused", "returned", "held"):
            value = getattr(self, key)
            if value:
                out[f"async_{key}"] = value
        if self.weight is not None:
            out["async_weight"] = self.weight
        return out


class AsyncPeer(StartupBarrier):
    """What both algorithms share: the shared state between the training thread and the event
    loop (under one lock), sending on the loop, the per-step notes; the start-up barrier and
    the contact graph (`StartupBarrier`)."""

    def __init__(self, runner: StepRunner, transport: Transport, loop: asyncio.AbstractEventLoop):
        self.runner = runner
        self.transport = transport
        self.loop = loop
        self.rank = transport.peer_id
        self.n = runner.cfg.peers
        self.deadline = runner.cfg.network.deadline
        self.wire: WireView | None = None  # set by `attach`
        self.channels: Channels | None = None
        self.cond = threading.Condition()
        self.notes: _StepNotes = _StepNotes()
        self.closed = False  # training ended: no more averaging (loop side)
        self.started: float | None = None
        # async.budget = "global": the progress vector (the latest local step count known of
        # every peer, merged from every message), and the step that spent the budget
        self.global_budget = runner.cfg.asynchrony.global_budget
        self.progress = [0] * self.n
        self.last_step: int | None = None
        self.eval_block = 0  # ⌊g / eval interval⌋ at the last evaluation
        self.recorded = 0.0  # g in the last step record (its epoch)
        self.ready = False  # at or past the start-up barrier (`await_neighbours`)
        # the barrier's levels (`await_neighbours`): the highest each peer told (in a PROGRESS
        # or in its ack of ours), −1 while not known to be at its barrier; this peer's own
        # entry is its own level
        self.levels = [-1] * self.n
        self.barrier_neighbours: set[int] | None = None  # `neighbours`, once at the barrier

    def progress_now(self) -> tuple[int, ...]:
        """The progress vector to send (any thread)."""
        with self.cond:
            return tuple(self.progress)

    def heard(self, msg: Message | None) -> None:
        """Merge the progress vector of a message or answer (call under the lock). Only this
        peer counts its own steps: a larger entry for it (a restart from an older checkpoint,
        or a dishonest sender) is not taken. A vector with an entry above n·T is dropped (the
        wire refuses those once `attach` has set its bound; this covers messages filed
        before)."""
        if msg is None or len(msg.progress) != self.n:
            return
        if max(msg.progress) > self.n * self.runner.total_steps:
            log.warning("async.progress_refused", sender=msg.sender, progress=list(msg.progress))
            return
        own = self.progress[self.rank]
        merge_progress(self.progress, msg.progress)
        self.progress[self.rank] = own

    def global_progress(self) -> float:
        """g = Σ_j k_j / n: this peer's estimate of the global progress, in steps (a lower
        bound: every entry is a step count some peer had reached)."""
        with self.cond:
            return sum(self.progress) / self.n

    def begin_step(self, step: int) -> None:
        """Training thread, before local step ``step``: this peer has done ``step`` steps."""
        with self.cond:
            self.progress[self.rank] = max(self.progress[self.rank], step)

    def ended_answer(self, answer: Message) -> bool:
        """Does ``answer`` (a CLOSED) come from a peer whose training has ended? CLOSED also
        means "not training yet" (a late starter, `AsyncInbox.handle`): only a global budget
        spent in the answer's own progress vector (Σ ≥ n·T: its sender stopped, or stops after
        its next step) says it ended; a peer that has not started sends zeros."""
        return self.global_budget and sum(answer.progress) >= self.n * self.runner.total_steps

    def progress_message(self, msg: Message) -> Message:
        """The answer to a PROGRESS message (event loop)."""
        with self.cond:
            self.heard(msg)
            self.told_level(msg.sender, msg.step)
            if self.barrier_neighbours is not None:  # past it too: a level left low by a
                self.barrier_level(self.barrier_neighbours)  # timeout still rises
            progress = tuple(self.progress)
            if self.ready and not self.closed:
                return Message(ACK, self.rank, self.levels[self.rank], progress=progress)
            return Message(CLOSED, self.rank, 0, progress=progress)

    def decide_final(self, step: int) -> bool:
        """Is local step ``step`` (just computed) this peer's last? Per-peer budget: step T − 1;
        global: the first step after which g ≥ T (its own step counted)."""
        with self.cond:  # the messages of this step carry step + 1 as this peer's entry
            self.progress[self.rank] = max(self.progress[self.rank], step + 1)
            if not self.global_budget:
                return step == self.runner.total_steps - 1
            final = sum(self.progress) >= self.n * self.runner.total_steps
        if final:
            self.last_step = step
        return final

    def attach(self, inbox: AsyncInbox) -> None:
        """Take ``inbox``'s messages (on the event loop); from now on the wire refuses a
        progress entry above n·T (`WireView.max_step`), in messages and answers alike."""
        inbox.view = replace(inbox.view, max_step=self.n * self.runner.total_steps)
        inbox.servicer.view = inbox.view
        self.wire = inbox.view
        self.channels = inbox.channels
        inbox.attach(self)

    def matrix(self, k: int) -> np.ndarray:
        r = self.runner
        phase = r.plan.phase_at(min(k, r.total_steps - 1))
        return r.schedules.get(phase).matrix(k)

    def send(self, j: int, msg: Message) -> concurrent.futures.Future[Message | None]:
        """Send ``msg`` to ``j`` from the event loop (training thread: returns at once)."""
        return asyncio.run_coroutine_threadsafe(self._send(j, msg), self.loop)

    async def _send(self, j: int, msg: Message) -> Message | None:
        """``msg`` to ``j`` and its answer; None when there is none (logged: never raises, a
        neighbour's failure is data)."""
        link = self.transport.links.get(j)  # where j is (the data plane keeps it current)
        if link is None or self.wire is None or self.channels is None:
            return None
        try:
            return await push(self.channels, j, link.address, msg, self.wire, self.deadline)
        except Exception as exc:  # whatever the link did, the message is lost
            log.warning("async.send_failed", neighbour=j, kind=msg.kind, error=repr(exc))
            return None

    def sent(self, j: int) -> None:
        """Account one model-sized float32 message to ``j`` (training thread)."""
        nbytes = int(self.runner.task.x.shape[1]) * 4
        self.runner.comm.counters.add_edges([(self.rank, j)], raw=nbytes, wire=nbytes)

    def on_message(self, msg: Message) -> Message:
        """A neighbour's message, on the event loop: file it and answer (never blocks)."""
        raise NotImplementedError

    def end_step(self, step: int, x: torch.Tensor, d: torch.Tensor, lr: float) -> int:
        """Training thread, when local step ``step`` ends: the update and the communication;
        returns the messages sent (the step's "rounds": 1 if any)."""
        raise NotImplementedError

    def take_notes(self) -> _StepNotes:
        """This step's notes (the event loop adds to them under the lock); starts the next."""
        with self.cond:
            notes, self.notes = self.notes, _StepNotes()
        return notes


class ADPSGDPeer(AsyncPeer):
    """AD-PSGD in delta form (module docstring)."""

    def __init__(self, runner: StepRunner, transport: Transport, loop: asyncio.AbstractEventLoop):
        super().__init__(runner, transport, loop)
        self.active = is_active(self.rank)
        # the model at the last step boundary (its snapshot) with, on a passive peer, the
        # averagings answered since: what the next request is answered with (loop side)
        self.view: torch.Tensor = runner.task.x[0].detach().clone()
        self.steps = 0  # local steps completed at the last boundary
        # (ours, theirs, our steps when ours was taken, who): x += ½ (theirs − ours) at a
        # boundary; who: the requester we answered (bytes of our reply), None for a reply
        self.deltas: list[tuple[torch.Tensor, torch.Tensor, int, int | None]] = []
        self.outstanding: concurrent.futures.Future[None] | None = None
        # the global budget's progress gossip: one PROGRESS message at a time, to the
        # neighbours in turn (a request may be in flight for many steps, a passive peer sends
        # none: the progress vectors would otherwise travel only with the averagings)
        self.gossip: concurrent.futures.Future[None] | None = None
        self.turn = 0
        self.around: list[int] = []

    def gossip_progress(self) -> None:
        """Training thread, at a step boundary (global budget): push the progress vector to
        the next neighbour unless the last push is still in flight; its answer brings back
        the neighbour's vector."""
        if self.gossip is not None and not self.gossip.done():
            return
        if not self.around:
            self.around = sorted(self.neighbours())
            if not self.around:
                return
        j = self.around[self.turn % len(self.around)]
        self.turn += 1

        async def push_progress() -> None:
            with self.cond:
                level = self.levels[self.rank]
            answer = await self._send(
                j, Message(PROGRESS, self.rank, level, progress=self.progress_now())
            )
            with self.cond:
                self.heard(answer)
                if answer is not None and answer.kind == ACK:
                    self.told_level(j, answer.step)

        self.gossip = asyncio.run_coroutine_threadsafe(push_progress(), self.loop)

    def on_message(self, msg: Message) -> Message:
        if msg.kind == PROGRESS:
            return self.progress_message(msg)
        with self.cond:
            self.heard(msg)
            progress = tuple(self.progress)
            if msg.kind != REQUEST or msg.values is None or self.active or self.closed:
                return Message(CLOSED, self.rank, self.steps, progress=progress)
            # answer with the model as it stands, then average it (the simulator's order:
            # several requests between two boundaries chain)
            ours, steps = self.view, self.steps
            self.view = absorb_reply(ours.clone(), ours, msg.values)
            self.deltas.append((ours, msg.values, steps, msg.sender))
        return Message(REPLY, self.rank, steps, values=ours, progress=progress)

    async def _request(self, j: int, ours: torch.Tensor, steps: int) -> None:
        request = Message(REQUEST, self.rank, steps, values=ours, progress=self.progress_now())
        reply = await self._send(j, request)
        with self.cond:
            self.heard(reply)
            if reply is None:
                self.notes.lost += 1
            elif reply.kind != REPLY or reply.values is None:
                self.notes.refused += 1
            else:
                self.deltas.append((ours, reply.values, steps, None))

    def wait_outstanding(self) -> None:
        """Block until the request in flight is answered or given up (its averaging is then
        queued, or counted lost)."""
        if self.outstanding is None:
            return
        t0 = time.perf_counter()
        try:
            self.outstanding.result(timeout=self.deadline + 5)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            self.notes.lost += 1
        self.notes.wait_s += time.perf_counter() - t0

    def end_step(self, step: int, x: torch.Tensor, d: torch.Tensor, lr: float) -> int:
        x.sub_(d, alpha=lr)
        final = self.decide_final(step)
        if final:  # the last reply: its averaging completes
            self.wait_outstanding()
        with self.cond:  # one atomic boundary: no request is answered half-way through it
            if final and not self.active:
                self.closed = True  # later requests are refused: nothing left unapplied
            self.steps = step + 1
            for ours, theirs, steps, requester in self.deltas:
                absorb_reply(x[0], ours, theirs)
                self.notes.staleness.append(self.steps - 1 - steps)
                if requester is not None:
                    self.sent(requester)
            self.deltas = []
            snapshot = self.view = x[0].detach().clone()
        if self.global_budget and not final:
            self.gossip_progress()
        if not self.active or final:
            return 0
        j = partner(self.matrix(step), self.rank, step)
        if j is None:
            return 0
        if self.outstanding is not None and not self.outstanding.done():
            self.notes.busy += 1
            return 0
        self.outstanding = asyncio.run_coroutine_threadsafe(
            self._request(j, snapshot, self.steps), self.loop
        )
        self.sent(j)
        return 1


class AsyncSGPPeer(AsyncPeer):
    """Asynchronous SGP (module docstring); w lives in the algorithm (`SGP.weights`), so
    checkpoints hold it."""

    def __init__(self, runner: StepRunner, transport: Transport, loop: asyncio.AbstractEventLoop):
        super().__init__(runner, transport, loop)
        weights = getattr(runner.algorithm, "weights", None)
        if not isinstance(weights, np.ndarray):
            raise TypeError(f"{type(runner.algorithm).__name__} has no push-sum weights")
        self.tau = runner.cfg.asynchrony.max_staleness
        self.inbox: list[Message] = []  # filed, not yet mixed
        self.arrived: dict[int, set[int]] = {}  # round → senders whose share is here
        self.suspect: set[int] = set()  # in-neighbours not waited for
        # an in-neighbour back from suspicion → its first round since: earlier rounds of it are
        # not waited for (it was gone, or restarted at another step)
        self.back_from: dict[int, int] = {}
        self.unreachable: set[int] = set()  # out-neighbours our last share did not reach
        self.complete: int | None = None  # every round < this has been mixed or given up
        self.ended: dict[int, int] = {}  # in-/out-neighbour → its last round (a LAST share)
        self.inflight: set[concurrent.futures.Future[None]] = set()  # our shares unanswered

    def weights(self) -> np.ndarray:
        w = getattr(self.runner.algorithm, "weights", None)
        assert isinstance(w, np.ndarray)
        return w

    def on_message(self, msg: Message) -> Message:
        if msg.kind == PROGRESS:
            return self.progress_message(msg)
        with self.cond:
            self.heard(msg)
            progress = tuple(self.progress)
            if msg.kind != SHARE or self.closed:  # its mass goes back to the sender
                return Message(CLOSED, self.rank, msg.step, progress=progress)
            if msg.values is not None:  # an empty share only completes its round
                self.inbox.append(msg)
            self.arrived.setdefault(msg.step, set()).add(msg.sender)
            if msg.last:  # it sends no round after this one
                self.ended[msg.sender] = msg.step
            if msg.sender in self.suspect:
                self.suspect.discard(msg.sender)
                self.back_from[msg.sender] = msg.step
            self.cond.notify_all()
        return Message(ACK, self.rank, msg.step, progress=progress)

    def _senders(self, m: int) -> set[int]:
        P = self.matrix(m)
        return {int(j) for j in np.nonzero(P[self.rank])[0] if j != self.rank}

    def _missing(self, due: int) -> dict[int, set[int]]:
        """Rounds ≤ ``due`` (from `complete`) whose shares from non-suspect in-neighbours are not
        all here (call under the lock); advances `complete` past the whole ones."""
        assert self.complete is not None
        out: dict[int, set[int]] = {}
        m = self.complete
        while m <= due:
            senders = {
                j
                for j in self._senders(m)
                if m >= self.back_from.get(j, m) and m <= self.ended.get(j, m)
            }
            gone = senders - self.arrived.get(m, set()) - self.suspect
            if gone:
                out[m] = gone
            elif not out:
                self.arrived.pop(m, None)
                self.complete = m + 1
            m += 1
        return out

    def _returned(self, share: Message) -> None:
        with self.cond:
            self.inbox.append(share)
            self.notes.returned += 1
            self.cond.notify_all()

    async def _share(self, j: int, share: Message) -> None:
        answer = await self._send(j, share)
        delivered = answer is not None and answer.kind == ACK
        with self.cond:
            self.heard(answer)
            if answer is not None and answer.kind == CLOSED and self.ended_answer(answer):
                self.ended.setdefault(j, share.step)  # its training has ended: keep its share
            if delivered:
                self.unreachable.discard(j)
            else:
                self.unreachable.add(j)
        if share.values is not None and not delivered:  # the mass comes back
            self._returned(Message(SHARE, self.rank, share.step, share.weight, share.values))

    def _push_share(self, j: int, share: Message) -> concurrent.futures.Future[None]:
        future = asyncio.run_coroutine_threadsafe(self._share(j, share), self.loop)
        self.inflight.add(future)
        future.add_done_callback(self.inflight.discard)
        return future

    def out_neighbours(self) -> set[int]:
        """The peers this one sends shares to in some round (`contacts`)."""
        return self.contacts()[1]

    def end_step(self, step: int, x: torch.Tensor, d: torch.Tensor, lr: float) -> int:
        w = self.weights()
        if self.complete is None:
            self.complete = step  # this stage's first step (a restarted peer's too)
        numerators = x * torch.tensor(float(w[0]), dtype=x.dtype, device=x.device)
        numerators.sub_(d, alpha=lr)
        kept, kept_w, messages = push_split(
            numerators, w, self.matrix(step), [self.rank], self.runner.cfg.asynchrony.min_weight
        )
        final = self.decide_final(step)
        with self.cond:
            self.notes.weight = float(w[0])
            away = self.suspect | self.unreachable
            ended = set(self.ended)
            progress = tuple(self.progress)
        sending = []
        last = final and self.global_budget  # the receivers stop expecting later rounds
        for _, j, p in messages:
            if j in ended and p:  # it trains no more: keep its share, send nothing
                kept[0].add_(numerators[0], alpha=p)
                kept_w[0] += p * w[0]
                continue
            if j in ended:
                continue
            if p == 0:  # below async.min_weight: push_split kept it all; the round completes
                share = Message(SHARE, self.rank, step, progress=progress, last=last)
                self.notes.held += 1
            elif j in away:  # keep its share (p_ii += p_ji); an empty share completes its round
                kept[0].add_(numerators[0], alpha=p)
                kept_w[0] += p * w[0]
                share = Message(SHARE, self.rank, step, progress=progress, last=last)
                self.notes.held += 1
            else:
                values = (numerators[0] * p).cpu()
                share = Message(SHARE, self.rank, step, float(p * w[0]), values, progress, last)
                self.sent(j)
            sending.append(self._push_share(j, share))
        if last:  # every out-neighbour of later rounds may wait for this peer: tell it too
            told = {j for _, j, _ in messages} | ended
            for j in sorted(self.out_neighbours() - told):
                share = Message(SHARE, self.rank, step, progress=progress, last=True)
                sending.append(self._push_share(j, share))
        # per-peer budget: every peer's last round is T − 1, so the last step drains every
        # round up to its own (τ = 0). Global: the last rounds differ, and a neighbour that has
        # sent its LAST share sends no more, so the last step waits for nothing — it mixes what
        # has arrived and refuses what comes later (those shares go back to their senders)
        if final:
            due = -1 if self.global_budget else step
        else:
            due = due_rounds(step, self.tau)
        # step 0 waits for the in-neighbours' first shares as long as the start-up barrier would
        # (they may still be connecting); later steps at most one deadline
        limit = self.runner.cfg.network.startup_timeout if step == 0 else self.deadline
        t0 = time.perf_counter()
        if final:  # a share that comes back undelivered is mixed now, not after the end
            for future in [*sending, *list(self.inflight)]:
                with contextlib.suppress(concurrent.futures.TimeoutError):
                    future.result(timeout=self.deadline + 5)
        with self.cond:
            while missing := self._missing(due):
                if self.global_budget and sum(self.progress) >= self.n * self.runner.total_steps:
                    break  # the budget is spent: mix what is here, the next step is the last
                left = limit - (time.perf_counter() - t0)
                if left <= 0 or not self.cond.wait(timeout=left):
                    gone = sorted({j for senders in missing.values() for j in senders})
                    self.suspect.update(gone)
                    self.notes.lost += len(gone)
                    log.warning("async.lost", step=step, neighbours=gone, rounds=sorted(missing))
            box = [m for m in self.inbox if mixable(m.step, step, final)]
            self.inbox = [m for m in self.inbox if not mixable(m.step, step, final)]
            self.closed = final  # from now on shares are refused (their senders keep them)
        self.notes.wait_s += time.perf_counter() - t0
        for msg in box:
            self.notes.staleness.append(max(0, step - msg.step))
        shares = [m.values.to(x.device) for m in box if m.values is not None]
        num, weight = absorb(kept[0], float(kept_w[0]), shares, [m.weight for m in box])
        w[0] = weight
        x[0].copy_(num / torch.tensor(weight, dtype=num.dtype, device=num.device))
        return len(messages)


class AsyncStepRunner(StepRunner):
    """`StepRunner` for the asynchronous algorithms in a peer: ``run_step`` is one local step
    and the peer's asynchronous communication (`AsyncPeer`); ``attach`` before the first step."""

    peer: AsyncPeer | None = None

    def attach(
        self, transport: Transport, inbox: AsyncInbox, loop: asyncio.AbstractEventLoop
    ) -> None:
        """Build this stage's `AsyncPeer` and route the inbox to it (on the event loop)."""
        kind = ADPSGDPeer if self.cfg.algorithm == "ad-psgd" else AsyncSGPPeer
        self.peer = kind(self, transport, loop)
        self.peer.attach(inbox)

    def run_step(self, step: int) -> tuple[StepRecord, StepReport]:
        peer = self.peer
        if peer is None:
            raise RuntimeError("AsyncStepRunner.attach was not called")
        if peer.started is None:
            if peer.global_budget:  # the start-up barrier (`AsyncPeer.await_neighbours`)
                peer.await_neighbours(self.cfg.network.startup_timeout)
            peer.started = time.perf_counter()
        task, x = self.task, self.task.x
        self.comm.begin_step(step)
        peer.begin_step(step)
        out = task.loss_and_grad(step, x)  # batch `step`: the peer's own shard, cycled
        # the schedule's step: this local step, or with the global budget ⌊g⌋ (g = Σ k / n,
        # this peer's estimate as its step ends — with what arrived during the step — before
        # its own count is added: the simulation's ⌊Σ k / n⌋ at the step's end instant)
        at = step
        if peer.global_budget:
            at = min(math.floor(peer.global_progress()), self.total_steps - 1)
        lr = self.schedule.lr(at)
        phase = self.plan.phase_at(at)
        grad_norms = out.grad.norm(dim=1)
        if self.clip_norm is not None:
            out.grad.mul_((self.clip_norm / (grad_norms + 1e-6)).clamp_(max=1.0).unsqueeze(1))
        loss = float(out.loss.mean())
        if not math.isfinite(loss):
            raise DivergedError(step, phase.index, lr, out.loss, None, task.ranks)
        optimizer = getattr(self.algorithm, "optimizer", None)
        if optimizer is None:
            raise TypeError(f"{type(self.algorithm).__name__} has no local optimizer")
        d = optimizer.direction(x, out.grad)
        sent = peer.end_step(step, x, d, lr)
        rounds = 1 if sent else 0
        self.rounds_total += rounds
        notes = peer.take_notes()
        done = peer.global_progress() if peer.global_budget else step + 1
        peer.recorded = done
        extra = notes.extra()
        if peer.global_budget:
            extra["global_progress"] = done
            if peer.last_step == step:
                extra["budget_spent"] = True
        s = notes.staleness
        record = self.step_record(
            step,
            phase,
            lr,
            out,
            grad_norms,
            rounds,
            epoch=done / task.steps_per_epoch,
            virtual_time=time.perf_counter() - peer.started,
            local_steps=1,
            staleness_mean=sum(s) / len(s) if s else None,
            staleness_max=max(s) if s else None,
            wait_s=notes.wait_s,
            extra=extra,
        )
        return record, StepReport(rounds=rounds)

    def budget(self) -> GlobalBudget | None:
        """How `concord.runtime.driver.drive` ends this stage and when it evaluates with
        ``async.budget = "global"`` (None: per-peer, T local steps)."""
        if self.peer is None or not self.peer.global_budget:
            return None
        return GlobalBudget(self.peer, self.eval_interval())


class GlobalBudget:
    """`concord.runtime.driver.Budget` of a peer with ``async.budget = "global"``: the stage
    ends after the step that brought g = Σ_j k_j / n to T (`AsyncPeer.decide_final`), and an
    evaluation is due after a step at which g crossed a multiple of the evaluation interval,
    so a slow peer evaluates on the schedule of the run, not of its own steps. ``limit``: the
    local steps a peer can take at most (n·T: its own steps alone would make g ≥ T)."""

    def __init__(self, peer: AsyncPeer, interval: int) -> None:
        self.peer = peer
        self.interval = interval
        self.limit = peer.n * peer.runner.total_steps

    def spent(self, step: int) -> bool:
        return self.peer.last_step == step

    def evaluation_due(self, step: int) -> bool:
        block = math.floor(self.peer.recorded / self.interval)  # the record's g (its epoch)
        if block > self.peer.eval_block:
            self.peer.eval_block = block
            return True
        return False
