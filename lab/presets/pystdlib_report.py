"""What the reports of the ``pystdlib-chars`` studies add to a sweep's own (`concord.lab.presets.
pystdlib`, `concord.lab.presets.consensus_pystdlib`): the held-out loss of each run, the unigram /
bigram references, the corpus's identity in ``preset.json``, and the ``relaysgd-pystdlib``
report's sections on loss and on what carried over from MNIST-1D.

- `final_loss`: the averaged model's test loss (nats) at a run's last evaluation
  (``metrics.jsonl``; the run summary holds accuracies only);
- `references`: `concord.core.data.pystdlib.reference_scores` of the study's dataset (seed 0),
  computed once when the sweep runs and kept in ``preset.json`` (``references``), so that a
  report rebuilt elsewhere (``--report-only``) shows the numbers of the corpus it ran on;
- `record_corpus`: the ``data.pystdlib-chars.*`` host facts a run recorded (its
  ``manifest.json``) merged into ``preset.json``'s ``host``, which ``concord report verify``
  compares (a different corpus: "corpus differs", `concord.lab.verify.rerun.cause_of`).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from concord.lab.report import CellStats, markdown_grid, pm

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
"""The committed reports (the MNIST-1D results the readings compare with)."""


def final_loss(run_dir: Path) -> float | None:
    """The averaged model's test loss at the last evaluation of the run in ``run_dir``."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    loss = None
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("kind") == "eval" and record.get("loss_avg_model") is not None:
            loss = float(record["loss_avg_model"])
    return loss


def references(overrides: Sequence[str]) -> dict[str, float]:
    """`reference_scores` of the study's dataset: the config of ``overrides`` ("dotted.key=value"
    items), its training windows at seed 0 and its first ``dataset.test_samples`` test windows."""
    from concord.core.config import load_config
    from concord.core.data.pystdlib import load_pystdlib_chars, reference_scores

    cfg = load_config(None, list(overrides), environ={})
    options = dict(cfg.dataset.options)
    data = load_pystdlib_chars(seed=0, num_samples=int(cfg.dataset.samples or 40000), **options)
    return reference_scores(data, cfg.dataset.test_samples)


def references_text(refs: Mapping[str, float]) -> str:
    """One paragraph: the unigram and bigram references (accuracy, loss, perplexity)."""
    if not refs:
        return "References: not recorded."
    parts = [
        f"{kind} {100 * refs[f'{kind}_accuracy']:.1f} % (loss {refs[f'{kind}_loss']:.3f} nats, "
        f"perplexity {math.exp(refs[f'{kind}_loss']):.2f})"
        for kind in ("unigram", "bigram")
    ]
    return (
        "References without context, on the same held-out windows (training windows of seed 0, "
        "`concord.core.data.pystdlib.reference_scores`): " + "; ".join(parts) + ". A model that "
        "learned beyond the previous character beats the bigram's accuracy and loss."
    )


def record_corpus(out: Path, run_names: Sequence[str]) -> dict[str, Any]:
    """Merge the ``data.*`` host facts of the first of ``run_names`` that recorded them (its
    ``runs/<name>/manifest.json``) into ``out/preset.json``'s ``host``; the facts merged."""
    facts: dict[str, Any] = {}
    for name in run_names:
        try:
            manifest = json.loads((out / "runs" / name / "manifest.json").read_text("utf-8"))
        except (OSError, ValueError):
            continue
        host = manifest.get("host") if isinstance(manifest, dict) else None
        if isinstance(host, dict):
            facts = {k: v for k, v in host.items() if str(k).startswith("data.")}
        if facts:
            break
    path = out / "preset.json"
    if facts and path.is_file():
        meta = json.loads(path.read_text(encoding="utf-8"))
        meta["host"] = {**(meta.get("host") or {}), **facts}
        path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return facts


def ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % confidence interval (Student's t; nan for one)."""
    stats = CellStats(tuple(values), len(values))
    return stats.mean, stats.ci95


def _float(value: object) -> float | None:
    try:
        x = float(str(value))
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _read_table(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _by_row(rows: Sequence[Mapping[str, str]], metric: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in rows:
        value = _float(r.get(metric, ""))
        if r.get("status") == "ok" and value is not None:
            out.setdefault(str(r["row"]), []).append(value)
    return out


HELDOUT_CSV = "heldout.csv"
"""The held-out loss of every run of a ``relaysgd-pystdlib`` report (name, row, seed,
``loss_avg_model``), written next to its ``table.csv`` while the run directories exist."""


def heldout_losses(out: Path, rows: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """Each run's final held-out loss: from its ``runs/<name>/metrics.jsonl`` when every
    finished run has one (then written to `HELDOUT_CSV`), else from `HELDOUT_CSV` (a report
    rebuilt from its committed CSVs)."""
    ok = [r for r in rows if r.get("status") == "ok"]
    found = {r["name"]: final_loss(out / "runs" / r["name"]) for r in ok}
    if ok and all(v is not None for v in found.values()):
        table = [{"name": r["name"], "row": r["row"], "seed": r.get("seed", ""),
                  "loss_avg_model": repr(found[r["name"]])} for r in ok]  # fmt: skip
        with open(out / HELDOUT_CSV, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(table[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(table)
    return _read_table(out / HELDOUT_CSV)


RELAY_ROWS = (
    ("allreduce", "all-reduce"),
    ("dsgd-ring", "D-SGD (ring)"),
    ("relaysgd-trees", "RelaySGD (double binary trees)"),
    ("relaysgd-chain", "RelaySGD (chain)"),
)
"""(row key of ``relaysgd-pystdlib``, row label of ``relaysgd-dirichlet``'s table.csv)."""


def relay_sections(out: Path, refs: Mapping[str, float]) -> list[str]:
    """The ``relaysgd-pystdlib`` report's added sections, from ``out/table.csv`` and each run's
    ``metrics.jsonl``: held-out loss and perplexity per row, the references, and a reading
    against the MNIST-1D results (``docs/results/relaysgd-dirichlet/table.csv``, α = 0.01)."""
    rows = _read_table(out / "table.csv")
    losses: dict[str, list[float]] = {}
    for r in heldout_losses(out, rows):
        if (loss := _float(r["loss_avg_model"])) is not None:
            losses.setdefault(str(r["row"]), []).append(loss)
    worst, avg = _by_row(rows, "accuracy_worst_peer"), _by_row(rows, "accuracy_avg_model")
    body = []
    for key, _ in RELAY_ROWS:
        label = next((r["row"] for r in rows if r["name"].startswith(key)), key)
        if label not in losses:
            continue
        mean_loss = ci(losses[label])
        body.append([label, str(len(losses[label])), pm(ci([100 * v for v in worst[label]])),
                     pm(ci([100 * v for v in avg[label]])), pm(mean_loss, 3),
                     f"{math.exp(mean_loss[0]):.2f}"])  # fmt: skip
    lines = [
        "## Held-out loss and perplexity (pystdlib-chars)",
        "",
        "Next-character accuracy (worst peer on 500 held-out windows, averaged model on all "
        "1 600) and the averaged model's loss at the last evaluation (nats; perplexity = exp of "
        "the mean loss); mean ± 95 % confidence interval (Student's t) over the seeds, from "
        f"[`{HELDOUT_CSV}`]({HELDOUT_CSV}) (each run's last evaluation in its `metrics.jsonl`).",
        "",
        *markdown_grid(
            ["row", "seeds", "worst peer (%)", "averaged model (%)", "loss (nats)", "perplexity"],
            body,
        ).splitlines(),
        "",
        references_text(refs),
        "",
    ]
    return lines + relay_reading(worst, avg, refs)


def relay_reading(
    worst: Mapping[str, Sequence[float]],
    avg: Mapping[str, Sequence[float]],
    refs: Mapping[str, float],
) -> list[str]:
    """What carried over from MNIST-1D (relaysgd-dirichlet, α = 0.01: the strongest skew) to the
    natural partition, each finding checked on this table's means (worst peer)."""
    mnist = _read_table(RESULTS / "relaysgd-dirichlet" / "table.csv")
    skewed = [r for r in mnist if r.get("column") == "α = 0.01"]
    base = {k: statistics.fmean(v) for k, v in _by_row(skewed, "accuracy_worst_peer").items()}
    here = {lab: statistics.fmean(worst[lab]) for lab in worst if worst[lab]}
    out = ["## Reading (computed from the tables)", ""]
    names = dict(RELAY_ROWS)
    have = [k for k, _ in RELAY_ROWS if names[k] in here]
    if not have:
        return [*out, "- no finished runs", ""]

    def get(table: Mapping[str, float], key: str) -> float | None:
        return table.get(names[key])

    findings = [
        ("RelaySGD (trees) above D-SGD (ring)", "relaysgd-trees", "dsgd-ring", 0.0),
        ("RelaySGD (trees) within 2 pp of all-reduce", "relaysgd-trees", "allreduce", -0.02),
        ("D-SGD (ring) ≥ 5 pp below all-reduce", "allreduce", "dsgd-ring", 0.05),
    ]
    for text, hi, lo, margin in findings:
        a, b = get(here, hi), get(here, lo)
        m_a, m_b = get(base, hi), get(base, lo)
        if a is None or b is None:
            continue
        mnist_holds = None if m_a is None or m_b is None else m_a - m_b > margin
        holds = a - b > margin
        mnist_text = ("not measured" if mnist_holds is None else
                      f"{'held' if mnist_holds else 'did not hold'} "
                      f"({100 * (m_a or 0):.2f} vs {100 * (m_b or 0):.2f} %)")  # fmt: skip
        verdict = "reproduced" if holds == mnist_holds else "**not reproduced**"
        if mnist_holds is False and not holds:
            verdict = "reproduced (absent in both)"
        out.append(
            f"- **{text}** — MNIST-1D α = 0.01: {mnist_text}; pystdlib by package: "
            f"{'holds' if holds else 'does not hold'} ({100 * a:.2f} vs {100 * b:.2f} %): "
            f"{verdict}."
        )
    bigram = refs.get("bigram_accuracy")
    if bigram is not None:
        below = [lab for lab, v in here.items() if v <= bigram]
        best = max(statistics.fmean(avg[lab]) for lab in avg if avg[lab])
        out.append(
            f"- **Learning beyond the bigram reference** ({100 * bigram:.1f} %): the best "
            f"averaged model reaches {100 * best:.2f} %; rows whose worst peer stays at or below "
            f"the bigram: {', '.join(below) if below else 'none'}."
        )
    out.append("")
    return out
