"""The vectorized engine keeps its [n, d] state and temporaries in buffers that live across steps
(issue 14, item 7): after the first step a step allocates no tensor as large as the parameters,
and what the reused buffers held before never shows in a result."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import profile

from concord.core.config import load_config
from concord.core.control.consensus import consensus_distance
from concord.sim.engine import ConsensusMeter, Trainer

# 64 replicas of the 79k-parameter mlp; a low control factor makes the controlled steps gossip
# 2–3 rounds, so results are reused within a step as well as across steps
OVERRIDES = [
    "peers=64",
    "model.name=mlp",
    "dataset.samples=1024",
    "epochs=4",
    "control.factor=0.05",
    "control.max_rounds=3",
]


def _trainer(*extra: str) -> Trainer:
    return Trainer(load_config(None, [*OVERRIDES, *extra], environ={}))


@pytest.mark.parametrize("statistic", ["theta", "xi"])
def test_a_step_allocates_no_parameter_sized_tensor_after_the_first(statistic: str) -> None:
    """Every op's own allocations, from the profiler: after step 0 nothing as large as the
    [n, d] parameters — no fresh gradient, optimizer direction, gossip result or float64
    statistic. (Autograd's per-parameter gradients remain; each is smaller than all of d.)"""
    trainer = _trainer(f"control.statistic={statistic}")
    state_bytes = trainer.task.x.numel() * trainer.task.x.element_size()
    trainer.train_step(0)
    rounds = []
    for step in range(1, 4):
        with profile(profile_memory=True) as prof:
            rounds.append(trainer.train_step(step).to_json()["rounds"])
        big = [
            (e.name, e.self_cpu_memory_usage)
            for e in prof.events()
            if e.self_cpu_memory_usage >= state_bytes
        ]
        assert big == [], f"step {step} allocated {big}"
    assert max(rounds) >= 2  # the within-step reuse of the gossip result was exercised


def _poison(trainer: Trainer) -> None:
    """NaN into every buffer the engine keeps between steps (as if reused memory held
    anything): a result that depends on a buffer's old contents turns NaN or changes."""
    optimizer = trainer.algorithm.optimizer  # type: ignore[attr-defined]
    meter = trainer.xi
    buffers = [
        trainer.task._grad,
        optimizer._work,
        meter._work,
        meter._mean,
        meter._block,
        *trainer.comm._spare,
    ]
    for b in buffers:
        if b is not None:  # the optimizer's scratch exists from the second step on
            b.fill_(float("nan"))


def test_results_do_not_depend_on_what_the_reused_buffers_held() -> None:
    clean, poisoned = _trainer(), _trainer()
    for step in range(clean.total_steps):
        want = clean.train_step(step)
        got = poisoned.train_step(step)
        _poison(poisoned)
        assert got == want, f"step {step}"
    assert torch.equal(poisoned.task.x, clean.task.x)
    for key, value in clean.algorithm.state_dict().items():
        assert torch.equal(poisoned.algorithm.state_dict()[key], value), key


@pytest.mark.parametrize(("n", "d"), [(1, 10), (2, 3), (7, 1001), (64, 70_000), (300, 17)])
def test_consensus_meter_is_consensus_distance_bit_for_bit(n: int, d: int) -> None:
    meter = ConsensusMeter()
    gen = torch.Generator().manual_seed(n * d)
    for scale in (1.0, 1e-3):  # called again: the buffers are reused
        x = torch.randn(1, d, generator=gen) + scale * torch.randn(n, d, generator=gen)
        assert meter(x) == consensus_distance(x)
