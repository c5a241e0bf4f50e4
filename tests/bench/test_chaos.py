"""``bench/chaos.py`` through its real code path on two cheap cases: a forged-control run without
security (a rogue MQTT client against 8 real peers, one epoch) and the vectorized engine's
resume. Checks the last line's keys and that these cases' values meet their targets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = [
    "cases_total", "cases_ok", "orphans", "corrupt_outputs", "forged_accepted", "forged_crashes",
    "forged_max_rounds_exceeded", "impersonation_accepted", "kill25_acc_gap_pp",
    "rejoin_acc_gap_pp", "detect_s", "rejoin_s", "rss_growth_mib_stalled", "rss_bound_mib",
    "resume_max_abs_diff", "resume_max_abs_diff_processes", "fuzz_cases", "fuzz_crashes", "cases",
    "takeover_accepted", "stale_run_accepted", "fetch_non_neighbour_accepted",
]  # fmt: skip


def test_chaos_runs_two_cases_and_meets_their_targets(tmp_path: Path) -> None:
    cases = ["forged_unauth", "resume_vectorized"]
    p = subprocess.run(
        [sys.executable, "bench/chaos.py", "--quick", "--epochs", "1", "--cases", ",".join(cases),
         "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    last = p.stdout.strip().splitlines()[-1]
    result = json.loads(last)
    assert set(REQUIRED) <= set(result)
    by_name = {c["name"]: c for c in result["cases"]}
    assert sorted(by_name) == sorted(cases)
    for name in cases:
        assert by_name[name]["ok"], _why(tmp_path / "out", name, by_name[name]["detail"])
        assert by_name[name]["seconds"] > 0
    assert result["cases_total"] == result["cases_ok"] == 2
    assert result["orphans"] == 0
    assert result["corrupt_outputs"] == 0
    assert result["forged_crashes"] == 0
    assert result["forged_max_rounds_exceeded"] == 0
    assert by_name["forged_unauth"]["detail"]["rogue"]["published"] > 0  # it did attack
    assert result["resume_max_abs_diff"] is not None
    assert result["resume_max_abs_diff"] <= 1e-6
    detail = by_name["resume_vectorized"]["detail"]
    assert detail["interrupted_at_step"] < detail["total_steps"]  # really interrupted
    assert "PASS forged_crashes = 0" in p.stdout
    assert "PASS resume_max_abs_diff" in p.stdout


def _why(out: Path, name: str, detail: dict[str, object]) -> str:
    """A failed case's detail in full and the end of its launcher's output (a flake seen once
    on CI showed only a truncated detail)."""
    log = out / f"{name}.launcher.out"
    end = log.read_text(errors="replace")[-4000:] if log.is_file() else "(no launcher output)"
    return f"{json.dumps(detail, default=str)}\n--- {log.name}, last 4000 characters ---\n{end}"
