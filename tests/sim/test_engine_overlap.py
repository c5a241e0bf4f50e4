"""``overlap = true`` in the vectorized engine: the switch reaches the step driver, the step is
combine-then-adapt (same mean as without overlap, different replicas), and consensus control
still repeats rounds after the overlapped one.

Tolerance: the means of the two runs agree to 1e-6 — both are x̄⁰ − η·d̄ with W doubly stochastic,
computed in float32 through different sums (W(x − ηd) against Wx − ηd), ~1e-7 per coordinate.
"""

from __future__ import annotations

import torch

from concord.core.config import load_config
from concord.sim.engine import Trainer

torch.set_num_threads(1)

TINY = [
    "peers=4",
    "dataset.samples=800",
    "model=mlp",
    "model.hidden=[32]",
    "epochs=1",
    "optim.warmup=0",  # η > 0 from the first step
    "control.mode=none",
]


def _after_first_step(*extra: str) -> torch.Tensor:
    trainer = Trainer(load_config(None, [*TINY, *extra], environ={}))
    trainer.train_step(0)
    return trainer.task.x.clone()


def test_overlap_keeps_the_mean_and_changes_where_the_update_is_mixed() -> None:
    serial, overlapped = _after_first_step(), _after_first_step("overlap=true")
    torch.testing.assert_close(overlapped.mean(0), serial.mean(0), rtol=0, atol=1e-6)
    # W(x⁰ − η d) against W x⁰ − η d: the replicas differ by η (I − W) d
    assert float((overlapped - serial).abs().max()) > 1e-4


def test_control_repeats_rounds_after_the_overlapped_one() -> None:
    cfg = load_config(
        None,
        [
            *TINY[:-1],
            "overlap=true",
            "control.mode=adaptive",
            "control.factor=0.05",
            "control.max_rounds=4",
        ],
        environ={},
    )
    trainer = Trainer(cfg)
    records = [trainer.train_step(step).to_json() for step in range(10)]
    assert all(r["rounds"] >= 1 for r in records)
    assert sum(r["rounds"] for r in records) > len(records)  # some steps repeated
    assert trainer.rounds_total == sum(r["rounds"] for r in records)
