"""The attacks of `bench/chaos_attacks.py` through `bench/chaos.py`'s real code path, against
real runs of 8 peers: a client-id takeover (authenticated Mosquitto-style logins on the
embedded broker), a replayed signed stop of an earlier run, a Fetch flood from a non-neighbour.
Each attacked run must finish with every peer, the attack must have been refused every time, and
the takeover's and stale-run's final parameters must equal the unattacked baseline's of the same
seed. Marked slow: four 8-peer runs, about 3 minutes on 2 cores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ATTACKS = ["takeover", "stale_run", "fetch_flood"]


def test_the_attacks_are_refused_and_change_nothing(tmp_path: Path) -> None:
    cases = ["baseline", *ATTACKS]
    p = subprocess.run(
        [sys.executable, "bench/chaos.py", "--quick", "--epochs", "1", "--cases", ",".join(cases),
         "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    result = json.loads(p.stdout.strip().splitlines()[-1])
    by_name = {c["name"]: c for c in result["cases"]}
    for name in cases:
        assert by_name[name]["ok"], (name, by_name[name]["detail"], p.stderr[-2000:])
    assert result["takeover_accepted"] == 0
    assert result["stale_run_accepted"] == 0
    assert result["fetch_non_neighbour_accepted"] == 0
    assert by_name["takeover"]["detail"]["attempts"] > 0  # it did attack
    assert by_name["fetch_flood"]["detail"]
    for name in ("takeover", "stale_run"):
        diff = by_name[name]["detail"]["param_max_abs_diff"]
        # the same seed, data order and schedule on one CPU: the attacked run's arithmetic is
        # the baseline's, so its parameters are equal; 1e-6 only absorbs float32 summation order
        assert diff is not None, f"{name}: no comparison with the baseline"
        assert diff <= 1e-6, f"{name}: parameters moved by {diff} under attack"
