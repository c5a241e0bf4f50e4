"""Overlap (``overlap = true``): the combine-then-adapt step x^{t+1} = C x^t − η·u(∇f(x^t)) of
every algorithm that admits it, against its definition, on the vectorized `Comm`; the handle API
of that engine; the config switch and the catalog trait.

Tolerances: float64 everywhere; 1e-12 absolute is round-off of a few additions of O(1) values.
"""

from __future__ import annotations

import pytest
import torch

from concord.core.algorithms import (
    CATALOG,
    LocalSGD,
    SGDConfig,
    StepContext,
    StepReport,
    make_algorithm,
)
from concord.core.algorithms.base import Algorithm
from concord.core.algorithms.catalog import overlap_algorithms
from concord.core.comm import Completed
from concord.core.config import ConfigError, load_config
from concord.core.control.plan import Phase
from concord.core.graphs.topology import make_schedule
from concord.sim.vectorized import VectorizedComm

torch.set_num_threads(1)
N, D, LR = 6, 5, 0.1
ATOL = 1e-12  # float64 round-off (module docstring)


def _phase(mode: str) -> Phase:
    return Phase(index=1, start=0, end=10**9, mode=mode, topology=None, controlled=False)  # type: ignore[arg-type]


def _ctx(comm: VectorizedComm, mode: str = "gossip", step: int = 0) -> StepContext:
    sched = make_schedule("ring", comm.n)
    return StepContext(step=step, lr=LR, phase=_phase(mode), comm=comm, matrix=sched.matrix)


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=gen, dtype=torch.float64)
    return x, torch.randn(N, D, generator=gen, dtype=torch.float64)


def _sgd() -> SGDConfig:
    return SGDConfig(momentum=0.9, nesterov=True, weight_decay=0.01)


def _ring() -> torch.Tensor:
    return torch.tensor(make_schedule("ring", N).matrix(0))


def _overlapped(
    algo: Algorithm, x: torch.Tensor, grad: torch.Tensor, ctx: StepContext
) -> StepReport:
    """One step as `concord.core.loop.StepRunner` runs it with overlap on."""
    algo.start(x, ctx)
    assert ctx.inflight is not None
    return algo.step(x, grad, ctx)


def test_overlapped_dsgd_mixes_x_t_then_takes_the_local_step() -> None:
    x, grad = _data()
    x0 = x.clone()
    algo = make_algorithm("dsgd", LocalSGD(_sgd()))
    report = _overlapped(algo, x, grad, _ctx(VectorizedComm(N)))
    # the direction is the local optimizer's at x^t (weight decay of x^t): a fresh optimizer
    direction = LocalSGD(_sgd()).direction(x0, grad)
    torch.testing.assert_close(x, _ring() @ x0 - LR * direction, rtol=0, atol=ATOL)
    mixed = _ring() @ x0
    assert report.rounds == 1
    # θ of the overlapped round is the statistic of x^t: ‖(W x^t)_i − x_i^t‖²
    torch.testing.assert_close(
        report.theta_local,
        ((mixed - x0) ** 2).sum(1),
        rtol=0,
        atol=ATOL,
    )


def test_overlap_moves_the_mean_by_the_mean_update_only() -> None:
    x, grad = _data(1)
    algo = make_algorithm("dsgd", LocalSGD(SGDConfig(momentum=0.0, nesterov=False, weight_decay=0)))
    mean = x.mean(0)
    _overlapped(algo, x, grad, _ctx(VectorizedComm(N)))
    torch.testing.assert_close(x.mean(0), mean - LR * grad.mean(0), rtol=0, atol=ATOL)


class _Twice:
    """Repeat once after the first round; record what the controller was shown."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def after_round(self, round_index: int, x: torch.Tensor, theta_local: torch.Tensor) -> bool:
        self.seen.append((round_index, x.clone(), theta_local.clone()))
        return round_index < 2


def test_repeat_rounds_follow_the_local_step_and_mix_the_updated_model() -> None:
    """Barrier control with overlap: round 1 is the overlapped mix of x^t; the controller is
    asked after the local update; round 2 mixes x^{t+½} = W x^t − η d (docs/algorithms.md)."""
    x, grad = _data(2)
    x0 = x.clone()
    control = _Twice()
    ctx = _ctx(VectorizedComm(N))
    ctx.control = control
    report = _overlapped(make_algorithm("dsgd", LocalSGD(_sgd())), x, grad, ctx)
    W = _ring()
    half = W @ x0 - LR * LocalSGD(_sgd()).direction(x0, grad)
    torch.testing.assert_close(x, W @ half, rtol=0, atol=ATOL)
    assert report.rounds == 2
    assert [r for r, _, _ in control.seen] == [1, 2]
    torch.testing.assert_close(control.seen[0][1], half, rtol=0, atol=ATOL)  # after the update
    torch.testing.assert_close(control.seen[0][2], ((W @ x0 - x0) ** 2).sum(1), rtol=0, atol=ATOL)
    torch.testing.assert_close(
        control.seen[1][2], ((W @ half - half) ** 2).sum(1), atol=ATOL, rtol=0
    )
    assert ctx.inflight is None


def test_an_exact_phase_averages_x_t_then_steps() -> None:
    x, grad = _data(3)
    x0 = x.clone()
    report = _overlapped(
        make_algorithm("dsgd", LocalSGD(_sgd())), x, grad, _ctx(VectorizedComm(N), "exact")
    )
    want = x0.mean(0, keepdim=True) - LR * LocalSGD(_sgd()).direction(x0, grad)
    torch.testing.assert_close(x, want, rtol=0, atol=ATOL)
    assert report.exact_average


def test_overlapped_qgm_builds_its_buffer_from_the_net_change() -> None:
    x, grad = _data(4)
    x0 = x.clone()
    cfg = SGDConfig(momentum=0.9, nesterov=True, weight_decay=0.0)
    algo = make_algorithm("qgm", LocalSGD(cfg), beta=0.9)
    comm = VectorizedComm(N)
    algo.setup(x, comm)
    _overlapped(algo, x, grad, _ctx(comm))
    # m̂⁰ = 0: m = d = g, direction = d + β m = 1.9 g (Nesterov)
    torch.testing.assert_close(x, _ring() @ x0 - LR * 1.9 * grad, rtol=0, atol=ATOL)
    buffer = algo.state_dict()["qgm_buffer"]
    torch.testing.assert_close(buffer, (1 - 0.9) * (x0 - x) / LR, rtol=0, atol=1e-11)


@pytest.mark.parametrize("average", ["exact", "gossip"])
def test_overlapped_local_sgd_communicates_on_its_steps_only(average: str) -> None:
    x, grad = _data(5)
    cfg = SGDConfig(momentum=0.0, nesterov=False, weight_decay=0.0)
    algo = make_algorithm("local-sgd", LocalSGD(cfg), local_steps=2, average=average)
    comm = VectorizedComm(N)
    ctx = _ctx(comm, step=0)
    algo.start(x, ctx)  # step 0 of H = 2: local only, nothing started
    assert ctx.inflight is None
    x0 = x.clone()
    report = algo.step(x, grad, ctx)
    torch.testing.assert_close(x, x0 - LR * grad, rtol=0, atol=ATOL)
    assert report.rounds == 0
    assert not report.exact_average
    assert comm.counters.bytes_wire == 0
    x1 = x.clone()
    report = _overlapped(algo, x, grad, _ctx(comm, step=1))
    C = torch.full((N, N), 1.0 / N, dtype=torch.float64) if average == "exact" else _ring()
    torch.testing.assert_close(x, C @ x1 - LR * grad, rtol=0, atol=ATOL)
    assert report.exact_average == (average == "exact")


def test_the_vectorized_handle_is_complete_when_returned_and_holds_the_mix() -> None:
    x, _ = _data(6)
    comm = VectorizedComm(N)
    W = make_schedule("ring", N).matrix(0)
    handle = comm.start_mix(x, W, step=0, round=0)
    assert isinstance(handle, Completed)
    assert handle.done()
    torch.testing.assert_close(handle.wait().x, _ring() @ x, rtol=0, atol=ATOL)
    assert handle.wait() is handle.wait()  # a second wait: the same result
    average = comm.start_allreduce_mean(x, step=0)
    assert average.done()
    torch.testing.assert_close(average.wait(), x.mean(0, keepdim=True).expand_as(x))
    assert comm.counters.rounds == 1


def test_overlap_is_declared_exactly_by_the_algorithms_that_start_their_exchange() -> None:
    admitted = set(overlap_algorithms())
    assert {"dsgd", "qgm", "local-sgd"} <= admitted
    for name, spec in CATALOG.items():
        overrides = spec.load().start is not Algorithm.start
        assert overrides == spec.overlap, name


@pytest.mark.parametrize("name", [n for n, s in CATALOG.items() if not s.overlap])
def test_an_algorithm_that_does_not_admit_overlap_refuses_the_switch(name: str) -> None:
    extra = {
        "choco": ["compression.codec=topk"],
        "sgp": ["topology=exponential-one-peer-directed"],
        "relaysgd": ["topology=chain"],
        "relaysgd-grad": ["topology=chain"],
    }.get(name, [])
    load_config(None, [f"algorithm={name}", "control.mode=none", *extra], environ={})  # valid
    with pytest.raises(ConfigError, match=rf"overlap: algorithm '{name}' does not admit overlap"):
        load_config(
            None, [f"algorithm={name}", "control.mode=none", "overlap=true", *extra], environ={}
        )
    algo = make_algorithm(name, LocalSGD(_sgd()), **_hyper(name))
    with pytest.raises(NotImplementedError, match=name):
        algo.start(torch.zeros(N, D), _ctx(VectorizedComm(N)))


def _hyper(name: str) -> dict[str, object]:
    if name == "choco":
        from concord.core.compress import make_codec

        return {"codec": make_codec("topk", ratio=0.5, seed=0), "gamma": 0.5}
    return {}


@pytest.mark.parametrize("name", overlap_algorithms())
def test_the_switch_is_accepted_for_every_algorithm_that_admits_it(name: str) -> None:
    cfg = load_config(None, [f"algorithm={name}", "overlap=true"], environ={})
    assert cfg.overlap
    assert cfg.to_dict()["overlap"] is True  # written to the run's config.toml
