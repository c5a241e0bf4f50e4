"""`TorchComm` (``network.transport = "torch"``) in real processes over gloo: every `Comm` call
gives what the in-memory engine computes for the same rows (`VectorizedComm`), headers and
codecs included; per-edge messages of any length; a non-finite tensor is rejected and the mix
renormalised, as on gRPC. Tolerance 1e-6 (float32: gloo moves the bytes unchanged; only the
all-reduce sums in another order than the in-memory mean)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from concord.core.compress import make_codec
from concord.sim.vectorized import VectorizedComm
from tests.peer.torch_plane_worker import D, directed, ring, rows

WORKER = Path(__file__).parent / "torch_plane_worker.py"
N = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(tmp_path: Path, device: str) -> list[dict[str, torch.Tensor]]:
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(r), str(N), str(port), str(tmp_path), device],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(N)
    ]
    outputs = []
    for p in procs:
        out, _ = p.communicate(timeout=180)
        outputs.append(out)
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} failed:\n{outputs[r]}"
    return [torch.load(tmp_path / f"rank-{r}.pt", weights_only=True) for r in range(N)]


def _check(got: list[dict[str, torch.Tensor]]) -> None:
    X = rows(N, 0)
    vec = VectorizedComm(N)
    tol = {"atol": 1e-6, "rtol": 1e-6}
    expected = {"mix": vec.mix(X, ring(N), step=1, round=1).x}
    for name in ("topk", "int8", "bf16"):
        codec = make_codec(name, ratio=0.1, levels=16)
        expected[f"mix-{name}"] = vec.mix(X, ring(N), codec=codec, step=2, round=2).x
    weights = torch.tensor([1.0 + i for i in range(N)], dtype=torch.float64)
    push = vec.mix(X, directed(N), step=3, round=3, push=weights)
    assert push.push is not None
    expected["overlap"] = expected["mix"]
    expected["mix-again"] = vec.mix(rows(N, 1), ring(N), step=8, round=8).x
    for r in range(N):
        g = got[r]
        for key, want in expected.items():
            torch.testing.assert_close(g[key][0], want[r], **tol, msg=f"{key} of rank {r}")
        torch.testing.assert_close(g["push-x"][0], push.x[r], **tol)
        assert float(g["push-w"][0]) == pytest.approx(float(push.push[r]), abs=1e-12)
        torch.testing.assert_close(g["mean"][0], X.mean(0), **tol)
        assert float(g["mean-scalar"][0]) == pytest.approx((N - 1) / 2, abs=1e-12)
        for j in range(N):
            if j != r:  # j sent j + 1 + r copies of 10 j + r to r
                torch.testing.assert_close(g[f"edge-{j}"], torch.full((j + 1 + r,), 10.0 * j + r))
        # rank 1's tensor holds a NaN: its ring neighbours 0 and 2 reject it and renormalise
        W = ring(N)
        if r in (0, 2):
            assert g["nan-rejected"].tolist() == [1]
            want = (W[r, r] * X[r] + W[r, 3] * X[3]) / (W[r, r] + W[r, 3])  # 3: the other one
            torch.testing.assert_close(g["nan-x"][0], want, **tol)
        else:
            assert g["nan-rejected"].tolist() == []
        assert bool(g["reused"][0]), f"rank {r} allocated new receive buffers"
        # messages: 7 mixes to two ring neighbours, the push round to one, two all-reduces
        # (the vector, the scalar) over 3 edges, 3 per-edge messages; and their bytes: float32
        # payloads of D values, top-k's (k values + k indices), int8's (scale + D), bf16's
        assert int(g["bytes"][1]) == 7 * 2 + 1 + 2 * 3 + 3
        k = int(0.1 * D + 0.999999)
        wire = 4 * D * (4 * 2 + 1 + 3) + 2 * (8 * k + (4 + D) + 2 * D) + 4 * 3
        wire += 4 * sum(r + 1 + j for j in range(N) if j != r)
        assert int(g["bytes"][0]) == wire


def test_every_comm_call_over_gloo_matches_the_in_memory_engine(tmp_path: Path) -> None:
    got = _run(tmp_path, "cpu")
    assert not any(bool(g["backend"][0]) for g in got)  # gloo
    _check(got)


@pytest.mark.skipif(
    torch.cuda.device_count() < N,
    reason=f"GPU path: NCCL needs a CUDA device per rank ({N}); this machine has "
    f"{torch.cuda.device_count()}",
)
def test_nccl_every_comm_call_matches_the_in_memory_engine(tmp_path: Path) -> None:
    got = _run(tmp_path, "cuda")
    assert all(bool(g["backend"][0]) for g in got)  # NCCL
    _check(got)


TwoRanks = Callable[..., list[dict[str, str]]]


@pytest.fixture
def two_ranks(tmp_path: Path) -> TwoRanks:
    """Runs a script as ranks 0 and 1 of a 2-process gloo group — ``run(script, *args)``, the
    script getting ``rank port *args`` — and returns each rank's output lines as ``{first word:
    the rest}`` (with the whole output under ``""``), after checking that both exited 0."""

    def run(script_text: str, *args: str) -> list[dict[str, str]]:
        script = tmp_path / "ranks.py"
        script.write_text(script_text)
        port = _free_port()
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), str(r), str(port), *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for r in range(2)
        ]
        outputs = [p.communicate(timeout=120)[0] for p in procs]
        for r, p in enumerate(procs):
            assert p.returncode == 0, f"rank {r} failed:\n{outputs[r]}"
        return [
            {"": out} | {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.splitlines()}
            for out in outputs
        ]

    return run


DIVERGED = """
import sys
import numpy as np
import torch
from concord.core.config import build_config
from concord.peer.torch_plane import HEADER_BYTES, TorchComm, TorchPlane, TorchPlaneError

rank, port = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(1)
cfg = build_config({"peers": 2, "network": {"transport": "torch",
                    "torch": {"init": f"tcp://127.0.0.1:{port}"}}})
plane = TorchPlane(cfg, rank, torch.device("cpu"), "test")
plane.connect(None)
comm = TorchComm(plane)
W = np.full((2, 2), 0.5)
x = torch.full((1, 10), float(rank))
handle = comm.start_mix(x, W, step=3, round=1)
# one message each way: the header region, then the payload
print("sizes", handle.round.sent.numel(), handle.round.payloads[1 - rank].numel(), HEADER_BYTES)
print("agreed", handle.wait().x[0, 0].item())
try:
    comm.mix(x, W, step=4 + rank, round=2)  # rank 1 is one step ahead
except TorchPlaneError as exc:
    print("error", exc)
plane.close()
"""


def test_a_round_is_one_message_whose_header_catches_diverged_peers(two_ranks: TwoRanks) -> None:
    """Two ranks mix once in agreement (a message: 64-byte header, then the 40 payload bytes),
    then post the same tensor for different steps: each rank's check of the header that came
    with the payload fails with `TorchPlaneError` naming its own round and the neighbour's."""
    for r, lines in enumerate(two_ranks(DIVERGED)):
        out = lines[""]
        assert lines["sizes"] == "104 104 64", out
        assert float(lines["agreed"]) == 0.5  # (0 + 1) / 2, exact in float32
        mine, theirs = 4 + r, 5 - r
        assert lines["error"].startswith(f"peer {r} expected tensor"), out
        assert f"of step {mine} round 2" in lines["error"]
        assert f"from peer {1 - r} and got tensor" in lines["error"]
        assert f"of step {theirs} round 2" in lines["error"]
        assert "diverged" in lines["error"]


VERSIONS = """
import sys
import numpy as np
import torch
from concord.core.config import build_config
from concord.peer import torch_plane
from concord.peer.torch_plane import TorchComm, TorchPlane, TorchPlaneError

rank, port, where = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(1)
cfg = build_config({"peers": 2, "network": {"transport": "torch",
                    "torch": {"init": f"tcp://127.0.0.1:{port}", "timeout": 20.0}}})
plane = TorchPlane(cfg, rank, torch.device("cpu"), "test")
if where == "connect" and rank == 1:
    torch_plane.TORCH_PLANE_VERSION = 1  # a peer of another message format
try:
    plane.connect(None)
    if where == "header":  # agreed at the rendezvous; rank 1 then sends another format
        if rank == 1:
            torch_plane.TORCH_PLANE_VERSION = 3
        TorchComm(plane).mix(torch.ones(1, 10), np.full((2, 2), 0.5), step=1, round=1)
    print("error none")
except TorchPlaneError as exc:
    print("error", exc)
print("connected", plane.connected)
plane.close()
"""


@pytest.mark.parametrize("where", ["connect", "header"])
def test_peers_of_another_message_format_fail_with_both_versions(
    two_ranks: TwoRanks, where: str
) -> None:
    """A peer whose torch plane message format (`TORCH_PLANE_VERSION`) differs is refused by
    every peer at the rendezvous, with the run's lowest and highest versions in the error and
    the group left; a message of another format (past the rendezvous) fails the round with
    `TorchPlaneError` naming the sender's format and the receiver's."""
    for r, lines in enumerate(two_ranks(VERSIONS, where)):
        out = lines[""]
        error = lines["error"]
        if where == "connect":
            mine = 1 if r == 1 else 2
            assert error.startswith(f"peer {r} speaks torch data plane message format {mine}")
            assert "the run's peers speak formats 1 to 2" in error, out
            assert lines["connected"] == "False", out
        else:
            mine, theirs = (2, 3) if r == 0 else (3, 2)
            assert error.startswith(
                f"peer {r} got a message in torch data plane format {theirs} from peer {1 - r}"
            ), out
            assert f"this peer speaks format {mine}" in error, out
