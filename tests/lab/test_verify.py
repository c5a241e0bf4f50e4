"""`concord report verify DIR`: tiny real reports (a generic preset's and consensus-control's) are
built once, then a cell is re-run and compared; a tampered CSV fails naming the metric; bad input
exits 2 with the problem and the valid choices; the configuration comes from the run manifest
(preset.json) only: a report without one, or with a version or run it lacks, is a clear error."""

from __future__ import annotations

import csv
import io
import json
import shutil
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from concord.lab.cli import main
from concord.lab.presets import preset_main
from concord.lab.presets.report import (
    MANIFEST_VERSION,
    environment,
    reproducibility_section,
    run_manifest,
)
from concord.lab.sweep import SweepRun
from concord.lab.verify import RECORD_COLUMNS, VerifyError, load_target

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["peers=4", "dataset.samples=600", "epochs=1", "eval.every=0.5"]


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """relaysgd-dirichlet, 2 rows × 1 column × 2 seeds, 4 peers, a few steps (about 10 s)."""
    out = tmp_path_factory.mktemp("verify") / "tiny"
    preset_main(
        "relaysgd-dirichlet",
        seeds=[0, 1],
        jobs=1,
        out_dir=out,
        overrides=TINY,
        rows=["allreduce", "dsgd-ring"],
        columns=["a0.01"],
        console=Console(file=io.StringIO()),
    )
    return out


def _copy(report: Path, dest: Path, names: tuple[str, ...]) -> Path:
    dest.mkdir()
    for name in names:
        shutil.copy(report / name, dest / name)
    return dest


def _table(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _verify(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["report", "verify", *args])
    return result.exit_code, result.output


def test_the_report_records_its_machine_runs_and_bytes_plot(tiny_report: Path) -> None:
    meta = json.loads((tiny_report / "preset.json").read_text())
    env = environment(threads=1, jobs=1)
    for key in ("torch", "cpu", "cores", "python"):
        assert meta[key] == env[key], key
    assert meta["threads"] == 1  # the preset's threads=1, not cores // jobs
    assert meta["engine"] == "vectorized"
    assert meta["set"] == TINY
    assert "peers=16" in meta["base"]
    runs = {r["name"]: r for r in meta["runs"]}
    assert set(runs) == {r["name"] for r in _table(tiny_report / "table.csv")}
    dsgd = runs["dsgd-ring_a0.01_s1"]
    assert (dsgd["row_key"], dsgd["column_key"], dsgd["seed"]) == ("dsgd-ring", "a0.01", 1)
    assert dsgd["overrides"] == {"partition.alpha": 0.01, "algorithm": "dsgd", "topology": "ring",
                                 "optim.lr": 0.1, "seed": 1}  # fmt: skip
    report = (tiny_report / "report.md").read_text()
    section = report[report.index("## Reproducibility") :]
    assert f"torch {env['torch']}" in section
    assert env["cpu"] in section
    assert "1 torch thread(s) per run" in section
    assert "machine-dependent" in section
    assert "51.78 %" in section
    assert "61.37 %" in section
    assert f"concord report verify {tiny_report} --run allreduce_a0.01_s0" in section
    assert "](bytes.png)" in report
    data = (tiny_report / "bytes.png").read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000  # drawn points, not an empty canvas


def test_verify_reruns_the_first_run_and_it_matches(tiny_report: Path, tmp_path: Path) -> None:
    code, out = _verify(str(tiny_report), "--out", str(tmp_path / "rerun"))
    assert code == 0, out
    assert "run: allreduce_a0.01_s0 — the first run of" in out
    assert "config: the configuration recorded in preset.json" in out
    for metric in ("accuracy (averaged model)", "accuracy (worst peer)", "gossip rounds",
                   "bytes sent (all peers)"):  # fmt: skip
        line = next(ln for ln in out.splitlines() if ln.startswith(metric))
        assert line.rstrip().endswith("ok"), line
    assert "0.5 pp" in out
    assert "exact" in out
    torch_line = next(ln for ln in out.splitlines() if ln.startswith("torch "))
    assert torch_line.rstrip().endswith("same")
    assert "reproduces: every metric within tolerance" in out
    assert (tmp_path / "rerun" / "runs" / "allreduce_a0.01_s0" / "summary.json").is_file()
    # the same --out again would mix two re-runs
    code, out = _verify(str(tiny_report), "--out", str(tmp_path / "rerun"))
    assert code == 2
    assert "already holds runs/allreduce_a0.01_s0" in out


def test_a_tampered_accuracy_fails_naming_the_metric(tiny_report: Path, tmp_path: Path) -> None:
    report = _copy(tiny_report, tmp_path / "copy", ("table.csv", "preset.json", "report.md"))
    rows = _table(report / "table.csv")
    target = next(r for r in rows if r["name"] == "dsgd-ring_a0.01_s1")
    target["accuracy_avg_model"] = str(float(target["accuracy_avg_model"]) + 0.02)  # +2 pp
    with open(report / "table.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    code, out = _verify(
        str(report), "--row", "dsgd-ring", "--column", "a0.01", "--seed", "1", "--out",
        str(tmp_path / "r1"),
    )  # fmt: skip
    assert code == 1, out
    line = next(ln for ln in out.splitlines() if ln.startswith("accuracy (averaged model)"))
    assert "2.00 pp" in line
    assert line.rstrip().endswith("DIFFERS")
    worst = next(ln for ln in out.splitlines() if ln.startswith("accuracy (worst peer)"))
    assert worst.rstrip().endswith("ok")
    assert "DIFFERS in accuracy (averaged model)" in out
    assert "on the recorded torch, CPU and thread count: not explained by the machine" in out
    # a wider tolerance accepts it
    code, out = _verify(
        str(report), "--run", "dsgd-ring_a0.01_s1", "--tol", "2.5", "--out", str(tmp_path / "r2")
    )
    assert code == 0, out


def test_bad_input_exits_2_naming_what_and_where(tiny_report: Path, tmp_path: Path) -> None:
    code, out = _verify(str(tmp_path / "missing"))
    assert code == 2
    assert f"report directory {tmp_path / 'missing'} does not exist" in out
    code, out = _verify(str(tmp_path))
    assert code == 2
    assert f"{tmp_path} has no preset.json" in out  # not a report directory
    code, out = _verify(str(tiny_report), "--run", "nope_s0")
    assert code == 2
    assert f"no run 'nope_s0' in {tiny_report / 'table.csv'}; runs: allreduce_a0.01_s0," in out
    assert "rows: allreduce, dsgd-ring; columns: a0.01; seeds: 0, 1" in out
    code, out = _verify(str(tiny_report), "--row", "qgm-ring", "--column", "a0.01")
    assert code == 2
    assert "no row 'qgm-ring' in" in out
    assert "rows: allreduce, dsgd-ring" in out
    code, out = _verify(str(tiny_report), "--row", "allreduce", "--column", "a0.01", "--seed", "7")
    assert code == 2
    assert "row 'allreduce', column 'a0.01' has no seed 7" in out
    assert "its seeds: 0, 1" in out
    code, out = _verify(str(tiny_report), "--run", "allreduce_a0.01_s0", "--row", "allreduce")
    assert code == 2
    assert "either --run NAME or --row/--column/--seed" in out
    code, out = _verify(str(tiny_report), "--row", "allreduce")
    assert code == 2
    assert "--row and --column go together" in out


def _tamper(report: Path, dest: Path, run: str, cpu: str | None = None) -> Path:
    """A copy of ``report`` whose ``run`` claims 2 pp more accuracy (averaged model); ``cpu``:
    the machine its preset.json records instead of this one."""
    copy = _copy(report, dest, ("table.csv", "preset.json", "report.md"))
    rows = _table(copy / "table.csv")
    target = next(r for r in rows if r["name"] == run)
    target["accuracy_avg_model"] = str(float(target["accuracy_avg_model"]) + 0.02)
    with open(copy / "table.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    if cpu is not None:
        meta = json.loads((copy / "preset.json").read_text())
        meta["cpu"] = cpu
        (copy / "preset.json").write_text(json.dumps(meta))
    return copy


def _markdown_tables(text: str) -> dict[tuple[str, str], dict[str, list[str]]]:
    """(directory, run) → metric → the cells of its row, from the record's markdown."""
    tables: dict[tuple[str, str], dict[str, list[str]]] = {}
    section: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("## `"):
            directory, _, run = line.removeprefix("## `").partition("`: run `")
            section = tables.setdefault((directory, run.removesuffix("`")), {})
        elif line.startswith("| ") and not line.startswith(("| metric", "| ---")):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            section[cells[0]] = cells[1:]
    return tables


def _number_of(cell: str) -> str:
    """A markdown table cell as the CSV writes it: no unit, no thousands separators."""
    return cell.removesuffix(" %").removesuffix(" pp").replace(",", "")


def test_several_reports_write_one_record(tiny_report: Path, tmp_path: Path) -> None:
    second = _copy(tiny_report, tmp_path / "second", ("table.csv", "preset.json", "report.md"))
    record = tmp_path / "record"
    args = [str(tiny_report), f"{second}::dsgd-ring_a0.01_s1", "--out", str(tmp_path / "re"),
            "--csv", str(record / "verify.csv"), "--markdown",
            str(record / "report.md")]  # fmt: skip
    code, out = _verify(*args)
    assert code == 0, out
    assert f"=== 1/2: {tiny_report} ===" in out
    assert f"=== 2/2: {second} ===" in out
    assert "summary: 2 of 2 cells reproduced within tolerance, 0 differ." in out
    assert (tmp_path / "re" / "1-tiny" / "runs" / "allreduce_a0.01_s0" / "summary.json").is_file()
    assert (tmp_path / "re" / "2-second" / "runs" / "dsgd-ring_a0.01_s1" / "summary.json").is_file()
    with open(record / "verify.csv", newline="", encoding="utf-8") as f:
        assert next(csv.reader(f)) == list(RECORD_COLUMNS)
    rows = _table(record / "verify.csv")
    metrics = ["accuracy (averaged model)", "accuracy (worst peer)", "gossip rounds",
               "bytes sent (all peers)"]  # fmt: skip
    assert [(r["directory"], r["run"], r["metric"]) for r in rows] == [
        *((str(tiny_report), "allreduce_a0.01_s0", m) for m in metrics),
        *((str(second), "dsgd-ring_a0.01_s1", m) for m in metrics),
    ]
    committed = {r["name"]: r for r in _table(tiny_report / "table.csv")}
    env = environment(threads=1, jobs=1)
    for r in rows:
        source = committed[r["run"]]
        assert r["verdict"] == "ok", r
        assert (r["recorded_torch"], r["recorded_cpu"], r["recorded_threads"]) == (
            env["torch"], env["cpu"], "1")  # fmt: skip
        assert (r["this_torch"], r["this_cpu"], r["this_threads"]) == (
            env["torch"],
            env["cpu"],
            "1",
        )
        assert r["same_machine"] == "true"
        if r["metric"].startswith("accuracy"):
            column = "accuracy_avg_model" if "averaged" in r["metric"] else "accuracy_worst_peer"
            assert r["unit"] == "%"
            assert r["committed"] == f"{100 * float(source[column]):.4f}"
            assert float(r["abs_delta"]) <= float(r["tolerance"]) == 0.5
        else:
            column = "gossip_rounds_total" if "rounds" in r["metric"] else "bytes_sent_total"
            assert r["unit"] == ("rounds" if "rounds" in r["metric"] else "bytes")
            assert r["committed"] == source[column] == r["rerun"]
            assert (r["abs_delta"], r["tolerance"]) == ("0", "0")  # exact
    text = (record / "report.md").read_text()
    assert text.startswith("# Reproducibility check\n")
    assert "every number from `verify.csv`" in text
    assert f"```bash\nconcord report verify {' '.join(args)}\n```" in text
    assert f"torch {env['torch']}, Python {env['python']}, CPU {env['cpu']}" in text
    assert f"{env['cores']} logical cores, 1 torch thread(s) per run" in text
    assert "2 of 2 cells reproduced within tolerance, 0 differ." in text
    assert "machine-dependent" in text
    assert "![re-run minus committed accuracy](report.png)" in text
    assert (record / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tables = _markdown_tables(text)
    assert list(tables) == [(str(tiny_report), "allreduce_a0.01_s0"),
                            (str(second), "dsgd-ring_a0.01_s1")]  # fmt: skip
    for r in rows:
        shown = tables[r["directory"], r["run"]][r["metric"]]
        assert [_number_of(c) for c in shown[:3]] == [r["committed"], r["rerun"], r["abs_delta"]]
        assert shown[3] == ("0.5 pp" if r["unit"] == "%" else "exact")
        assert shown[4] == r["verdict"]


def test_a_tampered_value_differs_in_the_record(tiny_report: Path, tmp_path: Path) -> None:
    run = "dsgd-ring_a0.01_s1"
    here = _tamper(tiny_report, tmp_path / "here", run)
    there = _tamper(tiny_report, tmp_path / "there", run, cpu="Another CPU @ 1.0GHz")
    csv_path, md_path = tmp_path / "verify.csv", tmp_path / "out" / "report.md"
    csv_path.write_text("stale\n")  # overwritten
    code, out = _verify(f"{here}::{run}", f"{there}::{run}", "--out", str(tmp_path / "re"),
                        "--csv", str(csv_path), "--markdown", str(md_path))  # fmt: skip
    assert code == 1, out
    rows = _table(csv_path)
    assert len(rows) == 8
    for r in rows:
        differs = r["metric"] == "accuracy (averaged model)"
        assert r["verdict"] == ("DIFFERS" if differs else "ok"), r
        if differs:
            assert r["abs_delta"] == "2.0000"
    assert {r["same_machine"] for r in rows if r["directory"] == str(here)} == {"true"}
    assert {
        (r["recorded_cpu"], r["same_machine"]) for r in rows if r["directory"] == str(there)
    } == {("Another CPU @ 1.0GHz", "false")}
    text = md_path.read_text()
    assert "every number from `../verify.csv`" in text  # relative to the markdown
    tables = _markdown_tables(text)
    # on another host the tolerance is the cell's seed spread: max(0.5, 2 × std of its seeds)
    seeds = [float(r["accuracy_avg_model"]) for r in _table(there / "table.csv")
             if r["name"].startswith("dsgd-ring_a0.01_")]  # fmt: skip
    spread = max(0.5, 2 * 100 * statistics.stdev(seeds))
    assert spread < 2.0  # still below the tampered 2 pp
    for directory, tolerance in ((here, "0.5 pp"), (there, f"{round(spread, 4):g} pp")):
        line = tables[str(directory), run]["accuracy (averaged model)"]
        assert line[2:] == ["2.0000 pp", tolerance, "DIFFERS"]
        assert tables[str(directory), run]["accuracy (worst peer)"][-1] == "ok"
    assert "Another CPU @ 1.0GHz" in text
    assert "differs from this machine (CPU)" in text
    summary = (
        "0 of 2 cells reproduced within tolerance, 2 differ: 1 on a machine other than the "
        "recorded one (torch, CPU or threads differ): the machine is the likely reason; 1 on the "
        "recorded machine (same torch, CPU and threads): not explained by the machine"
    )
    assert summary in text
    assert f"summary: {summary}" in out
    assert f"- `{there}` run `{run}` differs in accuracy (averaged model); the recorded " in text


def test_several_directories_reject_single_run_options(tiny_report: Path, tmp_path: Path) -> None:
    record = tmp_path / "verify.csv"
    code, out = _verify(str(tiny_report), str(tiny_report), "--run", "allreduce_a0.01_s0")
    assert code == 2
    assert "--run applies to a single DIR, and 2 directories were given" in out
    assert f"as DIR::RUN (e.g. {tiny_report}::NAME)" in out
    code, out = _verify(str(tiny_report), str(tmp_path), "--row", "allreduce", "--column", "a0.01")
    assert code == 2
    assert "--row/--column apply to a single DIR" in out
    code, out = _verify(f"{tiny_report}::allreduce_a0.01_s0", "--run", "allreduce_a0.01_s0")
    assert code == 2
    assert "the run is chosen twice, as DIR::RUN and with --run" in out
    code, out = _verify(f"{tiny_report}::", "--csv", str(record))
    assert code == 2
    assert "expected DIR or DIR::RUN" in out
    # every directory is checked before the first re-run: nothing runs, nothing is written
    code, out = _verify(str(tiny_report), f"{tiny_report}::nope_s0", "--csv", str(record))
    assert code == 2
    assert f"no run 'nope_s0' in {tiny_report / 'table.csv'}" in out
    code, out = _verify(str(tiny_report), f"{tiny_report}::allreduce_a0.01_s0")
    assert code == 2
    assert "run 'allreduce_a0.01_s0' of" in out
    assert "is chosen twice" in out
    code, out = _verify(str(tiny_report), "--markdown", str(tmp_path / "report.md"))
    assert code == 2
    assert "--markdown needs --csv" in out
    assert not record.exists()
    assert "re-running" not in out


def test_the_manifest_is_the_only_source_of_the_configuration(
    tiny_report: Path, tmp_path: Path
) -> None:
    """A version-1 manifest reads as before; no manifest, another version, a run it lacks or a
    metric it does not know are errors naming the file, the version or the run."""
    meta = json.loads((tiny_report / "preset.json").read_text())
    assert meta["manifest_version"] == MANIFEST_VERSION
    assert (meta["table"], meta["name_column"]) == ("table.csv", "name")
    # version 1: no version, table, name column nor metrics (the reports of 2026-11 before it)
    v1 = _copy(tiny_report, tmp_path / "v1", ("table.csv", "report.md", "preset.json"))
    old = {k: v for k, v in meta.items()
           if k not in ("manifest_version", "table", "name_column", "metrics")}  # fmt: skip
    (v1 / "preset.json").write_text(json.dumps(old))
    for name in ("allreduce_a0.01_s0", "dsgd-ring_a0.01_s1"):
        recorded, read = load_target(tiny_report, run=name), load_target(v1, run=name)
        assert read.run == recorded.run
        assert read.items == recorded.items
        assert [m.column for m in read.metrics] == [m.column for m in recorded.metrics]
    assert load_target(v1, row="D-SGD (ring)", column="α = 0.01", seed=1).run.name == (
        "dsgd-ring_a0.01_s1"
    )
    # a report without a manifest: nothing is rebuilt from report.md or the catalog
    bare = _copy(tiny_report, tmp_path / "bare", ("table.csv", "report.md"))
    with pytest.raises(VerifyError, match=f"has no preset.json.*version {MANIFEST_VERSION}"):
        load_target(bare)
    code, out = _verify(str(bare))
    assert code == 2
    assert "has no preset.json" in out
    cases = [
        ({**meta, "manifest_version": 7}, "manifest version 7: this concord reads versions 1 and"),
        ({k: v for k, v in old.items() if k != "runs"}, "manifest version 1 without 'runs'"),
        ({**meta, "metrics": {"loss": "loss"}}, r"unknown metrics \['loss'\]"),
        ({**meta, "table": "runs.csv"}, "holds no runs.csv"),
        ({**meta, "runs": [r for r in meta["runs"] if r["name"] != "dsgd-ring_a0.01_s1"]},
         "run 'dsgd-ring_a0.01_s1' of .* is not in the runs of .*preset.json"),
        ({**meta, "runs": [{"name": "x"}]}, r"runs\[0\] \(x\): KeyError"),
    ]  # fmt: skip
    for i, (broken, message) in enumerate(cases):
        bad = _copy(tiny_report, tmp_path / f"bad{i}", ("table.csv",))
        (bad / "preset.json").write_text(json.dumps(broken))
        with pytest.raises(VerifyError, match=message):
            load_target(bad, run="dsgd-ring_a0.01_s1")


def test_a_consensus_control_constant_cell_reruns_with_its_calibration(tmp_path: Path) -> None:
    out = preset_main(
        "consensus-control",
        seeds=[0],
        jobs=1,
        out_dir=tmp_path / "cc",
        overrides=["dataset.samples=1000", "epochs=2", "eval.every=1"],
        rows=["allreduce", "p1-1over4-xi"],
        columns=["n16"],
        console=Console(file=io.StringIO()),
    )
    code, text = _verify(
        str(out), "--row", "p1-1over4-xi", "--column", "n16", "--out", str(tmp_path / "re")
    )
    assert code == 0, text
    assert "run: n16-p1-1over4-xi-s0 — row 'p1-1over4-xi', column 'n16', seed 0" in text
    assert "config: the configuration recorded in preset.json" in text  # the sweep's manifest
    meta = json.loads((out / "preset.json").read_text())  # the one manifest format
    assert (meta["manifest_version"], meta["table"], meta["name_column"]) == (
        MANIFEST_VERSION,
        "runs.csv",
        "run",
    )
    assert meta["metrics"]["bytes_per_peer"] == "bytes_per_peer"
    assert "re-running (with its calibration pass)" in text
    assert "±10 %" in text  # rounds and bytes under consensus control
    assert "bytes sent per peer" in text
    code, text = _verify(str(out), "--run", "n16-p1-none-s0")
    assert code == 2
    assert "runs: n16-allreduce-s0, n16-p1-1over4-xi-s0" in text


def test_the_section_for_consensus_and_unrecorded_machines() -> None:
    env = environment(threads=1, jobs=2)
    assert env["jobs"] == 2
    assert env["threads"] == 1
    assert environment(jobs=2)["threads"] == max(1, env["cores"] // 2)
    text = reproducibility_section(env, directory="docs/results/consensus-control",
                                   run="n32-allreduce-s0")  # fmt: skip
    assert text.startswith("## Reproducibility\n")
    assert "2 run(s) at a time" in text
    assert "concord report verify docs/results/consensus-control --run n32-allreduce-s0" in text
    old = reproducibility_section(None, directory="d", run=None)
    assert "did not record its machine" in old
    assert "```bash\nconcord report verify d\n```" in old
    run = SweepRun("r", "plan", "p1-none", "dec-phase-1", "ring", None, "none", 3,
                   {"peers": 16, "seed": 3}, ("dec-phase-1/xi/n16", "ring", 3), "n16")  # fmt: skip
    manifest = run_manifest([run], base=["epochs=60"], overrides=["epochs=2"])
    assert manifest["base"] == ["epochs=60"]
    assert manifest["set"] == ["epochs=2"]
    (entry,) = manifest["runs"]
    assert (entry["row_key"], entry["column_key"]) == ("p1-none", "n16")
    assert entry["calibration_group"] == ["dec-phase-1/xi/n16", "ring", 3]
    json.dumps(manifest)  # what preset.json holds


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("directory", "run", "expected"),
    [
        ("relaysgd-dirichlet", "dsgd-ring_a0.01_s2", {"partition.alpha": 0.01, "optim.lr": 0.1}),
        ("relaysgd-dirichlet/lr-tuning", "dsgd-ring-lr0.4_a1_s100", {"optim.lr": 0.4}),
        ("relaysgd-dirichlet/longer-budget", "allreduce_a0.01_s1", {"seed": 1}),
        ("detag-unshuffled", "detag_x25_s0", {"hyper.rounds": 2, "optim.lr": 0.01}),
        ("consensus-control", "n32-p1-1over4-xi-s2", {"control.factor": 0.25, "peers": 32}),
    ],
)
def test_the_committed_reports_resolve_their_runs(
    directory: str, run: str, expected: dict[str, object]
) -> None:
    """No re-run: each committed report names its preset and rebuilds the run's config."""
    target = load_target(ROOT / "docs" / "results" / directory, run=run)
    assert target.run.name == run
    assert expected.items() <= dict(target.run.overrides).items()
    assert target.metrics  # accuracy, worst peer, rounds, bytes
    if directory.endswith("longer-budget"):
        assert target.items[-1] == "epochs=48"  # the report command's --set
    assert load_target(ROOT / "docs" / "results" / directory).cell.record  # the default run


@pytest.mark.parametrize(
    "table",
    sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "docs" / "results").rglob("*.csv")
        if p.name in ("table.csv", "runs.csv")
    ),
)
def test_every_committed_report_has_a_manifest_of_every_run(table: str) -> None:
    """verify reads only manifests: each committed table names its manifest's table and every run
    that succeeded has its configuration there."""
    path = ROOT / table
    meta = json.loads((path.parent / "preset.json").read_text())
    assert meta["manifest_version"] == MANIFEST_VERSION
    assert meta["table"] == path.name
    recorded = {r["name"] for r in meta["runs"]}
    ok = [r[meta["name_column"]] for r in _table(path) if r["status"] == "ok"]
    assert ok
    assert set(ok) <= recorded


def failing_run(
    cfg: object, out_dir: Path, *, progress: bool = False, calibration_cache: Path | None = None
) -> dict[str, object]:
    """A re-run that breaks (module-level: it pickles into the sweep's spawned worker)."""
    raise RuntimeError("broken on purpose")


def _leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.glob("concord-verify-*"))


def test_verify_without_out_leaves_no_temporary_directory(
    tiny_report: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from concord.lab.verify import Choice, verify_reports

    tmp = tmp_path / "tmp"  # this test's own temporary root: other tests may run beside it
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    code, out = _verify(str(tiny_report))  # a verdict: reproduces
    assert code == 0, out
    assert "into a temporary directory (removed at the end; --out DIR keeps it)" in out
    assert _leftovers(tmp) == []
    report = _copy(tiny_report, tmp_path / "copy", ("table.csv", "preset.json", "report.md"))
    rows = _table(report / "table.csv")
    rows[0]["gossip_rounds_total"] = str(int(float(rows[0]["gossip_rounds_total"])) + 1)
    with open(report / "table.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    code, out = _verify(str(report))  # a verdict: differs
    assert code == 1, out
    assert _leftovers(tmp) == []
    lines: list[str] = []  # a re-run that raises: its traceback is shown, its directory goes
    code = verify_reports(
        [Choice(str(tiny_report), None, None, None, None)],
        echo=lines.append,
        run_fn=failing_run,
        console=Console(file=io.StringIO()),
    )
    assert code == 1
    assert "the re-run failed: RuntimeError: broken on purpose" in lines
    assert any("raise RuntimeError" in line for line in lines)
    assert _leftovers(tmp) == []


def test_ctrl_c_during_a_verify_leaves_no_temporary_directory(
    tiny_report: Path, tmp_path: Path
) -> None:
    """Ctrl-C in a terminal: SIGINT to the command's whole process group (it and its worker)
    while the re-run starts."""
    import os
    import signal
    import subprocess
    import sys
    import time

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "concord.lab.cli", "report", "verify", str(tiny_report)],
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _leftovers(tmp) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _leftovers(tmp), "the re-run's temporary directory never appeared"
        time.sleep(0.5)  # the worker is starting
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0, output
    assert "reproduces" not in output  # it was interrupted, not finished
    assert _leftovers(tmp) == []
