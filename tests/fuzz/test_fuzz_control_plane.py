"""Fuzzing the control plane: every topic of a run, payloads of every message kind.

Examples: ``CONCORD_FUZZ_EXAMPLES`` (default 300); derandomized under CI. The property is
`tests.fuzz.targets.control_target`, the inputs `tests.fuzz.strategies.payloads`.
"""

from __future__ import annotations

from hypothesis import given

from tests.fuzz import strategies, targets


@targets.fuzz_settings()
@given(strategies.payloads())
def test_payloads_decode_or_are_refused_on_every_topic(case: strategies.PayloadCase) -> None:
    targets.control_target(case)
