"""The gRPC data plane of one peer: an aio server (`concord.peer.servicer`) receiving tensors into a
mailbox (`concord.peer.mailbox`), the standard grpc.health.v1 service, and one channel with one
long-lived bidirectional stream per neighbour (`concord.peer.links.Link`) for sending:
``ExchangeRaw`` (raw chunks behind identity serializers, the default) or the protobuf ``Exchange``
(``wire="protobuf"``). `TransportOptions` configures it, built from the run config in one place.

Everything here runs on the peer's event loop and only moves bytes: the training thread packs its
tensor (`Transport.frames`: zero-copy for a single part), the loop cuts it into chunks as it
writes them (one ≤ 1 MiB copy each, shared by all neighbours receiving the tensor, so the first
chunk is on the wire before the last is built), copies incoming chunks into one buffer per tensor
and files it; all tensor arithmetic happens in the training thread (`concord.peer.comm.PeerComm`).
Failure is data: `Transport.round_` returns who answered, who is missing and who was rejected
(with the reason). A neighbour whose connection failed (refused, reset, timed out) is marked down
and not waited for; the next send to it reconnects, at most once per backoff interval (0.2 s
doubling to 5 s). A neighbour that merely refused one of our tensors is still alive and still
waited for; the next send to it reconnects at once. Deadlines are per tensor: writing a whole
tensor, like waiting for one, ends at the round's deadline; a miss is a missing neighbour in the
outcome, never an exception.

Skipping a neighbour (``network.skip_after``, `Transport.round_`): a neighbour that misses that
many rounds in a row (timed out, or its link down) without any tensor of it for this step or the
last arriving in between, even late, becomes *suspect*: rounds no longer wait for it — its tensor
is mixed if it is already here, or (when its latest tensor was of this step or the last) arrives
within a short grace (`SUSPECT_GRACE`) after the others — and what we send it goes out behind the
round (`Link.send_behind`, a copy of the tensor, one in flight at a time), so a stalled
(SIGSTOPped) or cut-off neighbour stops costing a deadline per round for the rest of the run. It is
taken back (waited for again) as soon as one of its tensors for the round in progress is here in
time; on probation when its tensors arrive close behind (within the step window), when this peer
jumps to its neighbours' step, or when it says Hello again after we lost our connection to it (a
restarted peer); a Hello takes it back on probation — one more miss makes it suspect again —
because a peer that comes back far behind (its tensors late for every round) would otherwise cost a
full deadline for each of its reconnects. Both transitions are logged (``neighbour.skipped``,
``neighbour.back``) and counted (`Counters`). Waiting for a merely slow neighbour until the
deadline (the default until it has missed ``skip_after`` rounds) keeps this peer from running away
from it, past its `STEP_WINDOW`.
A round also stops waiting for a neighbour as soon as a tensor of a later step of it arrives (or is
refused as too far ahead): streams are in order, the awaited one will not come.

Falling behind and rejoining: tensors refused as too far ahead are noted per neighbour
(`saw_ahead`); when every neighbour heard from is that far ahead, `behind` tells the training
thread where to jump (`concord.peer.app`). ``Fetch`` (`fetch`, `fetch_any`) asks a neighbour for
its parameters; this peer answers Fetches with a copy its training thread takes at the next step
boundary (`snapshot`, `fulfil`) — or, while a re-admitted peer's joining step is ahead, at that
step's (`joins_at`) — checked on arrival like every tensor (`check_frame`, `FiniteScan`).

Receive bounds (`server_options`, `concord.peer.servicer`, `concord.peer.mailbox`): gRPC refuses
messages above twice the chunk size and more than `MAX_STREAMS` concurrent streams per
connection; each sender may have `BUDGET_TENSORS` tensors' bytes in flight (received but not yet
collected by a round); each stream is closed after ``stream_idle_timeout`` seconds of silence;
the mailbox holds at most `PER_SENDER` early entries per sender and `PER_STEP` per step.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import grpc
import numpy as np
import structlog
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from concord.core.comm import MixOutcome
from concord.core.config import RunConfig
from concord.peer import serde
from concord.peer.links import MAX_MESSAGE, Dialer, Fanout, Link, Prebuilt, Wire, bounded
from concord.peer.mailbox import Arrival, Counters, Mailbox, Rejection
from concord.peer.servicer import GossipServicer, Greetings
from concord.peer.tls import load_credentials
from concord.peer.validate import (
    STEP_WINDOW,
    TENSOR_IDS,
    FiniteScan,
    ReceiverView,
    RejectedError,
    check_frame,
    tensor_bytes,
)
from concord.protos import data_plane_pb2 as pb
from concord.protos import data_plane_pb2_grpc as pb_grpc
from concord.protos.revocation import Revocations

SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_ping_strikes", 0),
]
MAX_STREAMS = 8  # per connection: a neighbour needs its Hello and one Exchange stream
BUDGET_TENSORS = 2  # tensors' bytes in flight per sender
PER_SENDER = 16  # early mailbox entries per sender (tensors, rejections no round awaits yet)
PER_STEP = 256  # … and per step
WINDOW = 256 << 10
WINDOW_SLACK = 64 << 10
"""Each stream's HTTP/2 receive window (``grpc.http2.lookahead_bytes``) is min(chunk, `WINDOW`)
plus this, room for a header. With BDP probing off gRPC's default is 64 KiB, and a sender then
waits for a WINDOW_UPDATE every 64 KiB of a tensor — each a wake-up of the receiver's and the
sender's gRPC threads: on 2 cores shared by 4 peers (`bench/step_overhead.py`) the gRPC peers'
wait per step fell from 30.2 and 15.6 ms to 14.7 and 11.4 ms with a 1 MiB window (load ≈ 8).
But a window is also what every connection may make the receiver buffer before the servicer
reads (and refuses) its stream: with 1 MiB windows 40 stalled connections grew a receiver by
59–77 MiB here and 94 MiB on CI (tests/peer/test_bounds.py's bound: 82 MiB); with 256 KiB by
38–60 MiB (9 runs), the 64 KiB default's spread (42–58), and the step time did not change
(ratio to the hand-written gloo gossip 1.75 against 1.72, idle; docs/performance.md)."""


def server_options(chunk_bytes: int, idle_timeout: float) -> list[tuple[str, int]]:
    """The server's gRPC options: `SERVER_OPTIONS` with the receive limit at twice the chunk size
    (a chunk somewhat over ``chunk_bytes`` still reaches the servicer, which refuses it with its
    reason and counts it; anything larger gRPC refuses itself), `MAX_STREAMS` concurrent streams
    per connection, a receive window of up to `WINDOW` per stream, and connections
    without any call closed after the idle timeout."""
    limit = min(MAX_MESSAGE, 2 * chunk_bytes + (64 << 10))  # + room for the header
    options = [(k, v) for k, v in SERVER_OPTIONS if k != "grpc.max_receive_message_length"]
    return [
        *options,
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_concurrent_streams", MAX_STREAMS),
        ("grpc.http2.bdp_probe", 0),
        ("grpc.max_connection_idle_ms", max(1000, int(idle_timeout * 1000))),
        ("grpc.http2.lookahead_bytes", min(chunk_bytes, WINDOW) + WINDOW_SLACK),
    ]


log = structlog.get_logger("concord.peer.transport")
_STOP_LIMIT = 10.0  # seconds `Transport.stop` may take beyond its grace
# seconds a round waits for a suspect neighbour after the others have arrived (at most a tenth of
# the deadline): a neighbour that is back in step is taken back, one still stalled costs this
SUSPECT_GRACE = 0.05


@dataclasses.dataclass(frozen=True)
class Fetched:
    """A neighbour's parameters (a Fetch answer): taken before it ran ``step``, when its
    gossip-round counter was ``round``; with the part of its algorithm's state that a joining
    replica may take over (`concord.core.algorithms.base.Algorithm.portable_state`)."""

    sender: int
    step: int
    round: int
    x: torch.Tensor  # float32 [dim], this peer's own copy
    state: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)  # each [dim]


@dataclasses.dataclass(frozen=True)
class TransportOptions:
    """Everything that configures one peer's `Transport`, fixed for the process's life; a peer
    builds it from its config in one place (`from_config`). ``wire``: how this peer sends
    ("raw": ExchangeRaw; "protobuf": Exchange), it receives both; ``tensor_ids``: the tensor ids
    the run's algorithm sends (others are refused). With ``server_credentials`` (mTLS) a client
    certificate must name the peer id its Hello and frames claim, and not be on ``revocations``
    (`concord certs revoke`)."""

    run_id: str
    peer_id: int
    world_size: int
    fingerprint: str  # the model's (`concord.core.flat.FlatParams.fingerprint`)
    dim: int  # the model's parameter count
    codec: str  # compression.codec
    chunk_bytes: int  # network.chunk_bytes
    max_tensor_bytes: int  # network.max_tensor_bytes
    deadline: float  # network.deadline: seconds per tensor, sent or awaited
    ratio: float = 0.01  # compression.ratio
    levels: int = 16  # compression.levels (qsgd's s: the dtype of its incoming level parts)
    wire: Wire = "raw"
    max_abs_value: float | None = None  # network.max_abs_value
    stream_idle_timeout: float = 60.0  # network.stream_idle_timeout
    skip_after: int = 3  # network.skip_after
    tensor_ids: frozenset[int] = TENSOR_IDS
    server_credentials: grpc.ServerCredentials | None = None
    channel_credentials: grpc.ChannelCredentials | None = None
    revocations: Revocations | None = None

    def __post_init__(self) -> None:
        if self.skip_after < 1:
            raise ValueError(
                f"skip_after = {self.skip_after}; a neighbour must miss at least 1 round"
            )

    @classmethod
    def from_config(
        cls, cfg: RunConfig, *, run_id: str, peer_id: int, fingerprint: str, dim: int
    ) -> TransportOptions:
        """The options of peer ``peer_id`` of run ``run_id`` under ``cfg`` (``compression.*``,
        ``network.*``; mTLS credentials loaded when ``network.tls`` is set)."""
        net, comp = cfg.network, cfg.compression
        server = channel = revocations = None
        if net.tls is not None:
            server, channel = load_credentials(net.tls.ca, net.tls.cert, net.tls.key, peer_id)
            revocations = Revocations.for_ca(net.tls.ca)  # `concord certs revoke`'s list
        ids = {serde.TENSOR_MIX, serde.TENSOR_ALLREDUCE}  # gossip and exact phases: always
        if cfg.spec.per_edge_messages:  # per-edge messages: only algorithms that send them
            ids.add(serde.TENSOR_EDGE)
        return cls(
            run_id=run_id,
            peer_id=peer_id,
            world_size=cfg.peers,
            fingerprint=fingerprint,
            dim=dim,
            codec=comp.codec,
            ratio=comp.ratio,
            levels=comp.levels,
            chunk_bytes=net.chunk_bytes,
            max_tensor_bytes=net.max_tensor_bytes,
            deadline=net.deadline,
            max_abs_value=net.max_abs_value,
            stream_idle_timeout=net.stream_idle_timeout,
            skip_after=net.skip_after,
            tensor_ids=frozenset(ids),
            server_credentials=server,
            channel_credentials=channel,
            revocations=revocations,
        )


class Transport:
    """The data plane of one peer (module docstring), configured by its `TransportOptions`;
    ``addresses``: where to reach each peer (id order; "" for not known yet, `set_addresses`);
    ``is_neighbour(sender, step, round, tensor_id)``: whether a frame's sender is this peer's
    neighbour there (the coordination's)."""

    def __init__(
        self,
        options: TransportOptions,
        addresses: Sequence[str],
        is_neighbour: Callable[[int, int, int, int], bool],
    ) -> None:
        o = self.options = options
        self.addresses = list(addresses)
        self.grace = min(SUSPECT_GRACE, o.deadline / 10)
        self.misses: dict[int, int] = {}  # neighbour → rounds missed in a row
        self._noted: dict[int, int] = {}  # neighbour → its newest step when its last round ended
        self.suspects: set[int] = set()  # neighbours not waited for (module docstring)
        self.suspected: tuple[int, ...] = ()  # a snapshot of them for the training thread
        # (step, round) of the newest neighbour's tensor refused as too far ahead of this peer
        # (`saw_ahead`); read and cleared by the training thread (`take_ahead`)
        self.ahead: dict[int, tuple[int, int]] = {}
        self._moving: dict[int, int] = {}  # neighbour → distinct (growing) steps refused ahead
        # set per stage by the training set-up: how far ahead a neighbour's frame may be (steps;
        # + the algorithm's silent steps), and the algorithm state a Fetch answer may carry
        # besides the parameters (`concord.core.algorithms.base.Algorithm.portable_state`)
        self.step_window = STEP_WINDOW
        self.fetch_state: frozenset[str] = frozenset()
        self.is_neighbour = is_neighbour
        codecs = frozenset({"none", o.codec})
        self.budget = BUDGET_TENSORS * max(1, tensor_bytes(o.dim, codecs, o.ratio, o.levels))
        self.mailbox = Mailbox(per_sender=PER_SENDER, per_step=max(PER_STEP, 4 * o.world_size))
        self.counters = Counters()
        self.greeted = Greetings(capacity=max(1024, 8 * o.world_size))
        self.rejections: dict[int, tuple[int, str]] = {}  # sender → (step, reason), latest
        hello = serde.hello_request(o.run_id, o.peer_id, o.fingerprint, o.codec)
        self.dialer = Dialer(o.peer_id, hello, o.wire, o.channel_credentials, self.counters)
        self.links: dict[int, Link] = {}
        self.set_addresses(dict(enumerate(self.addresses)))
        self._closing: set[asyncio.Future[None]] = set()
        self._stopping = ""  # the stage `stop` is in (drain, close links, server stop)
        self.stop_timed_out = False  # `stop` left tasks behind: exit without waiting for them
        self.server: grpc.aio.Server | None = None
        self.health: health.aio.HealthServicer | None = None
        self.port = 0
        # Fetch (rejoin): served while the training thread runs (`training`), at its next step
        # boundary (`fulfil`) or, while a re-admitted peer's joining step is ahead, at that one's
        # (`_joins`, wire steps; the training thread's: `joins_at`); `_wanted` are the answers
        # waiting for it
        self.training = False
        self.may_fetch: Callable[[int], bool] | None = None  # the run's graph (coordination's)
        self._wanted: list[asyncio.Future[serde.Outgoing | None]] = []
        self._joins: set[int] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        # more services on this server, registered by `start` (the asynchronous algorithms'
        # ``Push``: `concord.peer.async_wire`)
        self.extra_handlers: list[grpc.GenericRpcHandler] = []

    @property
    def peer_id(self) -> int:
        return self.options.peer_id

    @property
    def deadline(self) -> float:
        """Seconds per tensor, sent or awaited (``network.deadline``)."""
        return self.options.deadline

    @property
    def require_identity(self) -> bool:
        """mTLS: a client certificate must name the peer id its Hello and frames claim."""
        return self.options.server_credentials is not None

    @property
    def idle_timeout(self) -> float:
        return self.options.stream_idle_timeout

    @property
    def revocations(self) -> Revocations | None:
        return self.options.revocations

    def set_addresses(self, addresses: dict[int, str]) -> None:
        """Where to reach each peer (static config, or the orchestrator's schedule). A peer whose
        address changed gets a fresh link; an empty address means "not known (yet)"."""
        for j, address in addresses.items():
            if j == self.peer_id or not address:
                continue
            link = self.links.get(j)
            if link is None or link.address != address:
                if link is not None:
                    self._closing.add(asyncio.ensure_future(link.shutdown()))
                self.links[j] = Link(self.dialer, j, address)

    def view(self) -> ReceiverView:
        """What the receiver checks a frame against now (`concord.peer.validate.check_frame`)."""
        o = self.options
        return ReceiverView(
            run_id=o.run_id,
            peer_id=o.peer_id,
            fingerprint=o.fingerprint,
            dim=o.dim,
            codecs=frozenset({"none", o.codec}),
            ratio=o.ratio,
            levels=o.levels,
            chunk_bytes=o.chunk_bytes,
            max_tensor_bytes=o.max_tensor_bytes,
            current_step=self.mailbox.step,
            is_neighbour=self.is_neighbour,
            world_size=o.world_size,
            step_window=self.step_window,
            tensor_ids=o.tensor_ids,
            max_abs_value=o.max_abs_value,
        )

    async def start(self, listen: str) -> int:
        """Serve on ``listen`` (HOST:PORT; port 0: any free one); returns the port."""
        o = self.options
        self.server = grpc.aio.server(options=server_options(o.chunk_bytes, o.stream_idle_timeout))
        servicer = GossipServicer(self)
        servicer.on_hello = self.greeted_by
        servicer.on_ahead = self.saw_ahead
        servicer.snapshot = self.snapshot
        self._loop = asyncio.get_running_loop()
        servicer.add_to_server(self.server)
        if self.extra_handlers:
            self.server.add_generic_rpc_handlers(tuple(self.extra_handlers))
        # the standard grpc.health.v1 service: "" and "concord.v1.Gossip" report SERVING
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        for service in ("", "concord.v1.Gossip"):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        if o.server_credentials is not None:
            self.port = self.server.add_secure_port(listen, o.server_credentials)
        else:
            self.port = self.server.add_insecure_port(listen)
        await self.server.start()
        return self.port

    async def connect(self, peers: Sequence[int], timeout: float) -> list[int]:
        """Handshake with ``peers`` (start-up barrier); returns those that did not answer."""
        unknown = [j for j in peers if j not in self.links]
        if unknown:
            raise ValueError(f"no address known for peer(s) {unknown}")
        ok = await asyncio.gather(
            *(self.links[j].connect(timeout, wait_for_ready=True) for j in peers)
        )
        return [j for j, good in zip(peers, ok, strict=True) if not good]

    def frames(
        self,
        *,
        step: int,
        round: int,
        tensor_id: int,
        codec: str,
        parts: dict[str, torch.Tensor],
        push_weight: float | None = None,
    ) -> serde.Outgoing:
        """Our tensor, ready to be chunked by `round_`. Call it from the training thread: packing
        several parts is a full copy, which must not run on the event loop. A single part is not
        copied: leave it unchanged until `round_` has returned."""
        return serde.Outgoing(
            run_id=self.options.run_id,
            sender=self.peer_id,
            step=step,
            round=round,
            tensor_id=tensor_id,
            codec=codec,
            dim=self.options.dim,
            parts=parts,
            chunk_bytes=self.options.chunk_bytes,
            push_weight=push_weight,
        )

    async def round_(
        self,
        *,
        step: int,
        round: int,
        tensor_id: int,
        frames: serde.Outgoing | None,
        send_to: Sequence[int],
        receive_from: Sequence[int],
    ) -> tuple[dict[int, Arrival], MixOutcome]:
        """Send ``frames`` (from `frames`; None when ``send_to`` is empty) to ``send_to``, all
        neighbours concurrently, and collect the tensors of
        ``receive_from`` within ``deadline`` seconds. Never raises for a slow, dead or bad
        neighbour: the outcome lists who answered, who is missing (timed out, or its link is
        down so it is not waited for) and who was rejected with what reason."""
        self.mailbox.advance(step)
        key = (step, round, tensor_id)
        targets = [self.links[j] for j in send_to if j in self.links]
        if targets and frames is None:
            raise ValueError("round_ needs frames to send to " + str(list(send_to)))
        waited = [link for link in targets if link.peer_id not in self.suspects]
        sends = []
        if frames is not None and waited:
            fan = Fanout(frames, len(waited), self.options.wire)
            sends = [
                asyncio.create_task(link.send(fan, key, self.deadline), name=f"send-{link.peer_id}")
                for link in waited
            ]
        behind = [link for link in targets if link.peer_id in self.suspects]
        if frames is not None and behind:
            chunks = Prebuilt(frames, self.options.wire)  # a copy: the send may outlive this round
            for link in behind:
                if not link.send_behind(chunks, key, self.deadline):
                    self.counters.dropped_sends += 1
        slots = {j: self.mailbox.slot((j, step, round, tensor_id)) for j in receive_from}
        loop = asyncio.get_running_loop()
        end = loop.time() + self.deadline
        await asyncio.gather(*sends)
        arrived: dict[int, Arrival] = {}
        missing: list[int] = []
        rejected: list[tuple[int, str]] = []
        grace_end: float | None = None
        for j in sorted(slots, key=lambda j: j in self.suspects):  # suspects last
            slot = slots[j]
            peer_link = self.links.get(j)
            got: Arrival | Rejection | None = None
            if slot.done() and not slot.cancelled():
                got = slot.result()  # here already, even from a neighbour whose link is down
            elif j in self.suspects:
                # the others are in (or timed out): a suspect in step with us (its latest tensor
                # is of this step or the last) gets a short grace, no more; one that is behind
                # gets none — it catches up only if it is faster than us
                if step - 1 <= self.mailbox.newest.get(j, -1) <= step:
                    if grace_end is None:
                        grace_end = min(end, loop.time() + self.grace)
                    got = await self._wait(slot, grace_end, j, step)
            elif peer_link is not None and peer_link.alive:
                # a live neighbour is waited for until the round's deadline until it has missed
                # `skip_after` rounds: not waiting for a merely slow one would let this peer run
                # ahead of it (and past its STEP_WINDOW), desynchronising the gossip
                got = await self._wait(slot, end, j, step)
                if got is None and self.mailbox.newest.get(j, -1) <= step:
                    self.counters.missed_deadlines += 1
            # collected (or given up): the slot's bytes are released, a later copy is late
            self.mailbox.take((j, step, round, tensor_id))
            self._note(j, got, step, round)
            if isinstance(got, Arrival):
                arrived[j] = got
            elif isinstance(got, Rejection):
                rejected.append((j, got.reason))
            else:
                missing.append(j)
        missing.sort()
        outcome = MixOutcome(answered=[sorted(arrived)], missing=[missing], rejected=[rejected])
        return arrived, outcome

    async def _wait(
        self, slot: asyncio.Future[Arrival | Rejection], until: float, j: int, step: int
    ) -> Arrival | Rejection | None:
        """The slot's content if it is filled before loop time ``until``; None when it is not by
        then, or as soon as neighbour ``j`` sends a tensor of a later step (its streams are in
        order: the one for ``step`` is never coming)."""
        loop = asyncio.get_running_loop()
        while not slot.done():
            remaining = until - loop.time()
            if remaining <= 0 or self.mailbox.newest.get(j, -1) > step or self._refused(j, step):
                return None
            watch = self.mailbox.watch = loop.create_future()
            try:
                await asyncio.wait(
                    {slot, watch}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                self.mailbox.watch = None
                watch.cancel()
        return None if slot.cancelled() else slot.result()

    def _note(self, j: int, got: Arrival | Rejection | None, step: int, round: int) -> None:
        """Count a round's result for neighbour ``j``: misses in a row make it suspect, a tensor
        of it in time takes a suspect back (module docstring). A rejection is neither."""
        newest = self.mailbox.newest.get(j, -1)
        moved = newest > self._noted.get(j, -1)
        self._noted[j] = newest
        if j in self.suspects:
            if isinstance(got, Arrival):
                self._take_back(j, "tensor in time", step=step, round=round)
            elif moved and step - self.step_window <= newest < step:
                # alive and just behind us (its tensors arrive, late): waiting for it again
                # keeps this peer from running away from it for good, cutting the graph apart
                self._take_back(j, "close behind", misses=self.options.skip_after - 1, step=step)
            elif got is None:
                self.counters.not_waited += 1
            return
        fresh = moved and newest >= step - 1
        if isinstance(got, Arrival) or (got is None and fresh):
            # a tensor of it came, if only just too late for this round: a neighbour that is
            # slow (waiting for a stalled peer of its own, say) is not skipped — skipping it
            # would let this peer run away and cut the graph apart
            self.misses[j] = 0
        elif got is None:
            misses = self.misses[j] = self.misses.get(j, 0) + 1
            if misses >= self.options.skip_after:
                self.suspects.add(j)
                self.suspected = tuple(sorted(self.suspects))
                self.counters.skipped += 1
                log.warning(
                    "neighbour.skipped",
                    peer=self.peer_id,
                    neighbour=j,
                    missed=misses,
                    step=step,
                    round=round,
                    skipped=self.counters.skipped,
                )

    def _take_back(self, j: int, why: str, *, misses: int = 0, **where: int) -> None:
        link = self.links.get(j)
        if link is not None:  # it answers again: the next send reconnects at once
            link.next_try, link.backoff = 0.0, 0.2
        self.suspects.discard(j)
        self.suspected = tuple(sorted(self.suspects))
        self.misses[j] = misses
        self.counters.back += 1
        log.info(
            "neighbour.back",
            peer=self.peer_id,
            neighbour=j,
            why=why,
            back=self.counters.back,
            **where,
        )

    def jumped(self) -> None:
        """This peer jumped to its neighbours' step (`behind`): in step with them now, it waits
        for them again — on probation — instead of running away from them."""
        for j in sorted(self.suspects):
            self._take_back(j, "jumped", misses=self.options.skip_after - 1)

    def greeted_by(self, j: int) -> None:
        """Neighbour ``j`` said Hello (the servicer's hook): a suspect we had lost our connection
        to is back — a restarted peer — and is waited for again, on probation (module
        docstring). A Hello from one we still reach is a mere reconnect (e.g. after we refused a
        tensor of it too far ahead) and changes nothing."""
        link = self.links.get(j)
        if j in self.suspects and (link is None or not link.alive):
            self._take_back(j, "hello", misses=self.options.skip_after - 1)

    # -- Fetch: parameters for a neighbour that (re)joins ------------------------------------

    async def snapshot(self) -> serde.Outgoing | None:
        """This peer's parameters, taken by the training thread at its next step boundary (or a
        joining step's, `fulfil`); None when it is not training, or none comes within a round's
        worst case (a deadline for the sends, one for the receives, and some slack)."""
        if not self.training:
            return None
        fut: asyncio.Future[serde.Outgoing | None] = asyncio.get_running_loop().create_future()
        self._wanted.append(fut)
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(fut), 2 * self.deadline + 5.0)
        return None

    @property
    def wanted(self) -> bool:
        """A Fetch waits for `fulfil` (read by the training thread at each step boundary)."""
        return bool(self._wanted)

    def joins_at(self, step: int) -> None:
        """The training thread: a re-admitted peer joins the gossip at wire step ``step`` (the
        schedule that adds it back). Until then Fetches (its) are answered at that step's
        boundary, not earlier: it starts right there, with its neighbours' round counter — the
        rounds of the steps before it are not known in advance in a controlled step — and they,
        not gossiping with it before that step, keep reaching step boundaries meanwhile."""
        self._joins.add(step)

    def fulfil(
        self,
        x: torch.Tensor,
        step: int,
        round: int,
        state: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        """The training thread, between two steps: answer the waiting Fetches with a copy of
        ``x`` (the parameters before wire step ``step``; ``round``: the gossip-round counter)
        and of ``state`` (the algorithm's portable state, ``dim`` elements each, e.g. the
        momentum) — copies, because training goes on while the answer is sent — unless a
        joining step is still ahead (`joins_at`). The state is left out (logged) when it would
        take the answer past ``max_tensor_bytes``: the parameters alone still let a peer join."""
        loop = self._loop
        if not self._wanted or loop is None:
            return
        self._joins = {j for j in self._joins if j >= step}
        if self._joins and step not in self._joins:
            return  # answered at the boundary of the joining step (bounded by `snapshot`)
        parts = {"values": x.detach().to(torch.float32).reshape(-1).clone()}
        extra = {k: v for k, v in sorted((state or {}).items()) if v.numel() == self.options.dim}
        if 4 * self.options.dim * (1 + len(extra)) <= self.options.max_tensor_bytes:
            parts |= {k: v.detach().to(torch.float32).reshape(-1).clone() for k, v in extra.items()}
        elif extra:
            log.warning("fetch.state_left_out", peer=self.peer_id, parts=sorted(extra))
        out = self.frames(
            step=step,
            round=round,
            tensor_id=serde.TENSOR_FETCH,
            codec="none",
            parts=parts,
        )
        loop.call_soon_threadsafe(self._answer, out)

    def _answer(self, out: serde.Outgoing | None) -> None:
        wanted, self._wanted = self._wanted, []
        for fut in wanted:
            if not fut.done():
                fut.set_result(out)

    def stop_serving(self) -> None:
        """Training is over (on the loop): Fetches are refused from now on."""
        self.training = False
        self._answer(None)

    async def fetch(self, j: int, timeout: float) -> Fetched | None:
        """Neighbour ``j``'s parameters (Hello first, on the link's connection); None when it
        does not answer within ``timeout`` seconds, is not training, or sends something that
        fails the checks every received tensor passes (logged)."""
        link = self.links.get(j)
        if link is None:
            return None
        try:
            async with asyncio.timeout(timeout):
                if not await link.connect(timeout) or link.channel is None:
                    return None
                call = pb_grpc.GossipStub(link.channel).Fetch(
                    pb.FetchRequest(run_id=self.options.run_id, peer_id=self.peer_id)
                )
                return await self._fetched(j, aiter(call))
        except grpc.aio.AioRpcError as exc:
            why = f"{exc.code().name}: {exc.details()}"
        except (TimeoutError, RejectedError, serde.MalformedFrameError) as exc:
            why = repr(exc)
        log.info("fetch.none", peer=self.peer_id, neighbour=j, why=why)
        return None

    async def _fetched(self, j: int, frames: AsyncIterator[pb.TensorFrame]) -> Fetched:
        """Assemble and check one Fetch answer (`check_frame` and `FiniteScan`, as for every
        received tensor: sender, run, sizes, parts, finiteness, ``max_abs_value``)."""
        view: ReceiverView | None = None
        head: serde.FrameInfo | None = None
        buf = np.empty(0, dtype=np.uint8)
        scan: FiniteScan | None = None
        received = next_index = 0
        async for frame in frames:
            info, body = serde.frame_from_wire(frame)
            if view is None:
                view = dataclasses.replace(
                    self.view(),
                    current_step=info.step,
                    codecs=frozenset({"none"}),
                    tensor_ids=frozenset({serde.TENSOR_FETCH}),
                    is_neighbour=lambda *_: True,
                    fetch_state=self.fetch_state,
                )
            check_frame(info, len(body), view, expected_sender=j)
            if head is None:
                if info.chunk_index != 0 or info.codec != "none":
                    raise RejectedError("invalid", "a Fetch answer is one uncompressed tensor")
                head = info
                buf = np.empty(info.byte_length, dtype=np.uint8)  # every byte written below
                parts = info.parts or ()
                scan = FiniteScan(serde.tensors_from_payload(buf, parts), parts, view.max_abs_value)
            same = (info.step, info.round, info.byte_length) == (
                head.step,
                head.round,
                head.byte_length,
            )
            if not same or info.chunk_index != next_index or info.chunk_offset != received:
                raise RejectedError("invalid", f"chunk {info.chunk_index} out of order")
            buf[received : received + len(body)] = np.frombuffer(body, dtype=np.uint8)
            received += len(body)
            next_index += 1
            if scan is not None:
                scan.advance(received)
        if head is None or received != head.byte_length or next_index != head.chunk_count:
            raise RejectedError("invalid", "an incomplete Fetch answer")
        tensors = serde.tensors_from_payload(buf, head.parts or ())
        values = tensors.pop("values", None)
        if values is None or values.numel() != self.options.dim or values.dtype != torch.float32:
            raise RejectedError("invalid", "a Fetch answer without the float32 parameters")
        state = {k: v.clone() for k, v in tensors.items()}  # `check_parts`: portable, [dim]
        return Fetched(j, head.step, head.round, values.clone(), state)

    async def fetch_any(self, peers: Sequence[int], timeout: float) -> Fetched | None:
        """The most advanced answer of ``peers`` (asked concurrently), or None."""
        got = await asyncio.gather(*(self.fetch(j, timeout) for j in peers))
        answers = [f for f in got if f is not None]
        return max(answers, key=lambda f: f.step) if answers else None

    def _refused(self, j: int, step: int) -> bool:
        """We refused ``j``'s tensor of ``step`` (or a later one) as too far ahead: it will not
        send that one again (a peer that jumped lands on such a step)."""
        got = self.ahead.get(j)
        return got is not None and got[0] >= step

    def saw_ahead(self, sender: int, step: int, round: int) -> None:
        """A neighbour's tensor of ``step`` (round ``round``) was refused as more than
        `step_window` steps ahead of us: this peer fell behind (stalled, or restarted from an old
        checkpoint) and its neighbours went on without it (they skip it). Remembers the newest
        such step (the first round seen of it) for the training thread, which jumps there
        (`concord.peer.app`): behind by more than the window it can mix with nobody."""
        got = self.ahead.get(sender)
        if got is None or step > got[0]:
            self._moving[sender] = self._moving.get(sender, 0) + 1
        if got is None or step > got[0] or (step == got[0] and round < got[1]):
            self.ahead = {**self.ahead, sender: (step, round)}  # replaced whole: read by a thread
        self.mailbox.seen(sender, step)

    def behind(self, step: int, neighbours: Sequence[int]) -> tuple[int, int] | None:
        """Where to jump from ``step`` (the training thread): the (step, round) of the least
        advanced of ``neighbours``, when every one of them has sent tensors of at least two
        different, growing steps refused as too far ahead — this peer is the one behind. A
        neighbour in step (or one silent, or dead) keeps it where it is: one runaway neighbour
        must not pull the others along, and one odd frame (a single far step) is no trend."""
        ahead, newest, moving = self.ahead, dict(self.mailbox.newest), dict(self._moving)
        if not neighbours or any(
            j not in ahead or moving.get(j, 0) < 2 or newest.get(j, -1) > ahead[j][0]
            for j in neighbours
        ):
            return None
        least = min((ahead[j] for j in neighbours), key=lambda sr: sr[0])
        if least[0] <= step + self.step_window:
            return None
        # land `step_window` steps past where the least advanced neighbour was: it has moved
        # on meanwhile, and our tensors must reach it early (filed) or in time, not late
        lead = self.step_window
        return least[0] + lead, least[1] + lead

    async def stop(self, grace: float, *, limit: float = _STOP_LIMIT) -> None:
        """Drain the outgoing links (``grace`` seconds), close them, stop the server. Bounded:
        a finished peer must exit even if a close never completes (seen: a peer stuck here for
        minutes after its neighbours exited) — after ``grace + limit`` seconds it logs what it
        gave up on, sets `stop_timed_out` (the process then exits without waiting for the tasks
        left behind) and returns."""
        if not await bounded(self._stop(grace), "transport.stop", grace + limit):
            self.stop_timed_out = True
            log.warning(
                "transport.stop_timeout",
                waited=grace + limit,
                stuck_in=self._stopping,
                links=sorted(self.links),
            )

    async def _stop(self, grace: float) -> None:
        self._stopping = "health"  # named in the timeout's log line
        if self.health is not None:
            await self.health.enter_graceful_shutdown()
        self._stopping = "drain"
        await asyncio.gather(*(link.drain(grace) for link in self.links.values()))
        self._stopping = "close links"
        await asyncio.gather(*(link.shutdown() for link in self.links.values()), *self._closing)
        self._stopping = "server stop"
        if self.server is not None:
            await self.server.stop(grace)
