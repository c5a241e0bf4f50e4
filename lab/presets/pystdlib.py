"""Presets on the natural-heterogeneity task ``pystdlib-chars`` (next character of the Python
standard library's source, each peer holding whole top-level packages; `PYSTDLIB_RECIPE`).

- ``relaysgd-pystdlib`` (`RELAYSGD_PYSTDLIB`): RelaySGD vs D-SGD vs all-reduce under the
  by-package partition at n = 16 and 32 — a catalog preset.
- Consensus control's Table-2 shape on the same task: the ``consensus-control`` study with
  `CONSENSUS_PYSTDLIB_OVERRIDES` as its ``--set`` items (`consensus_pystdlib_command`); the study
  keeps its own cells (phases, targets, Ξ and Θ) and takes the task from the overrides.

The learning rates are untuned first choices (smoke runs; docs/algorithms.md, "A task with
natural heterogeneity"); ``--tune`` runs each row's grid.
"""

from __future__ import annotations

from collections.abc import Mapping

from concord.lab.presets.recipes import PYSTDLIB_RECIPE
from concord.lab.presets.spec import Preset, Relation, Setting, Setup

_PEERS = tuple(Setting(f"n{n}", f"n = {n}", {"peers": n}, n) for n in (16, 32))
_GOSSIP_GRID = (0.03, 0.1, 0.3)
_RELAY_GRID = (0.1, 0.3, 0.6)


def _lr(lr: float) -> Mapping[str, float]:
    return {c.key: lr for c in _PEERS}


RELAYSGD_PYSTDLIB = Preset(
    name="relaysgd-pystdlib",
    title="RelaySGD vs D-SGD vs all-reduce, stdlib packages per peer (char transformer)",
    setup=(
        "Next-character prediction on the running interpreter's standard library "
        "(`pystdlib-chars`: 40 000 windows of 64 characters, 10 % of each package held out, "
        "2 000 test windows evaluated), the 2-layer `char-transformer` (width 128, 4 heads), "
        "**16 and 32 peers**, each holding whole top-level packages (`partition.scheme = "
        '"groups"`: natural heterogeneity in vocabulary, style and size, as LEAF\'s '
        "Shakespeare by speaker), local batch 32, Nesterov 0.9, gradients clipped at norm 1, 5 % "
        "warm-up, LR ×0.1 at 50 % and 75 %, 8 epochs. Metric: the worst peer's next-character "
        "accuracy on the held-out windows (perplexity = exp(loss))."
    ),
    base=(*PYSTDLIB_RECIPE, "plan=gossip", "control.mode=none"),
    rows=(
        Setup(
            "allreduce",
            "all-reduce",
            {"algorithm": "allreduce", "topology": "complete"},
            _lr(0.1),
            _GOSSIP_GRID,
        ),
        Setup(
            "dsgd-ring",
            "D-SGD (ring)",
            {"algorithm": "dsgd", "topology": "ring"},
            _lr(0.1),
            _GOSSIP_GRID,
        ),
        Setup(
            "relaysgd-trees",
            "RelaySGD (double binary trees)",
            {"algorithm": "relaysgd", "topology": "double-binary-tree"},
            _lr(0.3),
            _RELAY_GRID,
        ),
        Setup(
            "relaysgd-chain",
            "RelaySGD (chain)",
            {"algorithm": "relaysgd", "topology": "chain"},
            _lr(0.3),
            _RELAY_GRID,
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
        "Untuned first choices (smoke runs at n = 4 and 16); `--tune` runs each row's grid at "
        "the tune seed."
    ),
)

CONSENSUS_PYSTDLIB_OVERRIDES: tuple[str, ...] = (*PYSTDLIB_RECIPE, "optim.lr=0.1")
"""``--set`` items that put the ``consensus-control`` study on ``pystdlib-chars`` (after its
MNIST-1D base, so these win: dataset, model, partition, recipe; the study's clip 2 / lr 0.2 fix
is replaced by clip 1 / lr 0.1)."""

CONSENSUS_PYSTDLIB_COLUMNS = ("n16", "n32")


def consensus_pystdlib_command() -> str:
    """The command line of consensus control's Table-2 shape on ``pystdlib-chars``."""
    sets = " ".join(f"--set '{item}'" for item in CONSENSUS_PYSTDLIB_OVERRIDES)
    columns = ",".join(CONSENSUS_PYSTDLIB_COLUMNS)
    return f"concord sweep --preset consensus-control --columns {columns} {sets}"
