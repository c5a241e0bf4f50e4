"""A run whose training blows up stops with `DivergedError` naming the step, the phase, the
learning rate and the replicas, instead of an error from deep inside the consensus statistic."""

from __future__ import annotations

import pytest
import torch

from concord.core.config import load_config
from concord.core.loop import DivergedError
from concord.sim.engine import Trainer

torch.set_num_threads(1)

TINY = [
    "peers=3",
    "dataset.samples=600",
    "model=mlp",
    "model.hidden=[32]",
    "epochs=1",
    "optim.warmup=0",
    "control.mode=none",
    "topology=ring",
]


def test_a_non_finite_replica_stops_the_run_with_the_step_and_replica_named() -> None:
    trainer = Trainer(load_config(None, TINY, environ={}))
    trainer.train_step(0)  # a healthy step passes the check
    with torch.no_grad():
        trainer.task.x[1, 0] = float("nan")  # replica 1 blown up
    with pytest.raises(
        DivergedError,
        match=r"at step 1 \(phase 1, lr 0\.1\): the loss of "
        r"replica\(s\) 1 and the consensus statistic .* of replica\(s\) 0, 1, 2",
    ):
        trainer.train_step(1)
