"""`concord.core.control.statistic`: the torch-free Θ and means, and their agreement with the
tensor front `concord.core.control.consensus.theta` (the orchestrator and the vectorized engine
must compute the same Θ from the same θ_i)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from concord.core.control.consensus import local_theta, theta
from concord.core.control.statistic import mean_of, theta_from_locals

torch.set_num_threads(1)


@pytest.mark.parametrize("seed", range(20))
def test_tensor_and_scalar_theta_agree_on_random_inputs(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 65, (1,), generator=g))
    scale = 10.0 ** float(torch.empty(1).uniform_(-12, 6, generator=g))
    thetas = torch.rand(n, generator=g, dtype=torch.float64) * scale
    scalar = theta_from_locals(float(v) for v in thetas)
    tensor = theta(thetas)
    assert tensor == pytest.approx(scalar, rel=1e-12, abs=0.0)
    assert tensor == scalar  # the same arithmetic: bit for bit
    assert theta(thetas.to(torch.float32)) == pytest.approx(
        theta_from_locals(float(v) for v in thetas.to(torch.float32)), rel=1e-12
    )


@pytest.mark.parametrize("seed", range(5))
def test_scalar_theta_of_local_statistics_matches_the_definition(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    before = torch.randn(8, 50, generator=g, dtype=torch.float64)
    after = torch.randn(8, 50, generator=g, dtype=torch.float64)
    locals_ = local_theta(before, after)
    want = math.sqrt(float((after - before).square().sum(dim=1).mean()))
    assert theta_from_locals(locals_.tolist()) == pytest.approx(want, rel=1e-12)


def test_theta_is_exactly_summed_and_order_free() -> None:
    values = [1e16, 1.0, 1.0, 1.0, 1.0]
    assert theta_from_locals(values) == math.sqrt((1e16 + 4.0) / 5)
    assert theta_from_locals(reversed(values)) == theta_from_locals(values)
    assert theta_from_locals([0.0]) == 0.0


@pytest.mark.parametrize("bad", [[], [1.0, -0.5], [float("nan")], [float("inf")]])
def test_theta_rejects_what_the_tensor_version_rejects(bad: list[float]) -> None:
    with pytest.raises(ValueError, match=r"empty|thetas\["):
        theta_from_locals(bad)
    with pytest.raises(ValueError, match=r"empty|thetas\["):
        theta(bad)


def test_mean_of() -> None:
    assert mean_of([0.5, 1.0, 1.5]) == 1.0
    assert mean_of(iter([1e16, 1.0, 1.0])) == math.fsum([1e16, 1.0, 1.0]) / 3
    with pytest.raises(ValueError, match="empty"):
        mean_of([])


def test_statistic_does_not_import_torch() -> None:
    code = "import sys, concord.core.control.statistic; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
