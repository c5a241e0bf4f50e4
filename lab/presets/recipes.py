"""Training recipes the presets share (`concord.lab.presets.catalog`, and
`concord.lab.presets.consensus`, which the catalog lists): "dotted.key=value" items as
``--set`` takes them."""

from __future__ import annotations

MNIST1D_RECIPE = (
    "dataset.name=mnist1d",
    "dataset.samples=20000",
    "model.name=cnn1d",
    "epochs=60",
    "optim.lr=0.1",
    "optim.momentum=0.9",
    "optim.nesterov=true",
    "optim.weight_decay=1e-4",
    "optim.batch_size=16",
    "optim.warmup=0.05",
    "optim.milestones=[0.5, 0.75]",
    "optim.gamma=0.1",
    "eval.every=5.0",
    "threads=1",
)
"""The paper recipe of ``examples/paper-mnist1d.toml`` (consensus-control's ``BASE`` adds
`BASELINE_FIX`, the ring, D-SGD and the control bounds)."""

BASELINE_FIX = ("optim.lr=0.2", "optim.clip_norm=2.0")
"""What consensus-control adds to `MNIST1D_RECIPE`: clip every replica's gradient at norm 2 and
double the LR (the row ``clip2-lr0.2`` of the preset baseline-stability)."""
