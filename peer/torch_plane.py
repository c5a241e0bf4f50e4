"""The torch.distributed data plane (``network.transport = "torch"``): `TorchComm` moves the
tensors of `concord.core.comm.Comm` with point-to-point operations of a process group — gloo on
CPU, NCCL on GPU — while the control plane (stages, schedules, consensus decisions) stays MQTT.

What it is for: a data-centre cluster where NCCL moves GPU tensors GPU to GPU and gloo's C++
transport costs less CPU per byte than Concord's validated gRPC streams. What it gives up, by
construction of a process group: a *fixed world* — every peer must be there at the rendezvous, a
peer cannot rejoin, and a crashed or unreachable peer makes its neighbours' operations fail
within ``network.torch.timeout``, which ends the run (no skipping, no renormalising over who
answered). No TLS: use it on a trusted network (docs/deployment.md#torch-data-plane).

Rendezvous (`TorchPlane.connect`, ``network.torch.init``):

* ``orchestrator`` — the orchestrator hosts a ``TCPStore`` and announces its address in the
  retained ``plan`` message (``Plan.store``); peers join the process group through it, keys
  prefixed with the run id;
* ``env`` — ``env://`` (MASTER_ADDR / MASTER_PORT, as ``torchrun`` sets them);
* ``tcp://HOST:PORT`` — peer 0 hosts the store there (static peers without an orchestrator);
* ``auto`` — ``env`` when MASTER_ADDR and MASTER_PORT are set, else ``orchestrator``.

Rank = peer id, world size = ``peers``.

One round, between a sender and each neighbour, is one message each way, posted in one batch
(`torch.distributed.batch_isend_irecv`, which NCCL needs to run sends and receives together),
after which the round returns and travels while the training thread computes (overlap). The
message is a uint8 tensor: a fixed 64-byte header region, then the payload.

* The header, int64 ``[MAGIC, step, round, tensor_id, byte_length, push-sum weight bits,
  TORCH_PLANE_VERSION, 0]``, is checked when the round ends: the same format version, both sides
  in the same round of the same step, the same length, else `TorchPlaneError` naming both (the
  peers diverged). The peers also compare their format versions once at the rendezvous
  (`TorchPlane.connect`): a mismatched peer fails there, before any round.
* The payload: the codec's parts back to back (`concord.peer.serde.layout`), or the float32
  vector, at byte 64 (parts keep their alignment). The receiver posts a buffer of the length it
  computes from its own codec and d. Every peer runs the same rounds with the same codec
  (below; the Hello handshake checks model and codec), so lengths agree; a peer that diverged
  anyway would send another length, which gloo answers by aborting the process. (Exchanging
  the headers first would rule that out but costs overlap: 50.1 ms per step in
  `bench/step_overhead.py` against 43–47 ms without, separate runs on the reference machine.)

One message rather than a header message and a payload message halves the point-to-point
operations a round posts on the training thread (2 per neighbour instead of 4, as many as a
hand-written gossip posts), at the cost of copying the float32 vector behind the header (a
codec's parts are packed into a buffer in any case). Send and receive buffers of finished
rounds are kept for later rounds (`TorchComm._release`): a fresh multi-MB buffer costs its page
faults on every round.

Per-edge messages (`TorchComm.exchange`), whose lengths the receiver cannot know, do send their
headers first, then payloads of the announced lengths.

Every peer must run the same rounds. Consensus control's repeat/stop answers are agreed on by
every peer (`AgreedControl`: one scalar ``all_reduce`` per round) so that a peer whose control
plane fell back (a late decision, a lost broker) stops every peer's step rather than leaving
the others waiting; algorithms whose graph moves by the orchestrator's decisions
(``ada-feedback``) are refused on this plane.

Received floating parts are checked as on gRPC (finite, ``network.max_abs_value``): a neighbour
whose tensor fails is *rejected* for that round (`MixOutcome.rejected`) and the mix uses the
others. The arithmetic — codecs, weights, push-sum — is `concord.peer.comm.RoundComm`'s, shared
with the gRPC plane, so the two planes give the same parameters (`tests/integration/
test_torch_plane.py`). The exact average (`allreduce_mean`) is one ``all_reduce``.

GPU-only code paths (NCCL: device buffers, ``torch.cuda.set_device``) are marked ``# GPU path``;
they run where a GPU exists (`tests/peer/test_torch_plane.py::test_nccl_*`).
"""

from __future__ import annotations

import datetime
import math
import os
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
import torch
import torch.distributed as dist

from concord.core.comm import Edge, MixOutcome
from concord.core.compress import Encoded
from concord.errors import RejectedError
from concord.errors import TorchPlaneError as TorchPlaneError
from concord.peer.comm import Delivered, Received, RoundComm, RoundHandle, _Round
from concord.peer.serde import TENSOR_ALLREDUCE, TENSOR_EDGE, PartSpec, layout
from concord.peer.validate import check_values

if TYPE_CHECKING:
    from concord.core.config import RunConfig

log = structlog.get_logger("concord.peer.torch_plane")

MAGIC = 0x434F4E43  # "CONC"
TORCH_PLANE_VERSION = 2
"""The torch plane's message format, checked at the rendezvous (`TorchPlane.connect`) and in
every header. 1: a round's header and payload as two messages; 2: one message per neighbour
and round, the header folded in front of the payload, the version in the header. Independent of
the gRPC plane's ``PROTOCOL_VERSION`` (`concord.peer.serde`), whose wire did not change."""
HEADER = 8  # int64 fields of a header: seven used, one zero (the payload starts 64-byte aligned)
HEADER_BYTES = 8 * HEADER
_TAG_HEADER, _TAG_PAYLOAD, _TAG_ROUND = 1, 2, 3  # per-edge headers and payloads; round messages
_POOL = 8  # buffers kept per payload size (a peer receives one per in-neighbour and round)
_Pool = dict[tuple[torch.dtype, int], list[torch.Tensor]]  # (uint8, payload bytes) → messages


def _f64_bits(value: float | None) -> int:
    """A push-sum weight as int64 bits (NaN: no weight), to travel in the int64 header."""
    x = math.nan if value is None else value
    return int(struct.unpack("<q", struct.pack("<d", x))[0])


def _bits_f64(bits: int) -> float | None:
    x = float(struct.unpack("<d", struct.pack("<q", bits))[0])
    return None if math.isnan(x) else x


class TorchPlane:
    """This process's membership in the run's torch.distributed process group."""

    def __init__(self, cfg: RunConfig, rank: int, device: torch.device, run_id: str) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world_size = cfg.peers
        self.run_id = run_id
        t = cfg.network.torch
        backend = t.backend
        if backend == "auto":
            backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "nccl" and device.type != "cuda":
            raise TorchPlaneError(
                f"network.torch.backend = 'nccl' moves GPU tensors; this peer's device is {device}"
                " (use 'gloo' or 'auto')"
            )
        self.backend = backend
        # gloo sends CPU tensors; NCCL sends from the peer's GPU
        self.device = device if backend == "nccl" else torch.device("cpu")
        self.timeout = datetime.timedelta(seconds=t.timeout)
        self.connected = False

    def method(self) -> str:
        """The rendezvous ``network.torch.init`` selects here: 'orchestrator', 'env' or a
        tcp:// URL."""
        init = self.cfg.network.torch.init
        if init == "auto":
            env = "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ
            return "env" if env else "orchestrator"
        return init

    def connect(self, store: str | None) -> None:
        """Join the process group (blocks until every peer has joined, at most
        ``network.torch.timeout``). ``store``: the orchestrator's TCPStore ``host:port`` (from
        the plan; ``host:port#PREFIX`` with the secret prefix of the run's keys), needed when
        the rendezvous is 'orchestrator'."""
        method = self.method()
        kwargs: dict[str, object] = {}
        if method == "orchestrator":
            if store is None:
                raise TorchPlaneError(
                    "network.torch.init = 'orchestrator' but no store address came with the "
                    "plan (static peers have no orchestrator: set network.torch.init to 'env' "
                    "or 'tcp://HOST:PORT')"
                )
            store, _, secret = store.partition("#")  # the run's secret key prefix, if any
            host, _, port = store.rpartition(":")
            try:
                client = dist.TCPStore(  # type: ignore[attr-defined]
                    host, int(port), is_master=False, timeout=self.timeout, use_libuv=True
                )
            except (RuntimeError, ValueError) as exc:
                raise TorchPlaneError(
                    f"peer {self.rank} cannot reach the orchestrator's torch.distributed store "
                    f"at {store} (network.torch.store_host / store_port): {exc}"
                ) from exc
            prefix = f"concord/{self.run_id}/{secret}/" if secret else f"concord/{self.run_id}/"
            kwargs["store"] = dist.PrefixStore(prefix, client)  # type: ignore[attr-defined]
        elif method == "env":
            missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
            if missing:
                raise TorchPlaneError(
                    f"network.torch.init = 'env' needs {' and '.join(missing)} in the "
                    "environment (torchrun sets them)"
                )
            kwargs["init_method"] = "env://"
        else:
            kwargs["init_method"] = method
        if self.backend == "nccl":  # GPU path
            torch.cuda.set_device(self.device)
        t0 = time.perf_counter()
        try:
            dist.init_process_group(
                self.backend,
                rank=self.rank,
                world_size=self.world_size,
                # the group's own timeout (NCCL's watchdog tears a process down at it) beyond
                # the per-operation wait, so that a lost peer ends in `TorchPlaneError`
                timeout=2 * self.timeout,
                **kwargs,  # type: ignore[arg-type]
            )
            # every peer is in; NCCL wants one collective over the whole group before the
            # first batched point-to-point operation
            dist.barrier()
        except (RuntimeError, ValueError) as exc:
            raise TorchPlaneError(
                f"torch.distributed rendezvous ({method}, backend {self.backend}) failed for "
                f"peer {self.rank} of {self.world_size}: {exc}"
            ) from exc
        self.connected = True
        self._check_version()
        log.info(
            "torch_plane.connected",
            backend=self.backend,
            init=method,
            seconds=round(time.perf_counter() - t0, 3),
        )

    def _check_version(self) -> None:
        """Every peer speaks this peer's `TORCH_PLANE_VERSION`, else `TorchPlaneError` (the
        group is left): one ``all_reduce`` (MAX) of (v, −v) gives the highest and the lowest
        version of the run. A peer of a Concord before version 2 does not take part: the
        ``all_reduce`` times out within ``network.torch.timeout``, also an error naming it."""
        v = torch.tensor(
            [TORCH_PLANE_VERSION, -TORCH_PLANE_VERSION], dtype=torch.int64, device=self.device
        )
        try:
            work = dist.all_reduce(v, op=dist.ReduceOp.MAX, async_op=True)
            if work is not None:
                work.wait(self.timeout)
        except RuntimeError as exc:
            self.close()
            raise TorchPlaneError(
                f"peer {self.rank}: comparing torch data plane message formats failed (a peer "
                f"crashed, or runs a Concord whose torch plane predates format version 2 and "
                f"does not take part): {exc}"
            ) from exc
        high, low = int(v[0]), -int(v[1])
        if high != low:
            self.close()
            raise TorchPlaneError(
                f"peer {self.rank} speaks torch data plane message format "
                f"{TORCH_PLANE_VERSION}, but the run's peers speak formats {low} to {high}: "
                "run the same Concord version on every peer"
            )

    def close(self) -> None:
        if self.connected and dist.is_initialized():
            dist.destroy_process_group()
        self.connected = False

    def agree(self, flag: bool) -> bool:
        """True when every peer passes True (one scalar ``all_reduce`` with MIN): peers whose
        control planes fell back differently (a late decision, a lost broker) still run the same
        rounds — on this plane a round one peer skips is a hang or a mismatch for the others."""
        value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self.device)
        try:
            work = dist.all_reduce(value, op=dist.ReduceOp.MIN, async_op=True)
            if work is not None:
                work.wait(self.timeout)
        except RuntimeError as exc:
            raise TorchPlaneError(
                f"peer {self.rank}: agreeing on the next round failed (a peer crashed, is "
                f"unreachable or stalled beyond network.torch.timeout): {exc}"
            ) from exc
        return bool(int(value.item()))


class AgreedControl:
    """A `concord.core.loop.ControlHook` whose repeat/stop answers every peer agrees on
    (`TorchPlane.agree`): a round runs again only if it does on every peer. Consensus control's
    decisions are the same on every peer when the control plane works; this keeps the fixed
    world in step when it does not (a peer's fallback stops every peer's step)."""

    def __init__(self, inner: Any, plane: TorchPlane) -> None:
        self.inner = inner
        self.plane = plane
        self._round: Any = None

    def begin(self, step: int, phase: Any, grad_norms: torch.Tensor) -> AgreedControl:
        self._round = self.inner.begin(step, phase, grad_norms)
        return self

    def after_round(self, round_index: int, x: torch.Tensor, theta_local: torch.Tensor) -> bool:
        return self.plane.agree(bool(self._round.after_round(round_index, x, theta_local)))

    def end(self, step: int) -> float | None:
        result: float | None = self.inner.end(step)
        return result


@dataclass
class _Message:
    """One neighbour's tensor as received (`concord.peer.comm.Delivered`)."""

    codec: str
    push_weight: float | None
    parts: tuple[PartSpec, ...]
    payload: torch.Tensor  # uint8, on the plane's device (the message past its header)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Views of the named parts (parts are aligned: `concord.core.compress`)."""
        return {
            p.name: self.payload[p.offset : p.offset + p.nbytes].view(p.dtype) for p in self.parts
        }


@dataclass
class _TorchRound(_Round):
    """A round in flight: its works and the receive buffers."""

    works: list[dist.Work] | None = None
    payloads: dict[int, torch.Tensor] = field(default_factory=dict)  # sender → its message
    codec: str = "none"
    parts: tuple[PartSpec, ...] = ()
    sent: torch.Tensor | None = None  # the message being sent: unchanged until released


class TorchComm(RoundComm):
    """`RoundComm` over a connected `TorchPlane` (module docstring)."""

    def __init__(self, plane: TorchPlane) -> None:
        if not plane.connected:
            raise TorchPlaneError("TorchComm needs a connected TorchPlane (TorchPlane.connect)")
        super().__init__(plane.rank, plane.world_size)
        self.plane = plane
        self.device = plane.device
        cfg = plane.cfg
        self.max_abs_value = cfg.network.max_abs_value
        # buffers of finished rounds, by (uint8, payload bytes), for the next rounds: a fresh
        # multi-MB buffer per round costs its page faults on every round
        self._free: _Pool = {}  # receiving
        self._outbox: _Pool = {}  # sending

    def _message(self, nbytes: int, pool: _Pool) -> torch.Tensor:
        """A message buffer for a payload of ``nbytes`` (contents undefined): a released one of
        this size from ``pool``, or a new one."""
        free = pool.get((torch.uint8, nbytes))
        if free:
            return free.pop()
        return torch.empty(HEADER_BYTES + nbytes, dtype=torch.uint8, device=self.device)

    @staticmethod
    def _keep(pool: _Pool, message: torch.Tensor) -> None:
        free = pool.setdefault((torch.uint8, message.numel() - HEADER_BYTES), [])
        if len(free) < _POOL:
            free.append(message)

    def _release(self, r: _Round) -> None:
        """Keep the round's messages for later rounds (at most `_POOL` per size and use)."""
        assert isinstance(r, _TorchRound)
        for message in r.payloads.values():
            self._keep(self._free, message)
        if r.sent is not None:
            self._keep(self._outbox, r.sent)
        r.payloads, r.sent = {}, None

    def _header(
        self, step: int, round: int, tensor_id: int, nbytes: int, push: float | None
    ) -> torch.Tensor:
        values = [MAGIC, step, round, tensor_id, nbytes, _f64_bits(push), TORCH_PLANE_VERSION, 0]
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    @staticmethod
    def _layout(values: torch.Tensor, encoded: Encoded | None) -> tuple[tuple[PartSpec, ...], int]:
        """The payload layout of this round — the neighbours' as well: a codec's parts have
        sizes fixed by d (`part_specs`), and every peer of a round encodes with the same codec."""
        if encoded is None:
            return (PartSpec("values", torch.float32, values.numel(), 0),), 4 * values.numel()
        specs, total = layout(encoded.parts)
        return tuple(specs), total

    def _pack(
        self,
        values: torch.Tensor,
        encoded: Encoded | None,
        header: torch.Tensor,
        parts: tuple[PartSpec, ...],
        nbytes: int,
    ) -> torch.Tensor:
        """The message to send: the header, then the float32 vector or the codec's ``parts``
        (``nbytes`` in all)."""
        message = self._message(nbytes, self._outbox)
        message[:HEADER_BYTES].view(torch.int64).copy_(header)
        payload = message[HEADER_BYTES:]
        if encoded is None:
            flat = values.detach().to(device=self.device, dtype=torch.float32).reshape(-1)
            payload.view(torch.float32).copy_(flat)
            return message
        for spec in parts:
            part = encoded.parts[spec.name].detach().contiguous().view(-1)
            payload[spec.offset : spec.offset + spec.nbytes].copy_(part.view(torch.uint8))
        return message

    def _run(self, ops: list[dist.P2POp], what: str) -> list[dist.Work]:
        if not ops:
            return []
        try:
            return list(dist.batch_isend_irecv(ops))
        except RuntimeError as exc:
            raise TorchPlaneError(f"peer {self.rank}: {what} failed to start: {exc}") from exc

    def _wait(self, works: Sequence[dist.Work], what: str) -> None:
        for w in works:
            try:
                w.wait(self.plane.timeout)
            except RuntimeError as exc:
                raise TorchPlaneError(
                    f"peer {self.rank}: {what} failed (a peer crashed, is unreachable or "
                    f"stalled beyond network.torch.timeout = "
                    f"{self.plane.timeout.total_seconds():g} s; the torch data plane's world "
                    f"is fixed): {exc}"
                ) from exc

    def _start(
        self,
        *,
        step: int,
        round: int,
        tensor_id: int,
        values: torch.Tensor,
        send_to: list[int],
        receive_from: list[int],
        encoded: Encoded | None = None,
        push_weight: float | None = None,
    ) -> _Round:
        """Post one message to and from each neighbour in one batch and return (module
        docstring)."""
        t0 = time.perf_counter()
        step += self.step_base
        d = encoded.d if encoded is not None else values.numel()
        codec = encoded.codec if encoded is not None else "none"
        parts, nbytes = self._layout(values, encoded)
        sent, ops = None, []
        if send_to:
            header = self._header(step, round, tensor_id, nbytes, push_weight)
            sent = self._pack(values, encoded, header, parts, nbytes)
            ops = [dist.P2POp(dist.isend, sent, j, tag=_TAG_ROUND) for j in send_to]
        received = {j: self._message(nbytes, self._free) for j in receive_from}
        ops += [dist.P2POp(dist.irecv, received[j], j, tag=_TAG_ROUND) for j in receive_from]
        works = self._run(ops, f"round {round} of step {step}")
        started = time.perf_counter()
        self.breakdown.encode_ms += (started - t0) * 1e3
        return _TorchRound(
            started=started,
            step=step,
            round=round,
            tensor_id=tensor_id,
            edges=[(self.rank, j) for j in send_to],
            receive_from=receive_from,
            raw=d * 4,
            wire=nbytes,
            works=works,
            payloads=received,
            codec=codec,
            parts=parts,
            sent=sent,
        )

    def _done(self, r: _Round) -> bool:
        assert isinstance(r, _TorchRound)
        return all(w.is_completed() for w in r.works or ())

    def _check_header(
        self,
        step: int,
        round: int,
        tensor_id: int,
        j: int,
        header: torch.Tensor,
        nbytes: int | None,
    ) -> tuple[float | None, int]:
        """The push-sum weight and the payload length in peer j's header, after checking that
        it is this round's (``nbytes`` None: any whole number of float32 values)."""
        magic, s, r, tid, length, push, version, _ = (int(v) for v in header.tolist())
        if magic == MAGIC and version != TORCH_PLANE_VERSION:
            raise TorchPlaneError(
                f"peer {self.rank} got a message in torch data plane format {version} from peer "
                f"{j}; this peer speaks format {TORCH_PLANE_VERSION}: run the same Concord "
                "version on every peer"
            )
        want = length if nbytes is None and length % 4 == 0 else nbytes
        if (magic, s, r, tid, length) != (MAGIC, step, round, tensor_id, want):
            expected = "float32 values" if nbytes is None else f"{nbytes} bytes"
            raise TorchPlaneError(
                f"peer {self.rank} expected tensor {tensor_id} of step {step} round {round} "
                f"({expected}) from peer {j} and got tensor {tid} of step {s} round {r} "
                f"({length} bytes, magic {magic:#x}): the peers' rounds diverged"
            )
        return _bits_f64(push), length

    def _finish(self, r: _Round, *, overlapped: bool) -> Received:
        assert isinstance(r, _TorchRound)
        t1 = time.perf_counter()
        peers = sorted({j for _, j in r.edges} | set(r.receive_from))
        self._wait(r.works or (), f"round {r.round} of step {r.step} with peers {peers}")
        r.works = None
        outcome = MixOutcome(answered=[[]], missing=[[]], rejected=[[]])
        arrived: dict[int, Delivered] = {}
        nbytes = sum(p.nbytes for p in r.parts)
        for j in r.receive_from:
            message = r.payloads[j]
            header = message[:HEADER_BYTES].view(torch.int64)
            push, _ = self._check_header(r.step, r.round, r.tensor_id, j, header, nbytes)
            got = _Message(r.codec, push, r.parts, message[HEADER_BYTES:])
            try:
                if push is not None and not (math.isfinite(push) and push > 0):
                    raise RejectedError("invalid", f"push-sum weight {push!r} is not finite > 0")
                check_values(got.tensors(), r.parts, self.max_abs_value)
            except RejectedError as exc:
                log.warning("torch_plane.rejected", sender=j, step=r.step, reason=exc.detail)
                outcome.rejected[0].append((j, exc.detail))
                continue
            arrived[j] = got
            outcome.answered[0].append(j)
        self._ended(r, t1, outcome, overlapped=overlapped)
        return arrived, outcome

    def start_allreduce_mean(self, x: torch.Tensor, *, step: int = 0) -> RoundHandle[torch.Tensor]:
        """One ``all_reduce`` (sum) of a copy of ``x``'s row, divided by n in ``wait``."""
        t0 = time.perf_counter()
        # float32 on the wire, as the gRPC plane sends it (same bytes, same counters)
        buf = x[0].detach().to(device=self.device, dtype=torch.float32).clone()
        try:
            work = dist.all_reduce(buf, op=dist.ReduceOp.SUM, async_op=True)
        except RuntimeError as exc:
            raise TorchPlaneError(f"peer {self.rank}: all_reduce failed to start: {exc}") from exc
        started = time.perf_counter()
        self.breakdown.encode_ms += (started - t0) * 1e3
        others = [j for j in range(self.n) if j != self.rank]
        r = _TorchRound(
            started=started,
            step=step + self.step_base,
            round=0,
            tensor_id=TENSOR_ALLREDUCE,
            edges=[(self.rank, j) for j in others],
            receive_from=[],
            raw=buf.numel() * buf.element_size(),
            wire=buf.numel() * buf.element_size(),
            works=[work] if work is not None else [],
        )

        def average(received: Received) -> torch.Tensor:
            return (buf / self.n).to(device=x.device, dtype=x.dtype).unsqueeze(0)

        return RoundHandle(self, r, average)

    def exchange(
        self,
        outgoing: Mapping[Edge, torch.Tensor],
        incoming: Sequence[Edge],
        *,
        step: int = 0,
        round: int = 0,
    ) -> dict[Edge, torch.Tensor]:
        """Per-edge messages: every header first (the receivers learn each payload's length),
        then every payload, each phase one batch of sends and receives."""
        for src, _ in outgoing:
            if src != self.rank:
                raise ValueError(f"edge from {src}: this peer is {self.rank}")
        t0 = time.perf_counter()
        wire_step = step + self.step_base
        sends = {
            dst: t.detach().to(device=self.device, dtype=torch.float32).contiguous().view(-1)
            for (_, dst), t in outgoing.items()
        }
        sources = [src for src, dst in incoming if dst == self.rank]
        sent_headers = {
            dst: self._header(wire_step, round, TENSOR_EDGE, 4 * t.numel(), None)
            for dst, t in sends.items()
        }
        headers = {j: torch.empty(HEADER, dtype=torch.int64, device=self.device) for j in sources}
        ops = [dist.P2POp(dist.isend, h, dst, tag=_TAG_HEADER) for dst, h in sent_headers.items()]
        ops += [dist.P2POp(dist.irecv, h, j, tag=_TAG_HEADER) for j, h in headers.items()]
        what = f"per-edge round {round} of step {wire_step}"
        self._wait(self._run(ops, what), what)
        lengths = {
            j: self._check_header(wire_step, round, TENSOR_EDGE, j, h, None)[1] // 4
            for j, h in headers.items()
        }
        received = {
            j: torch.empty(n, dtype=torch.float32, device=self.device) for j, n in lengths.items()
        }
        ops = [dist.P2POp(dist.isend, t, dst, tag=_TAG_PAYLOAD) for dst, t in sends.items()]
        ops += [dist.P2POp(dist.irecv, t, j, tag=_TAG_PAYLOAD) for j, t in received.items()]
        self._wait(self._run(ops, what), what)
        self.breakdown.wait_ms += (time.perf_counter() - t0) * 1e3
        for dst, t in sends.items():
            self.counters.add_edges([(self.rank, dst)], raw=4 * t.numel(), wire=4 * t.numel())
        out: dict[Edge, torch.Tensor] = {}
        for src, dst in incoming:
            got = received.get(src)
            if got is None:
                continue
            try:
                check_values(
                    {"values": got},
                    (PartSpec("values", torch.float32, got.numel(), 0),),
                    self.max_abs_value,
                )
            except RejectedError as exc:
                log.warning("torch_plane.rejected", sender=src, step=wire_step, reason=exc.detail)
                continue
            out[(src, dst)] = got
        return out
