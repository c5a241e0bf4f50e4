"""CHOCO-SGD: equals D-SGD without compression, and compressed gossip reaches consensus."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.algorithms import LocalSGD, SGDConfig, StepContext, make_algorithm
from core.compress import make_codec
from core.config import ConfigError, load_config
from core.consensus import consensus_distance
from core.plan import Phase
from core.topology import make_schedule
from sim.engine import run
from sim.vectorized import VectorizedComm

torch.set_num_threads(1)
PHASE = Phase(index=1, start=0, end=10**9, mode="gossip", topology=None, controlled=False)


def _sgd() -> LocalSGD:
    return LocalSGD(SGDConfig(momentum=0.0, nesterov=False, weight_decay=0.0))


def _ctx(t: int, lr: float, comm: VectorizedComm) -> StepContext:
    return StepContext(
        step=t,
        lr=lr,
        phase=PHASE,
        comm=comm,
        matrix=make_schedule("ring", comm.n).matrix,
        round_offset=t,
    )


def test_choco_without_compression_and_gamma_one_is_dsgd() -> None:
    n, d = 8, 20
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(n, d, generator=gen, dtype=torch.float64)
    grads = [torch.randn(n, d, generator=gen, dtype=torch.float64) for _ in range(10)]
    a, b = x0.clone(), x0.clone()
    choco = make_algorithm("choco", _sgd(), codec=make_codec("none"), gamma=1.0)
    dsgd = make_algorithm("dsgd", _sgd())
    ca, cb = VectorizedComm(n), VectorizedComm(n)
    choco.setup(a, ca)
    for t, g in enumerate(grads):
        choco.step(a, g, _ctx(t, 0.1, ca))
        dsgd.step(b, g, _ctx(t, 0.1, cb))
    # same arithmetic up to associativity (x + (s − x̂) vs W x): float64 round-off only
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("name", "ratio", "gamma", "rounds", "factor"),
    [
        ("topk", 0.01, 0.05, 2000, 100),  # measured ~400×
        ("randomk", 0.1, 0.1, 800, 30),  # measured ~60× in 600 rounds
        ("int8", 1.0, 0.5, 300, 1000),  # measured ~6000×
        ("sign", 1.0, 0.3, 1000, 100),  # measured ~290×
    ],
)
def test_compressed_consensus_converges(
    name: str, ratio: float, gamma: float, rounds: int, factor: float
) -> None:
    """Average consensus (no gradients) on a ring of 16 with d = 1000: the consensus distance
    shrinks geometrically and the mean is preserved (W doubly stochastic, error feedback)."""
    n, d = 16, 1000
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(1))
    mean = x.mean(0).clone()
    comm = VectorizedComm(n)
    algo = make_algorithm("choco", _sgd(), codec=make_codec(name, ratio=ratio, seed=2), gamma=gamma)
    algo.setup(x, comm)
    start = consensus_distance(x)
    for t in range(rounds):
        algo.step(x, torch.zeros(n, d), _ctx(t, 0.0, comm))
    assert consensus_distance(x) < start / factor, name
    torch.testing.assert_close(x.mean(0), mean, rtol=0, atol=1e-4)  # float32 accumulation


def test_too_large_gamma_with_aggressive_compression_does_not_converge() -> None:
    """CHOCO's known failure mode: top-1 % with γ = 0.1 on a 16-ring drifts instead of
    contracting (measured: the distance grows ~3×), which is why γ must shrink with ω."""
    n, d = 16, 1000
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(1))
    comm = VectorizedComm(n)
    algo = make_algorithm("choco", _sgd(), codec=make_codec("topk", ratio=0.01), gamma=0.1)
    algo.setup(x, comm)
    start = consensus_distance(x)
    for t in range(2000):
        algo.step(x, torch.zeros(n, d), _ctx(t, 0.0, comm))
    assert consensus_distance(x) > start / 10


def test_choco_run_sends_fewer_bytes_than_dsgd(tmp_path: Path) -> None:
    base = [
        "peers=4",
        "dataset.samples=800",
        "model=mlp",
        "model.hidden=[32]",
        "epochs=2",
        "control.mode=none",
    ]
    choco = run(
        load_config(
            None,
            [
                *base,
                "algorithm=choco",
                "compression.codec=topk",
                "compression.ratio=0.1",
                "compression.gamma=0.3",
            ],
            environ={},
        ),
        tmp_path / "c",
        progress=False,
    )
    dsgd = run(load_config(None, base, environ={}), tmp_path / "d", progress=False)
    assert choco["bytes_sent_total"] < 0.25 * dsgd["bytes_sent_total"]  # 10 % values + indices
    assert choco["accuracy_avg_model"] > 0.2  # above chance (0.1) after two epochs


def test_config_rules_for_codecs() -> None:
    with pytest.raises(ConfigError, match="needs error feedback"):
        load_config(None, ["compression.codec=topk"], environ={})
    with pytest.raises(ConfigError, match="static topology"):
        load_config(None, ["algorithm=choco", "topology=random-matching"], environ={})
    assert load_config(None, ["compression.codec=fp16"], environ={}).compression.codec == "fp16"
