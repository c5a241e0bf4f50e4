"""``optim.clip_norm``: each replica's stochastic gradient is scaled to at most that L2 norm
before the optimizer (like ``torch.nn.utils.clip_grad_norm_`` per replica), in the step driver
both engines share.

Tolerance: with plain SGD (no momentum, no weight decay) and local SGD's silent steps, replica i
moves by exactly η·g_i, so ‖Δx_i‖ = η·min(‖g_i‖, c) up to float32 rounding of a 1e-3-sized
difference of O(1) parameters (~1e-7 per coordinate over ~10⁴ of them: 1e-5 relative is ample).
"""

from __future__ import annotations

import pytest
import torch

from concord.core.config import ConfigError, load_config
from concord.sim.engine import Trainer

torch.set_num_threads(1)

LR = 0.05
TINY = [
    "peers=3",
    "dataset.samples=600",
    "model=mlp",
    "model.hidden=[32]",
    "epochs=1",
    f"optim.lr={LR}",
    "optim.warmup=0",
    "optim.momentum=0",
    "optim.nesterov=false",
    "optim.weight_decay=0",
    "algorithm=local-sgd",
    "hyper.local_steps=1000",  # no averaging in the step measured
    "control.mode=none",
]


def _first_step(*extra: str) -> tuple[torch.Tensor, float]:
    trainer = Trainer(load_config(None, [*TINY, *extra], environ={}))
    x0 = trainer.task.x.clone()
    record = trainer.train_step(0).to_json()
    return trainer.task.x - x0, float(record["grad_norm"])


def test_clip_norm_bounds_each_replicas_step_and_leaves_small_gradients_alone() -> None:
    free, raw_norm = _first_step()
    free_norms = free.norm(dim=1) / LR  # ‖g_i‖
    clip = float(free_norms.min()) / 2  # every replica clipped
    clipped, clipped_raw = _first_step(f"optim.clip_norm={clip}")
    moved = clipped.norm(dim=1) / LR
    torch.testing.assert_close(moved, torch.full_like(moved, clip), rtol=1e-5, atol=0)
    # the direction is kept: the clipped step is the free one scaled
    cos = torch.nn.functional.cosine_similarity(clipped, free, dim=1)
    assert float(cos.min()) > 1 - 1e-5
    assert clipped_raw == pytest.approx(raw_norm, rel=1e-6)  # records keep the raw ‖g‖
    loose, _ = _first_step(f"optim.clip_norm={float(free_norms.max()) * 2}")
    torch.testing.assert_close(loose, free, rtol=0, atol=1e-7)


@pytest.mark.parametrize("bad", ["0", "-1", "nan"])
def test_clip_norm_must_be_positive(bad: str) -> None:
    with pytest.raises(ConfigError, match="clip_norm"):
        load_config(None, [f"optim.clip_norm={bad}"], environ={})
