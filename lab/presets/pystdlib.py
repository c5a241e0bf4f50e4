"""Presets on the natural-heterogeneity task ``pystdlib-chars`` (next character of the Python
standard library's source, each peer holding whole top-level packages; `PYSTDLIB_RECIPE`).

- ``relaysgd-pystdlib`` (`RELAYSGD_PYSTDLIB`): RelaySGD vs D-SGD vs all-reduce under the
  by-package partition at n = 16 and 32 — a catalog preset, run as a study (`relay_study`) whose
  report adds the held-out loss, the unigram / bigram references and what carried over from
  MNIST-1D (`concord.lab.presets.pystdlib_report`);
- ``consensus-pystdlib``: consensus control's Table-2 shape on the same task
  (`concord.lab.presets.consensus_pystdlib`).

Both run at `PYSTDLIB_BUDGET` (why this budget: docs/algorithms.md, "A task with natural
heterogeneity"). The learning rate is one untuned choice for every row (smoke runs); ``--tune``
runs each row's grid.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

from concord.lab.presets.recipes import PYSTDLIB_RECIPE
from concord.lab.presets.spec import Preset, PresetRequest, Relation, Setting, Setup, Study

PYSTDLIB_BUDGET: tuple[str, ...] = (
    "dataset.samples=16000",
    "dataset.test_samples=2000",
    "dataset.options.seq_len=32",
    "model.options.width=64",
    "optim.batch_size=16",
    "optim.lr=1.0",
    "epochs=4",
    "eval.every=2.0",
    "eval.peer_samples=500",
)
"""The CPU budget of this module's studies, after `PYSTDLIB_RECIPE` (docs/algorithms.md,
"pystdlib-chars"): 16 000 windows of 32 characters (14 400 for training; the 1 600 held-out
windows are all evaluated, ``dataset.test_samples`` 2 000 being a cap), the 2-layer
`char-transformer` at width 64 (4 heads), local batch 16, lr 1.0, 4 epochs. Measured at n = 16
on one core under load ~3: all-reduce about 20 s a run and D-SGD about 35 s, reaching 45 %
next-character accuracy (loss 2.17 nats) against the bigram reference's 37 % (2.44) — the
8-epoch recipe at width 128 and context 64 cost 1.5 s a step."""

_PEERS = tuple(Setting(f"n{n}", f"n = {n}", {"peers": n}, n) for n in (16, 32))
_LR = 1.0  # one lr for every row: the all-reduce smoke grid's best (0.1, 0.3, 0.6, 1.0)
_GRID = (0.3, 0.6, 1.0, 2.0)


def _lr(lr: float) -> Mapping[str, float]:
    return {c.key: lr for c in _PEERS}


RELAYSGD_PYSTDLIB = Preset(
    name="relaysgd-pystdlib",
    title="RelaySGD vs D-SGD vs all-reduce, stdlib packages per peer (char transformer)",
    setup=(
        "Next-character prediction on the running interpreter's standard library "
        "(`pystdlib-chars`: 16 000 windows of 32 characters, 10 % of each package held out, "
        "1 600 held-out windows), the 2-layer `char-transformer` (width 64, 4 heads), "
        "**16 peers** (the preset's 32-peer column was not run for this report), each holding "
        "whole top-level packages (`partition.scheme = "
        '"groups"`: natural heterogeneity in vocabulary, style and size, as LEAF\'s '
        "Shakespeare by speaker), local batch 16, lr 1.0 for every row, Nesterov 0.9, gradients "
        "clipped at norm 1, 5 % warm-up, LR ×0.1 at 50 % and 75 %, 4 epochs. Metric: the worst "
        "peer's next-character accuracy on 500 held-out windows (the averaged model's on all "
        "1 600)."
    ),
    base=(*PYSTDLIB_RECIPE, *PYSTDLIB_BUDGET, "plan=gossip", "control.mode=none"),
    rows=(
        Setup(
            "allreduce",
            "all-reduce",
            {"algorithm": "allreduce", "topology": "complete"},
            _lr(_LR),
            _GRID,
        ),
        Setup(
            "dsgd-ring",
            "D-SGD (ring)",
            {"algorithm": "dsgd", "topology": "ring"},
            _lr(_LR),
            _GRID,
        ),
        Setup(
            "relaysgd-trees",
            "RelaySGD (double binary trees)",
            {"algorithm": "relaysgd", "topology": "double-binary-tree"},
            _lr(_LR),
            _GRID,
        ),
        Setup(
            "relaysgd-chain",
            "RelaySGD (chain)",
            {"algorithm": "relaysgd", "topology": "chain"},
            _lr(_LR),
            _GRID,
        ),
    ),
    columns=_PEERS,
    column_name="peers",
    metric="worst",
    expected=tuple(
        rel
        for c in _PEERS
        for rel in (
            Relation(c.key, "relaysgd-trees", "allreduce", -0.02),
            Relation(c.key, "relaysgd-trees", "dsgd-ring"),
        )
    ),
    expected_text=(
        "RelaySGD's claim carried over to natural heterogeneity: RelaySGD (trees) at most 2 pt "
        "below all-reduce and above D-SGD on the ring — worst-peer accuracy, mean over seeds."
    ),
    lr_note=(
        "One untuned lr for every row (1.0: the best of 0.1, 0.3, 0.6, 1.0 for all-reduce in "
        "smoke runs at n = 16); `--tune` runs each row's grid at the tune seed."
    ),
)


def relay_study(run_preset: Callable[[Preset, PresetRequest], Path]) -> Study:
    """``relaysgd-pystdlib`` as a study: the catalog preset's sweep and report (``run_preset``:
    `concord.lab.presets.run.run_preset`), then the corpus's host facts and the unigram /
    bigram references in its ``preset.json`` and, in its report before "Reproducibility", the
    held-out loss and perplexity per row and what carried over from MNIST-1D
    (`concord.lab.presets.pystdlib_report.relay_sections`)."""
    from concord.lab.presets import pystdlib_report as extra

    def main(request: PresetRequest) -> Path:
        out = run_preset(RELAYSGD_PYSTDLIB, request)
        if request.tune:
            return out
        path = out / "preset.json"
        meta = json.loads(path.read_text(encoding="utf-8"))
        names = [str(r["name"]) for r in meta.get("runs", [])]
        extra.record_corpus(out, names)
        meta = json.loads(path.read_text(encoding="utf-8"))
        if not meta.get("references"):
            items = ["engine=vectorized", *RELAYSGD_PYSTDLIB.base, *meta.get("overrides", [])]
            meta["references"] = extra.references(items)
            path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        report = out / "report.md"
        text = report.read_text(encoding="utf-8")
        head, sep, tail = text.partition("## Reproducibility")
        added = "\n".join(extra.relay_sections(out, meta["references"]))
        report.write_text(head + added + "\n" + sep + tail, encoding="utf-8")
        return out

    return Study(RELAYSGD_PYSTDLIB.name, RELAYSGD_PYSTDLIB.title, main)
