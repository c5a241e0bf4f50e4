"""Local optimizer, all-reduce and D-SGD against their definitions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from concord.core.algorithms import LocalSGD, SGDConfig, StepContext, make_algorithm
from concord.core.control.consensus import consensus_distance
from concord.core.control.plan import Phase
from concord.core.graphs.topology import make_schedule
from concord.core.registry import UnknownNameError
from concord.sim.vectorized import VectorizedComm

torch.set_num_threads(1)


@pytest.mark.parametrize(
    ("momentum", "nesterov", "wd"), [(0.0, False, 0.0), (0.9, True, 1e-2), (0.5, False, 1e-3)]
)
def test_local_sgd_matches_torch_sgd(momentum: float, nesterov: bool, wd: float) -> None:
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(3, 7, generator=gen, dtype=torch.float64)
    grads = [torch.randn(3, 7, generator=gen, dtype=torch.float64) for _ in range(5)]
    ours = x0.clone()
    opt = LocalSGD(SGDConfig(momentum=momentum, nesterov=nesterov, weight_decay=wd))
    ref = torch.nn.Parameter(x0.clone())
    torch_opt = torch.optim.SGD(
        [ref], lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=wd
    )
    for g in grads:
        opt.step(ours, g, 0.1)
        ref.grad = g.clone()
        torch_opt.step()
    # float64 and the same operation order up to associativity: 1e-12 is round-off
    torch.testing.assert_close(ours, ref.detach(), rtol=1e-12, atol=1e-12)


def test_decay_mask_skips_masked_coordinates() -> None:
    x = torch.ones(2, 4, dtype=torch.float64)
    mask = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    opt = LocalSGD(SGDConfig(momentum=0.0, nesterov=False, weight_decay=0.5), mask)
    opt.step(x, torch.zeros_like(x), lr=1.0)
    assert x[0].tolist() == [0.5, 0.5, 1.0, 1.0]


def test_sgd_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="momentum"):
        SGDConfig(momentum=1.0)
    with pytest.raises(ValueError, match="weight_decay"):
        SGDConfig(weight_decay=-1)
    with pytest.raises(UnknownNameError, match=r"valid: .*allreduce, .*choco, .*dsgd"):
        make_algorithm("adam-gossip", LocalSGD(SGDConfig()))


def _ctx(
    step: int, lr: float, comm: VectorizedComm, mode: str, rounds_done: int = 0
) -> StepContext:
    sched = make_schedule("ring", comm.n)
    phase = Phase(
        index=1,
        start=0,
        end=10**9,
        mode=mode,
        topology=None,  # type: ignore[arg-type]
        controlled=False,
    )
    return StepContext(
        step=step, lr=lr, phase=phase, comm=comm, matrix=sched.matrix, round_offset=rounds_done
    )


def test_allreduce_keeps_replicas_identical() -> None:
    n, d = 6, 5
    comm = VectorizedComm(n)
    algo = make_algorithm("allreduce", LocalSGD(SGDConfig(momentum=0.9, weight_decay=0)))
    x = torch.zeros(n, d, dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    for t in range(5):
        algo.step(
            x, torch.randn(n, d, generator=gen, dtype=torch.float64), _ctx(t, 0.1, comm, "exact")
        )
        assert consensus_distance(x) < 1e-12  # exact averaging: only round-off remains
    assert comm.counters.bytes_wire == 5 * 2 * (n - 1) * d * 8


def test_dsgd_gossip_preserves_mean_and_counts_bytes() -> None:
    n, d = 8, 3
    comm = VectorizedComm(n)
    algo = make_algorithm("dsgd", LocalSGD(SGDConfig(momentum=0.0, nesterov=False, weight_decay=0)))
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    mean_before = x.mean(0)
    report = algo.step(x, torch.zeros(n, d, dtype=torch.float64), _ctx(0, 0.1, comm, "gossip"))
    assert report.rounds == 1
    torch.testing.assert_close(x.mean(0), mean_before, rtol=0, atol=1e-14)  # W doubly stochastic
    assert comm.counters.bytes_wire == 2 * n * d * 8  # ring: 2 messages per peer


def test_dsgd_converges_on_heterogeneous_quadratic() -> None:
    """f_i(x) = ½‖x − b_i‖²: the optimum of the average is b̄. With a decaying step size D-SGD
    drives every replica to b̄ despite heterogeneous b_i (ring, n = 16)."""
    n, d = 16, 4
    rng = np.random.default_rng(0)
    b = torch.as_tensor(rng.normal(size=(n, d)), dtype=torch.float64)
    comm = VectorizedComm(n)
    algo = make_algorithm("dsgd", LocalSGD(SGDConfig(momentum=0.0, nesterov=False, weight_decay=0)))
    x = torch.zeros(n, d, dtype=torch.float64)
    steps = 4000
    for t in range(steps):
        lr = 0.5 / (1 + t / 5)
        algo.step(x, x - b, _ctx(t, lr, comm, "gossip", rounds_done=t))
    err = (x - b.mean(0)).norm(dim=1).max().item()
    # the consensus error of D-SGD scales like lr·ζ/(1 − λ₂); lr has decayed to ~6e-4 and
    # 1 − λ₂ ≈ 0.05, so every replica is within ~1e-2 of the optimum (the start was ~1 away)
    assert err < 2e-2
    assert (x.mean(0) - b.mean(0)).norm() < 1e-8  # the mean follows exact GD on f̄
