"""One rank of `test_torch_plane.py`: ``python torch_plane_worker.py RANK N PORT OUT [DEVICE]``.

Joins a process group (tcp:// rendezvous, peer 0 hosts the store; gloo on ``cpu``, NCCL on
``cuda``), runs a fixed script of
`TorchComm` calls on rows that every rank can rebuild from the seed, and saves what it got to
``OUT/rank-RANK.pt`` (tensors only; the test loads it with ``weights_only=True``)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from concord.core.compress import make_codec
from concord.core.config import build_config
from concord.peer.torch_plane import TorchComm, TorchPlane, _TorchRound

D = 1000


def rows(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, D, generator=torch.Generator().manual_seed(seed))


def ring(n: int) -> np.ndarray:
    W = np.zeros((n, n))
    for i in range(n):
        W[i, i] = 0.5
        W[i, (i + 1) % n] += 0.25
        W[i, (i - 1) % n] += 0.25
    return W


def directed(n: int) -> np.ndarray:
    """Column-stochastic: keep ½, push ½ to i + 1 (push-sum)."""
    W = np.zeros((n, n))
    for i in range(n):
        W[i, i] += 0.5
        W[(i + 1) % n, i] += 0.5
    return W


def main() -> None:
    rank, n, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    kind = sys.argv[5] if len(sys.argv) > 5 else "cpu"
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if kind == "cuda" else "cpu")
    torch.set_num_threads(1)
    cfg = build_config(
        {
            "peers": n,
            "network": {"transport": "torch", "torch": {"init": f"tcp://127.0.0.1:{port}"}},
        }
    )
    plane = TorchPlane(cfg, rank, device, "test")
    plane.connect(None)
    comm = TorchComm(plane)
    got: dict[str, torch.Tensor] = {}
    x = rows(n, 0)[rank : rank + 1].to(device)
    got["mix"] = comm.mix(x, ring(n), step=1, round=1).x
    for name in ("topk", "int8", "bf16"):
        codec = make_codec(name, ratio=0.1, levels=16)
        got[f"mix-{name}"] = comm.mix(x, ring(n), codec=codec, step=2, round=2).x
    push = torch.tensor([1.0 + rank], dtype=torch.float64)  # (on the CPU, as algorithms keep it)
    res = comm.mix(x, directed(n), step=3, round=3, push=push)
    got["push-x"], got["push-w"] = res.x, res.push if res.push is not None else torch.zeros(1)
    handle = comm.start_mix(x, ring(n), step=4, round=4)
    got["overlap"] = handle.wait().x
    got["mean"] = comm.allreduce_mean(x, step=5)
    got["mean-scalar"] = torch.tensor(
        [comm.mean_scalar(torch.tensor([float(rank)], device=device))]
    )
    # per-edge messages of different lengths: rank i sends i + 1 + j values to j
    outgoing = {
        (rank, j): torch.full((rank + 1 + j,), float(10 * rank + j), device=device)
        for j in range(n)
        if j != rank
    }
    incoming = [(j, rank) for j in range(n) if j != rank]
    for (src, _), t in sorted(comm.exchange(outgoing, incoming, step=6, round=6).items()):
        got[f"edge-{src}"] = t
    # a neighbour's non-finite tensor is rejected, the mix renormalises over the others
    bad = x.clone()
    if rank == 1:
        bad[0, 3] = float("nan")
    res = comm.mix(bad, ring(n), step=7, round=7)
    got["nan-x"] = res.x
    got["nan-rejected"] = torch.tensor([j for j, _ in res.outcome.rejected[0]], dtype=torch.int64)
    # receive buffers of finished rounds are reused (`TorchComm._release`): the next round
    # receives new values into the very buffers that held the rejected NaN
    before = {b.data_ptr() for b in comm._free[(torch.uint8, 4 * D)]}
    handle = comm.start_mix(rows(n, 1)[rank : rank + 1].to(device), ring(n), step=8, round=8)
    assert isinstance(handle.round, _TorchRound)
    reused = {b.data_ptr() for b in handle.round.payloads.values()} == before
    got["mix-again"] = handle.wait().x
    got["reused"] = torch.tensor([reused and len(before) == 2])
    got["bytes"] = torch.tensor([comm.counters.bytes_wire, comm.counters.messages])
    got["backend"] = torch.tensor([plane.backend == "nccl"])
    torch.save({k: v.cpu() for k, v in got.items()}, out / f"rank-{rank}.pt")
    plane.close()


if __name__ == "__main__":
    main()
