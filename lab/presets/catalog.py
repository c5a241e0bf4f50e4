"""The presets of ``concord sweep --preset`` (see `concord.lab.presets` for what a preset is).

Sizes are chosen so that a full report (3 seeds, ``--jobs 1``) takes about a quarter of an hour on
a 2-core CPU with the vectorized engine. The lrs of the rows are the ``--tune`` choices (best lr
of the row's grid at the tune seed, per column, by the preset's metric); the tuning reports are
committed in ``docs/results/<preset>/lr-tuning/``.
"""

from __future__ import annotations

from collections.abc import Mapping

from concord.lab.presets.spec import Preset, Relation, Setting, Setup

# ---------------------------------------------------------------------------------------------
# RelaySGD vs gossip under Dirichlet heterogeneity (Vogels et al. 2021, Table 2;
# docs/algorithms.md#relaysgd)

_ALPHAS = (("a1", "α = 1", 1.0), ("a0.1", "α = 0.1", 0.1), ("a0.01", "α = 0.01", 0.01))
_GOSSIP_GRID = (0.025, 0.05, 0.1, 0.2, 0.4)


def _per_alpha(a1: float, a01: float, a001: float) -> Mapping[str, float]:
    return {"a1": a1, "a0.1": a01, "a0.01": a001}


RELAYSGD_DIRICHLET = Preset(
    name="relaysgd-dirichlet",
    title="RelaySGD vs D-SGD/QGM/D²/SGP under Dirichlet heterogeneity (MNIST-1D, n = 16)",
    setup=(
        "RelaySum (Vogels et al., NeurIPS 2021) Table 2 scaled down to one CPU: MNIST-1D generated "
        "locally (20 000 samples, 16 000 for training, 4 000 test), the `cnn1d` model, **16 "
        "peers**, Dirichlet partition of the training set with the 10-worker grouping of "
        "docs/algorithms.md#data-partitions (α ∈ {1, 0.1, 0.01}), local batch 16, local "
        "Nesterov momentum 0.9 "
        "(QGM: its quasi-global momentum β = 0.9 instead), weight decay 1e-4, 5 % linear warm-up, "
        "LR ×0.1 at 50 % and 75 %, 16 epochs (992 steps). Metric: the **worst peer's** test "
        "accuracy after the last step (the paper's metric; every replica on the whole test set), "
        "and the averaged model's. D² runs on the lazy ring κ = 0.9 (the ring of 16 with weights "
        "⅓ has λ_min = −⅓ exactly, which D² rejects); SGP on the time-varying directed one-peer "
        "exponential graph; RelaySGD on double binary trees (coordinates split by parity) and on "
        "the chain."
    ),
    base=(
        "peers=16",
        "dataset.name=mnist1d",
        "dataset.samples=20000",
        "model.name=cnn1d",
        "partition.scheme=dirichlet",
        "epochs=16",
        "optim.batch_size=16",
        "optim.momentum=0.9",
        "optim.nesterov=true",
        "optim.weight_decay=1e-4",
        "optim.warmup=0.05",
        "optim.milestones=[0.5, 0.75]",
        "plan=gossip",
        "control.mode=none",
        "eval.every=1.0",
        "threads=1",
    ),
    rows=(
        Setup(
            "allreduce",
            "all-reduce",
            {"algorithm": "allreduce", "topology": "complete"},
            _per_alpha(0.1, 0.2, 0.1),
            (0.05, 0.1, 0.2),
        ),
        Setup(
            "dsgd-ring",
            "D-SGD (ring)",
            {"algorithm": "dsgd", "topology": "ring"},
            _per_alpha(0.2, 0.1, 0.1),
            _GOSSIP_GRID,
        ),
        Setup(
            "qgm-ring",
            "D-SGD + QGM (ring)",
            {"algorithm": "qgm", "topology": "ring"},
            _per_alpha(0.2, 0.2, 0.2),
            _GOSSIP_GRID,
        ),
        Setup(
            "d2-ring",
            "D² (ring, κ = 0.9)",
            {"algorithm": "d2", "topology": "ring", "kappa": 0.9},
            _per_alpha(0.2, 0.1, 0.1),
            _GOSSIP_GRID,
        ),
        Setup(
            "sgp-expo",
            "SGP (time-varying exponential)",
            {"algorithm": "sgp", "topology": "exponential-one-peer-directed"},
            _per_alpha(0.2, 0.2, 0.1),
            _GOSSIP_GRID,
        ),
        Setup(
            "relaysgd-trees",
            "RelaySGD (double binary trees)",
            {"algorithm": "relaysgd", "topology": "double-binary-tree"},
            _per_alpha(0.6, 0.6, 0.3),
            (0.15, 0.3, 0.6, 1.2),
        ),
        Setup(
            "relaysgd-chain",
            "RelaySGD (chain)",
            {"algorithm": "relaysgd", "topology": "chain"},
            _per_alpha(1.0, 0.5, 1.0),
            (0.125, 0.25, 0.5, 1.0),
        ),
        # Stability checks: one tune seed put two choices at the edge of stability (all-reduce
        # 0.2 at α = 0.1, chain 1.0 at α = 1 and 0.01; see the report); the next grid value down.
        Setup(
            "allreduce-lr0.1",
            "all-reduce, lr 0.1 (next below the tuned 0.2)",
            {"algorithm": "allreduce", "topology": "complete"},
            {"a0.1": 0.1},
            (0.1,),
            only=("a0.1",),
        ),
        Setup(
            "relaysgd-chain-lr0.5",
            "RelaySGD (chain), lr 0.5 (next below the tuned 1.0)",
            {"algorithm": "relaysgd", "topology": "chain"},
            {"a1": 0.5, "a0.01": 0.5},
            (0.5,),
            only=("a1", "a0.01"),
        ),
    ),
    columns=tuple(Setting(key, label, {"partition.alpha": a}, a) for key, label, a in _ALPHAS),
    column_name="Dirichlet α",
    metric="worst",
    expected=(
        Relation("a0.01", "relaysgd-trees", "allreduce", -0.02),
        Relation("a0.01", "relaysgd-chain", "allreduce", -0.02),
        Relation("a0.01", "relaysgd-trees", "d2-ring", 0.05),
        Relation("a0.01", "relaysgd-trees", "qgm-ring", 0.05),
        Relation("a0.01", "d2-ring", "dsgd-ring"),
        Relation("a0.01", "qgm-ring", "dsgd-ring"),
    ),
    expected_text=(
        "docs/algorithms.md#reproduction-targets item 7: at α = 0.01, RelaySGD (trees/chain) "
        "≈ all-reduce ≫ D²/QGM > "
        "D-SGD (ring) (paper, CIFAR-10/VGG-11 with momentum: 89.1 vs 90.2 vs 61–63 vs 53.9 %). "
        "Encoded as: RelaySGD at most 2 pt below all-reduce, RelaySGD (trees) more than 5 pt "
        "above D² and QGM, D² and QGM above D-SGD — worst-peer accuracy, mean over seeds."
    ),
    lr_note=(
        "Each row's lr grid (paper: {lr_c/8 … 2 lr_c} around the centralized lr_c, §5.7; "
        "RelaySGD's grid reaches the paper's ×3 (trees) / ×5 (chain) factors over all-reduce, "
        "§5.5) was run once per α at the tune seed; the lr with the best worst-peer accuracy "
        "was kept (grid, scores and choices: [lr-tuning/report.md](lr-tuning/report.md))."
    ),
    log_x=True,
)

# ---------------------------------------------------------------------------------------------
# DeTAG on unshuffled (label-sorted) data (Lu & De Sa 2021, §7; docs/algorithms.md#detag-and-dsgt)

_FRACTIONS = (("x0", "0 % shuffled", 0.0), ("x25", "25 % shuffled", 0.25),
              ("x50", "50 % shuffled", 0.5), ("x100", "100 % shuffled", 1.0))  # fmt: skip
_DETAG_GRID = (0.01, 0.03, 0.1, 0.3)


def _per_fraction(unshuffled: float, shuffled: float) -> Mapping[str, float]:
    """lr for X ∈ {0, 25, 50} % (tuned at X = 0) and for X = 100 % (tuned there): the paper's
    tuned lrs are the same for 0, 25 and 50 % for every algorithm but D² (Table 3, §6.6)."""
    return {"x0": unshuffled, "x25": unshuffled, "x50": unshuffled, "x100": shuffled}


DETAG_UNSHUFFLED = Preset(
    name="detag-unshuffled",
    title="DeTAG vs D-SGD/D²/DSGT on label-sorted data (MNIST-1D, ring of 8)",
    setup=(
        'DeTAG (Lu & De Sa, ICML 2021) §7 "unshuffled data" at MNIST-1D scale: MNIST-1D '
        "(20 000 samples, 16 000 for training), `cnn1d`, **8 peers on a ring** (weights ⅓), the "
        "training set sorted by label with the first X % of it shuffled and then cut into 8 "
        "equal consecutive parts (X ∈ {0, 25, 50, 100}; at X = 0 every peer holds one or two "
        "classes), local batch 16, heavy-ball momentum 0.9 (the tracker of DSGT/DeTAG then "
        "tracks the momentum direction — DeTAGM), weight decay 1e-4, 5 % linear warm-up, LR "
        "×0.1 at 50 % and 75 %, 8 epochs (1 000 steps). One step = one stochastic gradient per "
        "peer; DeTAG then runs R = 2 accelerated gossip rounds (η = 0.2, the paper's choice for "
        "sorted data; order of Algorithm 2: the tracker used for the step is one step old), "
        "DeTAG* the same R and η in the §6.5 order (the step's gradient enters the tracker "
        "first), all others one round; DSGT sends model and tracker (2× D-SGD's bytes), "
        "DeTAG and DeTAG* twice that. D² uses the lazy "
        "ring κ = 0.9 (λ_min = −⅓ on an even ring). The slack rows use W_κ = κW + (1 − κ)I with "
        "κ = 0.01 (spectral gap 0.0020 instead of 0.195): DSGT vs DeTAG with η = 0.4, R = 2 "
        "(the paper's κ = 0.01 choice), run on the fully sorted data (X = 0) only. Metric: the "
        "averaged model's test accuracy after the last step; the worst peer's and the final "
        "training loss (mean over peers of the local mini-batch loss, last 10 % of the steps) "
        "are reported too."
    ),
    base=(
        "peers=8",
        "topology=ring",
        "dataset.name=mnist1d",
        "dataset.samples=20000",
        "model.name=cnn1d",
        "partition.scheme=sorted",
        "epochs=8",
        "optim.batch_size=16",
        "optim.momentum=0.9",
        "optim.nesterov=false",
        "optim.weight_decay=1e-4",
        "optim.warmup=0.05",
        "optim.milestones=[0.5, 0.75]",
        "plan=gossip",
        "control.mode=none",
        "eval.every=0.5",
        "threads=1",
    ),
    rows=(
        Setup(
            "dsgd",
            "D-SGD",
            {"algorithm": "dsgd"},
            _per_fraction(0.1, 0.1),
            _DETAG_GRID,
        ),
        Setup(
            "d2",
            "D² (κ = 0.9)",
            {"algorithm": "d2", "kappa": 0.9},
            _per_fraction(0.1, 0.1),
            _DETAG_GRID,
        ),
        Setup("dsgt", "DSGT", {"algorithm": "dsgt"}, _per_fraction(0.1, 0.1), _DETAG_GRID),
        Setup(
            "detag",
            "DeTAG (R = 2, η = 0.2)",
            {"algorithm": "detag", "hyper.rounds": 2, "hyper.eta": 0.2},
            _per_fraction(0.01, 0.03),
            _DETAG_GRID,
        ),
        Setup(
            "detag-star",
            "DeTAG* (R = 2, η = 0.2, gradient first)",
            {"algorithm": "detag", "hyper.rounds": 2, "hyper.eta": 0.2, "hyper.order": "detag*"},
            _per_fraction(0.1, 0.1),
            _DETAG_GRID,
        ),
        Setup(
            "dsgt-k0.01",
            "DSGT (W_κ, κ = 0.01)",
            {"algorithm": "dsgt", "kappa": 0.01},
            {"x0": 0.1},
            _DETAG_GRID,
            only=("x0",),
        ),
        Setup(
            "detag-k0.01",
            "DeTAG (W_κ, κ = 0.01, R = 2, η = 0.4)",
            {"algorithm": "detag", "kappa": 0.01, "hyper.rounds": 2, "hyper.eta": 0.4},
            {"x0": 0.03},
            _DETAG_GRID,
            only=("x0",),
        ),
    ),
    columns=tuple(
        Setting(key, label, {"partition.shuffled_fraction": x}, x) for key, label, x in _FRACTIONS
    ),
    column_name="shuffled fraction X",
    tune_columns=("x0", "x100"),
    metric="avg",
    expected=(
        *(
            rel
            for col in ("x0", "x25", "x50")
            for rel in (
                Relation(col, "dsgt", "dsgd"),
                Relation(col, "detag", "dsgd"),
                Relation(col, "detag", "dsgt", -0.01),
                Relation(col, "detag-star", "dsgd"),
                Relation(col, "detag-star", "dsgt", -0.01),
                Relation(col, "dsgt", "d2"),
            )
        ),
        Relation("x0", "detag-k0.01", "dsgt-k0.01"),
    ),
    expected_text=(
        "docs/algorithms.md#reproduction-targets item 9 and the paper's curves: with 0–50 % "
        "shuffled data D-PSGD "
        "(D-SGD) stalls while DSGT and DeTAG (R = 2, η = 0.2) converge, DeTAG fastest and DSGT "
        "more stable than D²; with W_κ, κ = 0.01, DeTAG (η = 0.4, R = 2) beats DSGT; with fully "
        "shuffled data all are similar. Encoded per column X ∈ {0, 25, 50} %: DSGT > D-SGD, "
        "DeTAG (and DeTAG*) > D-SGD, DeTAG (and DeTAG*) at most 1 pt below DSGT, DSGT > D²; "
        "at X = 0: DeTAG(κ) > DSGT(κ) — averaged-model accuracy, mean over seeds."
    ),
    lr_note=(
        "Each row's lr grid {0.01, 0.03, 0.1, 0.3} (the paper tuned each algorithm per shuffling "
        "level on a grid, §6.6) was run at the tune seed on the sorted data (X = 0) and on the "
        "shuffled data (X = 100 %); the lr with the best averaged-model accuracy was kept, the "
        "X = 0 choice also for X = 25 % and 50 % (the paper's tuned lrs coincide for 0/25/50 %, "
        "Table 3); grid, scores and choices: [lr-tuning/report.md](lr-tuning/report.md)."
    ),
)

PRESETS: Mapping[str, Preset] = {p.name: p for p in (RELAYSGD_DIRICHLET, DETAG_UNSHUFFLED)}
"""Every preset by name."""


def get_preset(name: str) -> Preset:
    """The preset called ``name``; ValueError naming the valid ones otherwise."""
    if name not in PRESETS:
        names = [*PRESETS, "consensus-control"]
        raise ValueError(f"unknown preset {name!r}; valid: {', '.join(names)}")
    return PRESETS[name]


def list_presets() -> list[tuple[str, str]]:
    """(name, title) of every preset (``consensus-control``: its own grid,
    `concord.lab.presets.consensus`)."""
    from concord.lab.presets.consensus import NAME, TITLE

    return [*((p.name, p.title) for p in PRESETS.values()), (NAME, TITLE)]
