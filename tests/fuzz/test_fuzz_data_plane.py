"""Fuzzing the data plane: raw framing, handshake and frame checks, the whole receive path.

Examples per target: ``CONCORD_FUZZ_EXAMPLES`` (default 300); derandomized under CI. The
properties are in `tests.fuzz.targets`, the inputs in `tests.fuzz.strategies`.
"""

from __future__ import annotations

from hypothesis import given

from tests.fuzz import strategies, targets


@targets.fuzz_settings()
@given(strategies.raw_frames())
def test_raw_frames_decode_or_are_refused_as_malformed(case: strategies.RawCase) -> None:
    targets.serde_target(case)


@targets.fuzz_settings()
@given(strategies.hellos())
def test_hellos_pass_or_are_rejected(case: strategies.HelloCase) -> None:
    targets.hello_target(case)


@targets.fuzz_settings()
@given(strategies.frame_cases())
def test_frame_headers_pass_or_are_rejected(case: strategies.FrameCase) -> None:
    targets.frame_target(case)


@targets.fuzz_settings()
@given(strategies.streams())
def test_streams_are_filed_acknowledged_or_aborted_with_a_rejection(
    case: strategies.StreamCase,
) -> None:
    targets.receive_target(case)
