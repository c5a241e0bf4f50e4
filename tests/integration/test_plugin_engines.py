"""A user's algorithm and codec, defined outside the repository, run by both engines: real peer
processes (orchestrator, gRPC on loopback) end with the vectorized engine's parameters.

The plug-ins are docs/api.md's ``mine.py`` (`tests.core.user_plugins`), written into a temporary
directory that only ``CONCORD_PLUGIN_PATH`` names: the peer processes find it by inheriting the
variable, as ``concord --plugin-path`` sets it. Tolerance 1e-6 (measured: ≤ 2e-7 on these runs;
one replica per process against n batched replicas changes float32 reduction orders)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from concord.core.config import load_config
from concord.core.plugins import PLUGIN_PATH_ENV
from tests.core.user_plugins import write_mine
from tests.integration.test_algorithm_engines import BASE, _run_both

CASES: dict[str, list[str]] = {
    "algorithm": ["algorithm=mine:MyAlgo", "hyper.beta=0.7"],
    "codec": ["algorithm=choco", "compression.codec=mine:MyCodec", "compression.gamma=0.5"],
}


def _close(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_user_plugins_end_with_the_vectorized_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    plugins = tmp_path / "elsewhere"
    plugins.mkdir()
    write_mine(plugins)
    monkeypatch.setenv(PLUGIN_PATH_ENV, str(plugins))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "mine", raising=False)
    cfg = load_config(None, [*BASE, *CASES[case]], environ={})
    vec, proc = _run_both(cfg, tmp_path, _close)
    assert proc["gossip_rounds_total"] == vec["gossip_rounds_total"] > 0
    assert proc["bytes_sent_total"] == vec["bytes_sent_total"]
