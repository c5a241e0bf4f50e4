"""In-memory communication for the vectorized engine: all n replicas live in one [n, d] tensor.

Gossip is a (sparse, when W is sparse) matrix product, exact averaging is a mean over dim 0, and
per-edge messages are a dictionary hand-over. Bytes are accounted as the real system would send
them, so `summary.json` reports comparable traffic for both engines:

* gossip round: one d-vector per directed edge (i → j, W[j, i] > 0, i ≠ j);
* per-edge messages (`exchange`): each message on its directed edge;
* exact averaging: a ring all-reduce, 2(n − 1)/n · d elements per replica.

The non-blocking exchange of `Comm` (``overlap = true``: `Comm.start_mix`,
`Comm.start_allreduce_mean`) is the base class's: the round is computed when it is started and
its handle is complete at once — there is no wire to overlap with the computation here.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from concord.core.comm import Comm, CommCounters, Edge, MixOutcome, MixResult
from concord.core.compress import codec_key

if TYPE_CHECKING:
    from concord.core.compress import Codec


_SPARSE_BELOW = 0.25  # use a sparse product when W has fewer nonzeros than this fraction …
_SPARSE_FROM_N = 128  # … and is big enough for the sparse kernel to beat a dense one


class VectorizedComm(Comm):
    def __init__(self, n: int, *, device: torch.device | str = "cpu") -> None:
        self.n = n
        self.device = torch.device(device)
        self.counters = CommCounters()
        self._cache: dict[int, tuple[np.ndarray, torch.Tensor, list[Edge]]] = {}
        # results of `mix` handed back by `release`, reused as later rounds' outputs
        self._spare: list[torch.Tensor] = []
        self._lent: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()

    @property
    def world_size(self) -> int:
        return self.n

    @property
    def ranks(self) -> Sequence[int]:
        return range(self.n)

    def _operator(self, W: np.ndarray, x: torch.Tensor) -> tuple[torch.Tensor, list[Edge]]:
        """W as a torch operator (cached per matrix object) and its directed edges j → i."""
        hit = self._cache.get(id(W))
        if hit is not None and hit[0] is W and hit[1].dtype == x.dtype:
            return hit[1], hit[2]
        if W.shape != (self.n, self.n):
            raise ValueError(f"mixing matrix has shape {W.shape}; this run has n = {self.n}")
        dst, src = np.nonzero(W)
        edges = [(int(j), int(i)) for i, j in zip(dst, src, strict=True) if i != j]
        dense = torch.tensor(W, dtype=x.dtype, device=x.device)  # W is a read-only cached array
        op = dense
        if self.n >= _SPARSE_FROM_N and np.count_nonzero(W) < _SPARSE_BELOW * W.size:
            with warnings.catch_warnings():  # "sparse CSR support is in beta"
                warnings.simplefilter("ignore", UserWarning)
                op = dense.to_sparse_csr()
        if len(self._cache) > 256:  # random schedules produce a new matrix every round
            self._cache.clear()
        self._cache[id(W)] = (W, op, edges)
        return op, edges

    def mix(
        self,
        x: torch.Tensor,
        W: np.ndarray,
        *,
        codec: Codec | None = None,
        step: int = 0,
        round: int = 0,
        push: torch.Tensor | None = None,
    ) -> MixResult:
        op, edges = self._operator(W, x)
        d = x.shape[1]
        raw = d * x.element_size()
        if codec is None:
            sent, wire = x, raw
        else:
            keys = [codec_key(r, round) for r in range(self.n)]
            sent = codec.roundtrip(x, keys=keys).to(x.dtype)
            wire = codec.wire_bytes(d)
        out = self._output(x, sent)
        # addmm with beta = 0 ignores out's old contents; mm(out=) with a sparse operand would
        # compute into a fresh zeroed [n, d] tensor and copy that over
        torch.addmm(out, op, sent, beta=0, out=out)
        self.counters.add_edges(edges, raw=raw, wire=wire)
        self.counters.rounds += 1
        mixed = None
        if push is not None:  # every message arrives here: Σ_j W[i, j] w_j in float64
            mixed = torch.from_numpy(np.asarray(W, dtype=np.float64) @ push.cpu().numpy())
        return MixResult(x=out, outcome=MixOutcome(), sent=sent, push=mixed)

    def _output(self, x: torch.Tensor, sent: torch.Tensor) -> torch.Tensor:
        """The [n, d] result tensor of a round: a released one that fits and holds neither
        input, else a new one."""
        inputs = {x.untyped_storage().data_ptr(), sent.untyped_storage().data_ptr()}
        for i, t in enumerate(self._spare):
            fits = (t.shape, t.dtype, t.device) == (x.shape, x.dtype, x.device)
            if fits and t.untyped_storage().data_ptr() not in inputs:
                out = self._spare.pop(i)
                break
        else:
            out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        self._lent[id(out)] = out
        return out

    def release(self, result: MixResult) -> None:
        t = result.x
        if self._lent.get(id(t)) is t:  # one of this Comm's results, not a caller's tensor
            del self._lent[id(t)]
            self._spare = [t, *self._spare[:1]]  # two at most

    def allreduce_mean(self, x: torch.Tensor, *, step: int = 0) -> torch.Tensor:
        if self.n > 1 and x.shape[1] > 1:  # scalar reductions (statistics) are not traffic
            elements = 2 * (self.n - 1) * x.shape[1]
            self.counters.add(
                raw=elements * x.element_size(),
                wire=elements * x.element_size(),
                messages=2 * (self.n - 1) * self.n,
            )
        return x.mean(dim=0, keepdim=True).expand_as(x)

    def exchange(
        self,
        outgoing: Mapping[Edge, torch.Tensor],
        incoming: Sequence[Edge],
        *,
        step: int = 0,
        round: int = 0,
    ) -> dict[Edge, torch.Tensor]:
        got = {e: outgoing[e] for e in incoming if e in outgoing}
        for edge, t in outgoing.items():  # per directed edge, like a peer's edges table
            nbytes = t.numel() * t.element_size()
            self.counters.add_edges([edge], raw=nbytes, wire=nbytes)
        return got
