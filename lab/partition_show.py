"""``concord partition show``: what a run's data partition gives each peer, before any training.

`build_view` loads the run's dataset and builds its partition exactly as a run does
(`concord.core.task.load_task_data`, `concord.core.task.make_partition`) and summarises it with
`concord.core.data.partition.partition_stats`; `table_lines` prints one row per peer (samples,
share of the mean size, distinct labels, total-variation distance of its label distribution from
the global one, per-class counts) with the totals and the partition's SHA-256 digest;
`write_heatmap` draws the peer × class counts as a PNG.

Errors: a bad config, dataset or partition is a `ValueError` / `FileNotFoundError` (the command
prints its message); any other exception raised by a ``module:callable`` plug-in (a dataset or a
partition scheme of the user's, e.g. a ``SyntaxError`` while importing it) becomes a
`PluginError` naming the plug-in and where it failed. Only matplotlib's object API with the Agg
canvas is used (as `concord.runtime.plots`), never ``pyplot``.
"""

from __future__ import annotations

import math
import textwrap
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from concord.core.config import RunConfig
from concord.core.plugins import PluginError, is_spec
from concord.errors import ConcordError

MAX_CLASS_COLUMNS = 20
"""Up to this many classes the table has one count column per class; beyond, the top classes."""

TOP_CLASSES = 3  # classes listed per peer in the compact form
DIGEST_NOTE = "two machines built the same partition exactly when the digests match"

# the config keys each built-in scheme uses (a user scheme: partition.options)
_SCHEME_KEYS: dict[str, tuple[str, ...]] = {
    "dirichlet": ("alpha",),
    "sorted": ("shuffled_fraction",),
    "shards": ("shards_per_peer",),
    "powerlaw": ("exponent",),
}
_DPI = 110
_CELL_TEXT_PEERS, _CELL_TEXT_CLASSES = 24, 20  # counts written into the cells up to these sizes

T = TypeVar("T")


@dataclass(frozen=True)
class PartitionView:
    """A run's partition as `partition show` reports it. ``stats``: `partition_stats`'s dict;
    ``tv``: each peer's TV distance from the global label distribution (NaN: empty peer)."""

    dataset: str
    scheme: str
    params: dict[str, Any]
    seed: int
    num_classes: int
    stats: dict[str, Any]
    tv: list[float]

    @property
    def n(self) -> int:
        return int(self.stats["n"])

    @property
    def histograms(self) -> np.ndarray:
        """[n, num_classes] int64 counts."""
        return np.asarray(self.stats["histograms"], dtype=np.int64).reshape(
            self.n, self.num_classes
        )

    @property
    def digest(self) -> str:
        return str(self.stats["sha256"])

    def scheme_label(self) -> str:
        """``dirichlet (alpha=0.1)``; a scheme without parameters is its name alone."""
        if not self.params:
            return self.scheme
        return f"{self.scheme} ({', '.join(f'{k}={v!r}' for k, v in self.params.items())})"


def scheme_params(cfg: RunConfig) -> dict[str, Any]:
    """The parameters ``cfg``'s partition scheme uses: alpha for dirichlet, …; a user scheme's
    ``partition.options``."""
    p = cfg.partition
    if is_spec(p.scheme):
        return dict(p.options)
    return {k: getattr(p, k) for k in _SCHEME_KEYS.get(p.scheme, ())}


def _user_code(what: str, spec: str, call: Callable[[], T]) -> T:
    """``call()``; if ``spec`` is a plug-in, an exception of its own (not Concord's error for bad
    input) becomes a `PluginError` naming it and the line it failed at."""
    try:
        return call()
    except (ConcordError, PluginError):
        raise
    except Exception as exc:
        if not is_spec(spec):
            raise
        if isinstance(exc, SyntaxError) and exc.filename:  # importing it
            message, where = exc.msg, f" at {exc.filename}:{exc.lineno}"
        else:
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename[:1] != "<"]
            message = str(exc)
            where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        raise PluginError(
            f"{what} {spec!r} failed: {type(exc).__name__}: {message}{where}"
        ) from exc


def build_view(cfg: RunConfig) -> PartitionView:
    """Load ``cfg``'s dataset, build its partition as a run does and summarise it."""
    from concord.core.data.partition import partition_stats
    from concord.core.task import load_task_data, make_partition

    data = _user_code("dataset", cfg.dataset.name, lambda: load_task_data(cfg))
    parts = _user_code("partition scheme", cfg.partition.scheme, lambda: make_partition(cfg, data))
    labels = data.y_train.numpy()
    stats = partition_stats(labels, parts, data.num_classes)
    return PartitionView(
        dataset=data.name,
        scheme=cfg.partition.scheme,
        params=scheme_params(cfg),
        seed=cfg.seed,
        num_classes=data.num_classes,
        stats=stats,
        tv=[math.nan if v is None else float(v) for v in stats["tv_distances"]],
    )


def _top_classes(row: np.ndarray) -> str:
    held = np.flatnonzero(row)
    order = held[np.argsort(-row[held], kind="stable")]
    shown = " ".join(f"{int(c)}:{int(row[c])}" for c in order[:TOP_CLASSES])
    more = len(order) - TOP_CLASSES
    return f"{shown} (+{more})" if more > 0 else shown or "-"


def table_lines(view: PartitionView) -> list[str]:
    """The per-peer table, a totals row and the summary lines (digest last)."""
    s = view.stats
    H = view.histograms
    C = view.num_classes
    mean = float(s["mean_size"])
    per_class = C <= MAX_CLASS_COLUMNS
    head = ["peer", "samples", "share", "labels", "TV"]
    head += [str(c) for c in range(C)] if per_class else ["largest classes (class:count)"]
    rows: list[list[str]] = []
    for i in range(view.n):
        size = int(s["sizes"][i])
        tv = view.tv[i]
        row = [
            str(i),
            str(size),
            f"{size / mean:.2f}" if mean else "-",
            str(s["labels_per_peer"][i]),
            "-" if math.isnan(tv) else f"{tv:.3f}",
        ]
        row += [str(int(v)) for v in H[i]] if per_class else [_top_classes(H[i])]
        rows.append(row)
    totals = H.sum(0)
    total_row = ["all", str(s["num_samples"]), "", str(int((totals > 0).sum())), ""]
    if per_class:
        total_row += [str(int(v)) for v in totals]
    else:
        total_row += [f"{C} classes, {int(totals.min())}-{int(totals.max())} samples each"]
    widths = [max(len(r[j]) for r in [head, *rows, total_row]) for j in range(len(head))]
    last = len(head) - 1

    def fmt(cells: list[str]) -> str:
        out = [
            c.ljust(w) if j == last and not per_class else c.rjust(w)
            for j, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    rule = "-" * len(fmt(["-" * w for w in widths]))
    return [
        f"dataset {view.dataset}: {s['num_samples']} training samples, {C} classes; partition "
        f"{view.scheme_label()}, n={view.n} peers, seed {view.seed}",
        "share: samples / mean samples per peer; labels: distinct labels held; TV: total",
        "variation distance of the peer's label distribution from the global one (0 = same, "
        "1 = disjoint)",
        "",
        fmt(head),
        rule,
        *(fmt(r) for r in rows),
        rule,
        fmt(total_row),
        "",
        f"sizes: mean {mean:.1f}, min {s['min_size']} ({s['min_share']:.2f}x the mean), max "
        f"{s['max_size']} ({s['max_share']:.2f}x); TV: mean {s['mean_tv_distance']:.3f}, max "
        f"{s['max_tv_distance']:.3f}",
        f"sha256 {view.digest}",
        f"({DIGEST_NOTE})",
    ]


def _tick_locator(count: int, length_in: float) -> MaxNLocator:
    """Integer ticks, at most one per ~11 pt of ``length_in`` inches and at most 40."""
    bins = max(2, min(40, count, int(length_in * 72 / 11)))
    return MaxNLocator(nbins=bins, integer=True, steps=[1, 2, 4, 5, 8, 10])


def write_heatmap(view: PartitionView, path: Path) -> Path:
    """A PNG of the peer × class counts: peers on y (0 at the top), classes on x, a colour bar,
    the peer sizes in a side panel; the title names dataset, scheme and its parameters, n, seed.
    The height grows with n up to a cap and the tick labels thin out, so 256 peers stay legible."""
    H = view.histograms
    n, C = H.shape
    heat_w = min(12.0, max(4.5, 1.5 + 0.32 * C))
    height = min(16.0, max(3.6, 1.6 + 0.2 * n))
    fig = Figure(figsize=(heat_w + 2.8, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax, side = fig.subplots(1, 2, sharey=True, width_ratios=[heat_w, 1.4])
    im = ax.imshow(H, aspect="auto", interpolation="nearest", cmap="YlGnBu", vmin=0)
    ax.set_xlabel("class")
    ax.set_ylabel("peer")
    ax.xaxis.set_major_locator(_tick_locator(C, heat_w))
    ax.yaxis.set_major_locator(_tick_locator(n, height - 1.6))
    ax.tick_params(labelsize=7 if n > 32 or C > 32 else 8)
    if n <= _CELL_TEXT_PEERS and C <= _CELL_TEXT_CLASSES:
        top = max(int(H.max()), 1)
        for (i, c), v in np.ndenumerate(H):
            if v:
                colour = "white" if v > 0.55 * top else "black"
                ax.text(c, i, str(int(v)), ha="center", va="center", fontsize=6, color=colour)
    side.barh(np.arange(n), H.sum(1), height=0.8 if n <= 64 else 1.0, color="0.45")
    side.set_xlabel("samples")
    side.tick_params(labelleft=False, labelsize=7)
    side.xaxis.set_major_locator(MaxNLocator(nbins=3, integer=True))
    side.grid(axis="x", alpha=0.3)
    side.set_axisbelow(True)
    fig.colorbar(
        im,
        ax=[ax, side],
        location="right",
        label="samples of the class",
        pad=0.02,
        fraction=0.05,
        aspect=min(60.0, 6 * height),
    )
    width_chars = int((heat_w + 2.8) * 11)
    title = f"{view.dataset} · {view.scheme_label()} · n = {n}"
    sub = (
        f"seed {view.seed} · {view.stats['num_samples']} samples · mean TV "
        f"{view.stats['mean_tv_distance']:.3f} · sha256 {view.digest[:12]}"
    )
    fig.suptitle(textwrap.fill(title, width_chars) + "\n" + sub, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=_DPI)
    return path
