"""The presets of the `pystdlib-chars` task: relaysgd-pystdlib's grid and consensus-control's
overrides build valid configs on the stdlib task with the by-package partition."""

from __future__ import annotations

import shlex

from concord.core.config import apply_overrides, load_config
from concord.lab.presets import PresetGrid, get_preset
from concord.lab.presets.consensus import BASE
from concord.lab.presets.pystdlib import (
    CONSENSUS_PYSTDLIB_COLUMNS,
    CONSENSUS_PYSTDLIB_OVERRIDES,
    consensus_pystdlib_command,
)


def test_relaysgd_pystdlib_compares_relaysgd_dsgd_and_allreduce_at_16_and_32_peers() -> None:
    preset = get_preset("relaysgd-pystdlib")
    base = load_config(None, ["engine=vectorized", *preset.base], environ={})
    runs = PresetGrid(preset, (0,)).runs()
    assert {(r.overrides["algorithm"], r.overrides["peers"]) for r in runs} == {
        (a, n) for a in ("allreduce", "dsgd", "relaysgd") for n in (16, 32)
    }
    for run in runs:
        cfg = apply_overrides(base, run.overrides)
        assert cfg.dataset.name == "pystdlib-chars"
        assert cfg.model.name == "char-transformer"
        assert cfg.partition.scheme == "groups"
        assert cfg.control.mode == "none"


def test_consensus_control_overrides_put_the_study_on_the_stdlib_task() -> None:
    cfg = load_config(None, ["engine=vectorized", *BASE, *CONSENSUS_PYSTDLIB_OVERRIDES], environ={})
    assert cfg.dataset.name == "pystdlib-chars"
    assert cfg.model.name == "char-transformer"
    assert cfg.partition.scheme == "groups"
    assert cfg.optim.clip_norm == 1.0
    assert cfg.epochs == 8
    assert CONSENSUS_PYSTDLIB_COLUMNS == ("n16", "n32")
    words = shlex.split(consensus_pystdlib_command())
    assert words[:4] == ["concord", "sweep", "--preset", "consensus-control"]
    assert words[4:6] == ["--columns", "n16,n32"]
    assert words[7::2] == list(CONSENSUS_PYSTDLIB_OVERRIDES)
