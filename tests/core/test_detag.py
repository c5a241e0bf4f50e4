"""DeTAG / DeTAGM / DeTAG* and DSGT (`concord.core.algorithms.detag`): the accelerated gossip alone,
the algorithms against direct transcriptions of Lu & De Sa's Algorithm 2 and of the classical DSGT
recursion (float64 round-off), their invariants, round indices, phases, state and hyperparameter
errors, and the label-sorted reproduction of docs/algorithms.md#reproduction-targets on a convex
problem."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pytest
import torch

from concord.core.algorithms import Algorithm, LocalSGD, SGDConfig, StepContext, make_algorithm
from concord.core.algorithms.detag import DeTAG, accelerated_eta, group_contraction
from concord.core.compress import make_codec
from concord.core.config import ConfigError, load_config
from concord.core.control.plan import Phase
from concord.core.data.partition import sorted_partition
from concord.core.graphs.topology import make_schedule
from concord.core.loop import check_algorithm
from concord.sim.vectorized import VectorizedComm
from tests.spies import SpyComm

torch.set_num_threads(1)
GOSSIP = Phase(index=1, start=0, end=10**9, mode="gossip", topology=None, controlled=False)
EXACT = Phase(index=1, start=0, end=10**9, mode="exact", topology=None, controlled=False)
F64 = torch.float64
# float64 round-off of O(1) values over ≤ 40 steps of a few dozen flops each is ~1e-14; these
# tests compare different association orders of the same arithmetic
ROUNDOFF = 1e-12


def _sgd(momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False) -> LocalSGD:
    return LocalSGD(SGDConfig(momentum=momentum, nesterov=nesterov, weight_decay=weight_decay))


def _ring(n: int, kappa: float = 1.0) -> Callable[[int], np.ndarray]:
    return make_schedule("ring", n, kappa=kappa).matrix


class Runner:
    """Steps one algorithm on [n, d] float64 replicas with a fixed schedule."""

    def __init__(
        self,
        name: str,
        x0: torch.Tensor,
        *,
        optimizer: LocalSGD | None = None,
        matrix: Callable[[int], np.ndarray] | None = None,
        **hyper: object,
    ) -> None:
        n = x0.shape[0]
        self.comm = SpyComm(n)
        self.algo: Algorithm = make_algorithm(name, optimizer or _sgd(), **hyper)
        self.matrix = matrix or _ring(n)
        self.x = x0.clone()
        self.algo.setup(self.x, self.comm)
        self.rounds = 0

    def step(
        self, t: int, grad: torch.Tensor, lr: float = 0.1, phase: Phase = GOSSIP, **kw: object
    ) -> int:
        ctx = StepContext(
            step=t,
            lr=lr,
            phase=phase,
            comm=self.comm,
            matrix=self.matrix,
            round_offset=self.rounds,
            **kw,  # type: ignore[arg-type]
        )
        report = self.algo.step(self.x, grad, ctx)
        self.rounds += report.rounds
        return report.rounds


class Quadratics:
    """Heterogeneous quadratics f_i(x) = ½ xᵀ A_i x − b_iᵀ x (A_i ≻ 0), exact gradients."""

    def __init__(self, n: int, d: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        M = torch.randn(n, d, d, generator=gen, dtype=F64) / math.sqrt(d)
        self.A = M @ M.transpose(1, 2) + 0.5 * torch.eye(d, dtype=F64)
        self.b = torch.randn(n, d, generator=gen, dtype=F64)

    def grad(self, x: torch.Tensor) -> torch.Tensor:
        return (self.A @ x.unsqueeze(2)).squeeze(2) - self.b


def _x0(n: int, d: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, d, generator=gen, dtype=F64).expand(n, d).clone()


def _accelerated(W: torch.Tensor, z: torch.Tensor, rounds: int, eta: float) -> torch.Tensor:
    """Algorithm 3 transcribed: z_{−1} = z_0, z_{r+1} = (1 + η) W z_r − η z_{r−1}."""
    prev, cur = z, z
    for _ in range(rounds):
        prev, cur = cur, (1 + eta) * (W @ cur) - eta * prev
    return cur


# ---------------------------------------------------------------------------------------------
# Accelerated gossip (Algorithm 3)


def test_eta_from_lambda_and_the_live_groups() -> None:
    W = make_schedule("ring", 16).matrix(0)
    lam = 1 / 3 + 2 / 3 * math.cos(2 * math.pi / 16)  # λ₂ of the Metropolis ring (1/3 weights)
    assert group_contraction(W) == pytest.approx(lam, abs=1e-12)
    s = math.sqrt(1 - lam * lam)
    assert accelerated_eta(lam) == pytest.approx((1 - s) / (1 + s), abs=1e-15)
    assert accelerated_eta(0.0) == 0.0
    assert accelerated_eta(1.0) == 1.0
    with pytest.raises(ValueError, match=r"λ must be in \[0, 1\]"):
        accelerated_eta(1.5)
    # a schedule repaired after peers 3 and 9 left: identity rows, λ of the 14 live members
    live = [i for i in range(16) if i not in (3, 9)]
    repaired = np.eye(16)
    repaired[np.ix_(live, live)] = make_schedule("ring", 14).matrix(0)
    assert group_contraction(repaired) == pytest.approx(
        1 / 3 + 2 / 3 * math.cos(2 * math.pi / 14), abs=1e-12
    )
    assert group_contraction(np.eye(4)) == 0.0  # lone survivors: nothing to accelerate


def test_accelerated_gossip_contracts_like_one_minus_sqrt_gap_and_beats_plain_gossip() -> None:
    """Gossip alone (lr = 0, zero gradients) on a ring of 16: after R accelerated rounds with the
    η of λ (0.52), the disagreement is ≤ 3 (1 − √(1 − λ))^R of where it started (worst case:
    the slowest eigenvector; measured ratio to (1 − √(1 − λ))^R: 1.84, 1.77, 1.04 for R = 8, 16,
    32 — the heavy-ball iteration at its critical η has a polynomial prefactor, hence the 3),
    against λ^R for plain gossip: at R = 16, 0.030 vs 0.435 for the slowest mode and 0.012 vs
    0.16 for a random disagreement (asserted: at least 5× smaller). The mean is unchanged."""
    n, d = 16, 6
    W = make_schedule("ring", n).matrix(0)
    lam = group_contraction(W)
    V = np.linalg.eigh(W)[1]
    slowest = torch.tensor(V[:, -2:-1]).expand(n, d).clone()  # eigenvalue λ₂ = λ
    gen = torch.Generator().manual_seed(0)
    random = torch.randn(n, d, generator=gen, dtype=F64)

    def disagreement_after(x0: torch.Tensor, rounds: int, eta: float | None) -> float:
        run = Runner("detag", x0, rounds=rounds, eta=eta)
        assert run.step(0, torch.zeros(n, d, dtype=F64), lr=0.0) == rounds
        torch.testing.assert_close(run.x.mean(0), x0.mean(0), rtol=0, atol=ROUNDOFF)
        start = x0 - x0.mean(0)
        return float((run.x - run.x.mean(0)).norm() / start.norm())

    bound = 1 - math.sqrt(1 - lam)
    for rounds in (8, 16, 32):
        assert disagreement_after(slowest, rounds, None) <= 3 * bound**rounds, rounds
        assert disagreement_after(slowest, rounds, 0.0) == pytest.approx(lam**rounds, rel=1e-9)
    for x0 in (slowest, random):
        assert disagreement_after(x0, 16, None) <= disagreement_after(x0, 16, 0.0) / 5
    # and the algorithm's gossip is Algorithm 3 itself
    run = Runner("detag", random, rounds=5, eta=0.3)
    run.step(0, torch.zeros(n, d, dtype=F64), lr=0.0)
    expected = _accelerated(torch.tensor(W), random, 5, 0.3)
    torch.testing.assert_close(run.x, expected, rtol=0, atol=ROUNDOFF)


# ---------------------------------------------------------------------------------------------
# The recursions


def test_dsgt_is_the_classical_recursion() -> None:
    """x^{t+1} = W(x^t − η y^t), y^{t+1} = W y^t + g^{t+1} − g^t, y⁰ = g⁰ (plain SGD, exact
    gradients g^t = ∇f_i(x_i^t) of heterogeneous quadratics)."""
    n, d, lr = 8, 5, 0.1
    f = Quadratics(n, d)
    W = torch.tensor(_ring(n)(0))
    run = Runner("dsgt", _x0(n, d))
    x = _x0(n, d)
    g = f.grad(x)
    y = g.clone()
    for t in range(40):
        assert run.step(t, f.grad(run.x), lr) == 1
        x = W @ (x - lr * y)
        g_next = f.grad(x)
        y = W @ y + g_next - g
        g = g_next
        torch.testing.assert_close(run.x, x, rtol=0, atol=ROUNDOFF)


def _algorithm2(
    f: Quadratics,
    x0: torch.Tensor,
    W: torch.Tensor,
    steps: int,
    lr: float,
    *,
    rounds: int,
    eta: float,
    order: str,
    beta: float = 0.0,
) -> list[torch.Tensor]:
    """Lu & De Sa's Algorithm 2 (order "detag") and its DeTAG* reordering, transcribed with the
    communication copy x̃ and the tracker gossiped *separately*; with β > 0 the tracker tracks
    the heavy-ball buffer v ← β v + g (DeTAGM, Algorithm 4). Tracker initialised with the first
    phase's direction (y₀ = v₀, v₋₁ = v₀; module docstring)."""
    x = x0.clone()
    v = torch.zeros_like(x)
    y: torch.Tensor | None = None
    v_prev = torch.zeros_like(x)
    out = []
    for _ in range(steps):
        v = beta * v + f.grad(x) if beta else f.grad(x)
        if y is None:
            y, v_prev = v.clone(), v.clone()
        if order == "detag*":
            y = y + v - v_prev
        x_tilde = _accelerated(W, x, rounds, eta)
        y = _accelerated(W, y, rounds, eta)
        x = x_tilde - lr * y
        if order == "detag":
            y = y + v - v_prev
        v_prev = v
        out.append(x)
    return out


@pytest.mark.parametrize(
    ("order", "rounds", "eta", "beta"),
    [
        ("detag", 1, 0.0, 0.0),  # DSGT with the tracker one step older
        ("detag", 2, 0.2, 0.0),  # the paper's choice on label-sorted data (Table 3)
        ("detag", 3, 0.4, 0.9),  # DeTAGM
        ("detag*", 2, 0.2, 0.0),
        ("detag*", 4, 0.0, 0.9),  # the ImageNet setting (R = 4, η = 0), with momentum
    ],
)
def test_detag_is_algorithm_2(order: str, rounds: int, eta: float, beta: float) -> None:
    n, d, lr, steps = 8, 5, 0.05, 30
    f = Quadratics(n, d, seed=2)
    W = _ring(n, kappa=0.9)
    run = Runner(
        "detag",
        _x0(n, d),
        optimizer=_sgd(momentum=beta),
        matrix=W,
        rounds=rounds,
        eta=eta,
        order=order,
    )
    expected = _algorithm2(
        f, _x0(n, d), torch.tensor(W(0)), steps, lr, rounds=rounds, eta=eta, order=order, beta=beta
    )
    for t in range(steps):
        assert run.step(t, f.grad(run.x), lr) == rounds
        torch.testing.assert_close(run.x, expected[t], rtol=0, atol=ROUNDOFF)


def test_dsgt_is_gradient_tracking_at_a_constant_lr() -> None:
    """`gradient-tracking` (correction form, c = α(d − y)) and `dsgt` are the same recursion for
    any local optimizer at a constant lr — here Nesterov momentum and weight decay. With a
    varying lr they differ by design: the correction form tracks the update −α_t d, DSGT the
    direction d (the paper's α_k multiplies the tracker)."""
    pytest.importorskip("concord.core.algorithms.gradient_tracking")
    n, d = 8, 5
    f = Quadratics(n, d, seed=3)

    def trajectory(name: str, lrs: Sequence[float]) -> torch.Tensor:
        opt = _sgd(momentum=0.9, weight_decay=0.01, nesterov=True)
        run = Runner(name, _x0(n, d), optimizer=opt)
        for t, lr in enumerate(lrs):
            run.step(t, f.grad(run.x), lr)
        return run.x

    constant = [0.05] * 30
    torch.testing.assert_close(
        trajectory("dsgt", constant), trajectory("gradient-tracking", constant), rtol=0, atol=1e-10
    )
    decaying = [0.05 * 0.9**t for t in range(30)]
    gap = (trajectory("dsgt", decaying) - trajectory("gradient-tracking", decaying)).abs().max()
    assert gap > 1e-4


@pytest.mark.parametrize("order", ["detag", "detag*"])
def test_tracker_mean_is_the_mean_direction_and_the_model_mean_moves_by_it(order: str) -> None:
    """W doubly stochastic: ȳ = mean d after every step, x̄ ← x̄ − α ȳ_used — also with the model
    travelling as fp16 (own remainder kept); random gradients, Nesterov momentum."""
    n, d, lr = 8, 6, 0.1
    gen = torch.Generator().manual_seed(4)
    opt = _sgd(momentum=0.9, weight_decay=0.01, nesterov=True)
    run = Runner("detag", _x0(n, d), optimizer=opt, rounds=3, order=order)
    algo = run.algo
    assert isinstance(algo, DeTAG)
    for t in range(10):
        grad = torch.randn(n, d, generator=gen, dtype=F64)
        mean_before = run.x.mean(0)
        y_before = None if algo.tracker is None else algo.tracker.mean(0)
        run.step(t, grad, lr, codec=make_codec("fp16"))
        assert algo.tracker is not None
        assert algo.previous is not None
        torch.testing.assert_close(
            algo.tracker.mean(0), algo.previous.mean(0), rtol=0, atol=ROUNDOFF
        )
        used = algo.previous.mean(0) if order == "detag*" or y_before is None else y_before
        torch.testing.assert_close(run.x.mean(0), mean_before - lr * used, rtol=0, atol=ROUNDOFF)


# ---------------------------------------------------------------------------------------------
# Rounds, phases, control, state


def test_a_step_uses_rounds_offset_to_offset_plus_r_minus_1() -> None:
    n, d, rounds = 8, 4, 3
    asked: list[int] = []
    ring = _ring(n)

    def matrix(k: int) -> np.ndarray:
        asked.append(k)
        return ring(k)

    run = Runner("detag", _x0(n, d), matrix=matrix, rounds=rounds)
    for t in range(4):
        run.step(t, torch.ones(n, d, dtype=F64))
    assert sorted(set(asked)) == list(range(4 * rounds))
    gossip = [c for c in run.comm.calls if c[0] != "allreduce"]
    expected = [
        (kind, t, t * rounds + r) for t in range(4) for r in range(rounds) for kind in ("mix",)
    ]
    assert [c for c in gossip if c[0] == "mix"] == expected
    # the tracker travels in the same round as the model, as per-edge messages
    assert [c for c in gossip if c[0] == "exchange"] == [("exchange", *c[1:]) for c in expected]
    assert run.comm.counters.rounds == 4 * rounds
    # two d-vectors per directed edge and round (16 directed edges on a ring of 8)
    assert run.comm.counters.bytes_raw == 4 * rounds * 2 * 16 * d * 8


class Recording:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def after_round(self, round_index: int, x: torch.Tensor, theta_local: torch.Tensor) -> bool:
        self.calls.append(round_index)
        return True  # "repeat" — not consulted


def test_control_adds_no_rounds_and_theta_is_reported_per_round() -> None:
    n, d = 8, 4
    run = Runner("detag", _x0(n, d) + torch.eye(n, d, dtype=F64), rounds=2)
    control = Recording()
    ctx = StepContext(step=0, lr=0.1, phase=GOSSIP, comm=run.comm, matrix=run.matrix)
    ctx.control = control
    report = run.algo.step(run.x, torch.zeros(n, d, dtype=F64), ctx)
    assert report.rounds == 2
    assert control.calls == []
    assert len(report.statistics) == 2
    assert report.theta_local is report.statistics[-1]
    assert report.theta_local.shape == (n,)
    assert float(report.statistics[0].sum()) > 0


@pytest.mark.parametrize("order", ["detag", "detag*"])
def test_exact_phase_averages_the_half_step_and_restarts_the_tracker(order: str) -> None:
    n, d, lr = 8, 5, 0.1
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(n, d, generator=gen, dtype=F64) for _ in range(3)]
    run = Runner("detag", _x0(n, d), rounds=2, order=order)
    run.step(0, grads[0], lr)
    algo = run.algo
    assert isinstance(algo, DeTAG)
    assert algo.tracker is not None
    assert algo.previous is not None
    y = algo.tracker.clone() if order == "detag" else algo.tracker + grads[1] - algo.previous
    expected = (run.x - lr * y).mean(0).expand(n, d)
    assert run.step(1, grads[1], lr, phase=EXACT) == 0
    torch.testing.assert_close(run.x, expected, rtol=0, atol=ROUNDOFF)
    assert torch.equal(algo.tracker, grads[1])
    assert torch.equal(algo.previous, grads[1])
    assert run.comm.calls[-1] == ("allreduce", 1, -1)
    run.step(2, grads[2], lr)  # back to gossip: tracking continues, mean invariant kept
    torch.testing.assert_close(algo.tracker.mean(0), grads[2].mean(0), rtol=0, atol=ROUNDOFF)


@pytest.mark.parametrize("name", ["detag", "dsgt"])
def test_state_dict_resumes_the_same_trajectory(name: str) -> None:
    n, d = 8, 6
    gen = torch.Generator().manual_seed(6)
    grads = [torch.randn(n, d, generator=gen, dtype=F64) for _ in range(8)]
    hyper: dict[str, object] = {"rounds": 2, "eta": 0.3} if name == "detag" else {}

    def runner(x0: torch.Tensor) -> Runner:
        opt = _sgd(momentum=0.9, weight_decay=0.01, nesterov=True)
        return Runner(name, x0, optimizer=opt, **hyper)

    first = runner(_x0(n, d))
    assert first.algo.state_dict() == {}  # nothing before the first step
    for t in range(4):
        first.step(t, grads[t])
    state = first.algo.state_dict()
    assert set(state) == {"momentum", "tracker", "previous"}
    second = runner(first.x)
    second.algo.load_state_dict({k: v.clone() for k, v in state.items()})
    second.rounds = first.rounds
    for t in range(4, 8):
        first.step(t, grads[t])
        second.step(t, grads[t])
    assert torch.equal(first.x, second.x)


def test_state_errors() -> None:
    algo = make_algorithm("detag", _sgd())
    with pytest.raises(ValueError, match="needs both 'tracker' and 'previous'"):
        algo.load_state_dict({"tracker": torch.zeros(3, 4)})
    algo.load_state_dict({"tracker": torch.zeros(3, 4), "previous": torch.zeros(3, 4)})
    ctx = StepContext(step=0, lr=0.1, phase=GOSSIP, comm=VectorizedComm(3), matrix=_ring(3))
    with pytest.raises(ValueError, match=r"detag: state of shape \(3, 4\) does not fit"):
        algo.step(torch.zeros(3, 5), torch.zeros(3, 5), ctx)


# ---------------------------------------------------------------------------------------------
# Hyperparameters and config


def test_hyperparameter_errors() -> None:
    for rounds in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"hyper\.rounds \(phase length R\) must be an int"):
            make_algorithm("detag", _sgd(), rounds=rounds)
    for eta in (1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match=r"hyper\.eta must be in \[0, 1\)"):
            make_algorithm("detag", _sgd(), eta=eta)
    for eta in (True, "fast", [0.2]):
        with pytest.raises(ValueError, match=r"hyper\.eta .* must be a number in \[0, 1\)"):
            make_algorithm("detag", _sgd(), eta=eta)
    with pytest.raises(ValueError, match=r"hyper\.order must be one of \['detag', 'detag\*'\]"):
        make_algorithm("detag", _sgd(), order="DeTAG")
    with pytest.raises(ValueError, match=r"algorithm 'detag': hyperparameters \['beta'\]"):
        make_algorithm("detag", _sgd(), beta=0.9)
    for key in ("rounds", "eta", "order"):
        with pytest.raises(ValueError, match=rf"'dsgt' is DeTAG with .* \(got hyper\.{key}\)"):
            make_algorithm("dsgt", _sgd(), **{key: 1})
    algo = make_algorithm("detag", _sgd(), eta="auto")
    assert isinstance(algo, DeTAG)
    assert algo.eta is None
    assert algo.rounds == 2
    fixed = make_algorithm("dsgt", _sgd())
    assert isinstance(fixed, DeTAG)
    assert (fixed.rounds, fixed.eta, fixed.order) == (1, 0.0, "detag*")


def test_config_checks() -> None:
    base = ["peers=8", "engine=vectorized"]
    for extra in ([], ["hyper.rounds=3", "hyper.eta=0.2", 'hyper.order="detag*"']):
        check_algorithm(load_config(None, [*base, "algorithm=detag", *extra], environ={}))
    check_algorithm(load_config(None, [*base, "algorithm=dsgt"], environ={}))
    with pytest.raises(ValueError, match=r"hyper\.rounds"):
        check_algorithm(load_config(None, [*base, "algorithm=detag", "hyper.rounds=0"], environ={}))
    with pytest.raises(ValueError, match=r"\(got hyper\.rounds\)"):
        check_algorithm(load_config(None, [*base, "algorithm=dsgt", "hyper.rounds=2"], environ={}))
    for name in ("detag", "dsgt"):
        # the default control is inert; an explicit one is an error
        assert load_config(None, [*base, f"algorithm={name}"], environ={}).controlled_phases() == []
        with pytest.raises(ConfigError, match=f"{name} runs its own number of accelerated"):
            load_config(None, [*base, f"algorithm={name}", "control.mode=adaptive"], environ={})
        for topology in ("exponential-one-peer", "random-matching"):
            with pytest.raises(ConfigError, match=f"{topology}' is time-varying; algorithm"):
                load_config(None, [*base, f"algorithm={name}", f"topology={topology}"], environ={})
        with pytest.raises(ConfigError, match="needs a static topology"):
            load_config(
                None,
                [
                    *base,
                    f"algorithm={name}",
                    'phase_topologies=["ring", "random-matching", "ring"]',
                ],
                environ={},
            )
    load_config(None, [*base, "algorithm=detag", "topology=torus", "kappa=0.1"], environ={})


# ---------------------------------------------------------------------------------------------
# docs/algorithms.md#reproduction-targets: on label-sorted data D-SGD stalls where DSGT/DeTAG
# converge


@pytest.mark.parametrize("shuffled", [0.0, 0.5])
def test_label_sorted_softmax_regression_dsgd_stalls_dsgt_and_detag_converge(
    shuffled: float,
) -> None:
    """A convex stand-in for DeTAG's "unshuffled" CIFAR-10 experiment: ℓ2-regularised softmax
    regression (μ = 0.1) of 4 Gaussian classes in 5-d, 800 samples split label-sorted (the
    ``sorted`` scheme; shuffled fraction 0: each peer sees one class) over a ring of 8, exact
    local gradients, constant lr 0.5, 300 steps from 0; error = max_i ‖x_i − x*‖ (x* by
    centralised gradient descent to ‖∇f‖ < 1e-12).

    Measured (shuffled 0 / 0.5): D-SGD sits at a floor of 0.827 / 0.805 from step ~50 on; DSGT
    reaches 3.9e-6 / 2.1e-6, DeTAG with the paper's R = 2, η = 0.2 5.5e-6 / 2.1e-10, DeTAG*
    with R = 2 and η from λ (0.255) 9.3e-10 / 9.2e-10 (DeTAG with η from λ converges too, on
    sorted data more slowly: 3.1e-4 / 2.1e-10). Asserted with margins: the floor > 0.5 and flat,
    the trackers ≤ 1e-4."""
    n, classes, features, samples, mu, lr, steps = 8, 4, 5, 800, 0.1, 0.5, 300
    gen = torch.Generator().manual_seed(0)
    centers = 1.5 * torch.randn(classes, features, generator=gen, dtype=F64)
    labels = torch.arange(samples) % classes
    feats = centers[labels] + torch.randn(samples, features, generator=gen, dtype=F64)
    feats = torch.cat([feats, torch.ones(samples, 1, dtype=F64)], dim=1)  # bias
    split = sorted_partition(labels.numpy(), n, seed=0, shuffled_fraction=shuffled)
    parts = [torch.as_tensor(p) for p in split]
    if shuffled == 0:
        assert all(len(set(labels[p].tolist())) == 1 for p in parts)  # one class per peer
    X = torch.stack([feats[p] for p in parts])  # [n, m, f + 1]
    Y = torch.stack([torch.nn.functional.one_hot(labels[p], classes).to(F64) for p in parts])
    shape = (features + 1, classes)

    def grads(x: torch.Tensor) -> torch.Tensor:
        Wm = x.view(x.shape[0], *shape)
        P = torch.softmax(X @ Wm, dim=2)
        return (X.transpose(1, 2) @ (P - Y) / X.shape[1] + mu * Wm).reshape(x.shape[0], -1)

    dim = shape[0] * shape[1]
    opt = torch.zeros(1, dim, dtype=F64)
    for _ in range(3000):
        opt = opt - 0.5 * grads(opt.expand(n, dim)).mean(0, keepdim=True)
    assert float(grads(opt.expand(n, dim)).mean(0).norm()) < 1e-12

    def errors(name: str, **hyper: object) -> list[float]:
        run = Runner(name, torch.zeros(n, dim, dtype=F64), **hyper)
        out = []
        for t in range(steps):
            run.step(t, grads(run.x), lr)
            out.append(float((run.x - opt).norm(dim=1).max()))
        return out

    dsgd = errors("dsgd")
    assert min(dsgd[-100:]) > 0.5
    assert max(dsgd[-100:]) - min(dsgd[-100:]) < 1e-6
    for name, hyper in (
        ("dsgt", {}),
        ("detag", {"rounds": 2, "eta": 0.2}),
        ("detag", {"rounds": 2, "order": "detag*"}),
    ):
        assert errors(name, **hyper)[-1] <= 1e-4, (name, hyper)
