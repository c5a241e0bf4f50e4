"""``bench/_grpc.py``'s `grpc_exchange`: two spawned peer transports time one-tensor exchanges
(the gRPC contender of ``bench/transport.py``)."""

from __future__ import annotations

import pytest

from bench._grpc import grpc_exchange


def test_grpc_exchange_times_each_repeat() -> None:
    times = grpc_exchange(3 << 20, 2)  # 3 MiB: three 1 MiB chunks per tensor
    assert len(times) == 2
    assert all(0 < t < 60 for t in times)


@pytest.mark.parametrize(("size", "repeats"), [(0, 1), (6, 1), (64, 0)])
def test_grpc_exchange_rejects_bad_arguments(size: int, repeats: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        grpc_exchange(size, repeats)
