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

PYSTDLIB_RECIPE = (
    "dataset.name=pystdlib-chars",
    "dataset.samples=40000",
    "dataset.test_samples=2000",
    "partition.scheme=groups",
    "model.name=char-transformer",
    "epochs=8",
    "optim.lr=0.1",
    "optim.momentum=0.9",
    "optim.nesterov=true",
    "optim.batch_size=32",
    "optim.warmup=0.05",
    "optim.milestones=[0.5, 0.75]",
    "optim.gamma=0.1",
    "optim.clip_norm=1.0",
    "eval.every=2.0",
    "eval.peer_samples=500",
    "threads=1",
)
"""Next-character prediction on the interpreter's standard library (``pystdlib-chars``: 40 000
windows of 64 characters, 10 % held out per package) with the 2-layer ``char-transformer``,
each peer holding whole top-level packages (``partition.scheme = "groups"``); local batch 32,
Nesterov 0.9, gradients clipped at norm 1, lr 0.1 (the smoke-run choice, untuned), 8 epochs.
The corpus differs between Python builds: a study that must be repeatable adds
``dataset.options.expected_sha256=<corpus_sha256>`` (`concord.core.data.pystdlib.PINNED`)."""
