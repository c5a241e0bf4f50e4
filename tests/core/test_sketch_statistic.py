"""Control statistic ``sketch``: Ξ̂ from shared random sketches of the models
(`concord.core.control.sketch`, `concord.core.control.statistic.xi_from_sketches`), against Θ on
a ring whose spectrum is known in closed form, the bit agreement of the vectorized engine's and
the orchestrator's arithmetic, and config validation."""

from __future__ import annotations

import math
import random

import pytest
import torch

from concord.core.config import ConfigError, load_config
from concord.core.control.calibration import Calibration
from concord.core.control.consensus import consensus_distance, local_theta, round_statistic, theta
from concord.core.control.controller import ConsensusController, ControlConfig
from concord.core.control.sketch import sketch_map, sketch_rows
from concord.core.control.statistic import SKETCH_SIZE, xi_from_sketches
from concord.orchestrator.rounds import RoundBook
from concord.orchestrator.rounds import round_statistic as orchestrator_statistic
from concord.protos.control_plane import Stats


def ring(n: int) -> torch.Tensor:
    """The ring's gossip matrix, weights ⅓ (self and both neighbours): eigenvalues
    λ_k = ⅓ + ⅔ cos(2πk/n), eigenvectors cos(2πk i/n)."""
    w = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        for j in (i - 1, i, i + 1):
            w[i, j % n] += 1 / 3
    return w


def mode(n: int, k: int, d: int, seed: int = 0) -> torch.Tensor:
    """Replicas in one eigenvector of the ring: x_i = cos(2πk i/n) c with a random c ∈ R^d."""
    c = torch.randn(d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    v = torch.cos(2 * math.pi * k * torch.arange(n, dtype=torch.float64) / n)
    return torch.outer(v, c)


@pytest.mark.parametrize("k", [1, 4, 8])
def test_theta_sees_a_mode_through_one_minus_lambda_and_the_sketch_does_not(k: int) -> None:
    n, d = 16, 4096
    x = mode(n, k, d)
    after = ring(n) @ x
    lam = 1 / 3 + 2 / 3 * math.cos(2 * math.pi * k / n)
    xi_before, xi_after = consensus_distance(x), consensus_distance(after)
    # Θ² = (1/n)‖(W − I)X‖² = (1 − λ)² Ξ² (X before the round): exact up to float64 rounding
    assert theta(local_theta(x, after)) / xi_before == pytest.approx(1 - lam, rel=1e-9)
    # the slowest mode (k = 1, 1 − λ ≈ 0.05) is 20× under-stated by Θ; Ξ̂ is not: over 200
    # independent sketches (steps) the mean of Ξ̂²/Ξ² is within 5 % of 1 (its standard error is
    # sqrt(2/k)/sqrt(200) ≈ 1.3 % for a single direction c), and every single draw within
    # [0.45, 1.7] (χ²_64/64 lies outside with probability < 1e-4 per draw; the draws are fixed
    # by the step seeds, so the test is deterministic)
    ratios = [round_statistic("sketch", t, after, after) ** 2 / xi_after**2 for t in range(200)]
    assert sum(ratios) / len(ratios) == pytest.approx(1.0, abs=0.05)
    assert min(ratios) >= 0.45
    assert max(ratios) <= 1.7


def test_one_coordinate_per_bucket_is_exact() -> None:
    x = torch.randn(8, 100, generator=torch.Generator().manual_seed(1))
    # k = d: each bucket is one coordinate times ±1, so Ξ̂ = Ξ up to float64 rounding
    xi_hat = xi_from_sketches(sketch_rows(x, 3, k=100).tolist())
    assert xi_hat == pytest.approx(consensus_distance(x), rel=1e-12)


def test_a_row_sketched_alone_has_the_bits_of_the_batch_and_the_orchestrator_agrees() -> None:
    n, d, step = 6, 1000, 17
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(2))
    batch = sketch_rows(x, step)
    assert batch.shape == (n, SKETCH_SIZE)
    for i in range(n):  # a peer sketches its own [1, d] row: the same bits
        assert torch.equal(sketch_rows(x[i : i + 1].clone(), step)[0], batch[i])
    engine = round_statistic("sketch", step, x, torch.zeros(n, dtype=torch.float64))
    stats = [
        Stats(peer=i, step=step, round=1, theta=0.0, grad_norm=0.0, sketch=batch[i].tolist())
        for i in range(n)
    ]
    random.Random(0).shuffle(stats)  # arrival order does not matter (math.fsum)
    assert orchestrator_statistic("sketch", stats) == engine  # bit for bit


def test_the_sketch_is_redrawn_each_step_and_fixed_within_it() -> None:
    p0, s0 = sketch_map(50, 0)
    p0b, s0b = sketch_map(50, 0)
    p1, _ = sketch_map(50, 1)
    assert torch.equal(p0, p0b)
    assert torch.equal(s0, s0b)
    assert not torch.equal(p0, p1)
    assert sorted(p0.tolist()) == list(range(50))
    assert set(s0.tolist()) <= {-1.0, 1.0}


@pytest.mark.parametrize(
    ("sketches", "match"),
    [([], "empty"), ([[1.0, 2.0], [1.0]], r"sketches\[1\] has 1"), ([[math.nan]], "finite")],
)
def test_xi_from_sketches_refuses_bad_input(sketches: list[list[float]], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        xi_from_sketches(sketches)


def test_round_statistic_refuses_xi() -> None:
    with pytest.raises(ValueError, match="statistic = 'xi'"):
        round_statistic("xi", 0, torch.zeros(2, 3), torch.zeros(2))


def test_config_accepts_sketch_and_names_a_bad_statistic() -> None:
    cfg = load_config(None, ["control.statistic=sketch"], environ={})
    assert cfg.control.statistic == "sketch"
    assert load_config(None, ["control.statistic=sketch", "engine=processes"], environ={})
    with pytest.raises(ConfigError, match=r"control\.statistic"):
        load_config(None, ["control.statistic=sketches"], environ={})
    assert ControlConfig(mode="constant", statistic="sketch").statistic == "sketch"
    with pytest.raises(ValueError, match="statistic"):
        ControlConfig(statistic="Xi")  # type: ignore[arg-type]


def test_a_calibration_on_theta_does_not_feed_a_sketch_controller() -> None:
    cfg = load_config(None, ["control.statistic=sketch", "control.mode=constant"], environ={})
    from concord.core.control.runplan import control_config, make_lr_schedule, make_plan

    plan = make_plan(cfg, make_lr_schedule(cfg, 10))
    with pytest.raises(ValueError, match="calibrate on the statistic you control"):
        ConsensusController(control_config(cfg), plan, Calibration({1: 1.0}, "theta"))


def test_the_orchestrator_ignores_a_statistic_without_a_sketch() -> None:
    cfg = load_config(None, ["control.statistic=sketch", "control.mode=adaptive"], environ={})
    from concord.core.control.runplan import control_config, make_lr_schedule, make_plan

    plan = make_plan(cfg, make_lr_schedule(cfg, 10))
    book = RoundBook("train", plan, controller=ConsensusController(control_config(cfg), plan))
    bare = Stats(peer=0, step=0, round=1, theta=1.0, grad_norm=1.0)
    assert book.add(bare, {0}, 0.0) == []
    assert book.ignored == 1
    good = Stats(peer=0, step=0, round=1, theta=1.0, grad_norm=1.0, sketch=[0.5] * SKETCH_SIZE)
    decisions = book.add(good, {0}, 0.0)
    assert [d.statistic for d in decisions] == [0.0]  # one peer: Ξ̂ = 0
