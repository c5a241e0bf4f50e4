"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.peers import Peers


@pytest.fixture
def started() -> Iterator[list[Peers]]:
    """The `Peers` a test started (append them): killed at its end, whatever happened."""
    runs: list[Peers] = []
    yield runs
    for p in runs:
        p.kill_all()
