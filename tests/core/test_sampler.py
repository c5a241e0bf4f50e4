"""ReplicaSampler: determinism, rank independence, epoch coverage, epoch length, random access."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from concord.core.data import ReplicaSampler, partition

LABELS = np.random.default_rng(0).integers(0, 10, size=640)
IID = partition(LABELS, 4, "iid", seed=0)  # 4 shards of 160 = 10 batches of 16


def test_same_arguments_give_the_same_stream() -> None:
    a = ReplicaSampler(IID, range(4), 16, seed=7)
    b = ReplicaSampler(IID, range(4), 16, seed=7)
    c = ReplicaSampler(IID, range(4), 16, seed=8)
    steps = range(3 * a.steps_per_epoch)
    assert all(torch.equal(a.batch_indices(s), b.batch_indices(s)) for s in steps)
    assert not all(torch.equal(a.batch_indices(s), c.batch_indices(s)) for s in steps)


def test_rows_do_not_depend_on_which_other_replicas_are_held() -> None:
    parts = partition(
        np.random.default_rng(1).integers(0, 10, size=1000), 8, "dirichlet", alpha=0.3
    )
    full = ReplicaSampler(parts, range(8), 8, seed=3)
    alone = ReplicaSampler(parts, [3], 8, seed=3)
    pair = ReplicaSampler(parts, [5, 3], 8, seed=3)
    assert full.steps_per_epoch == alone.steps_per_epoch
    for step in range(2 * full.steps_per_epoch + 3):
        row = full.batch_indices(step)[3]
        assert torch.equal(alone.batch_indices(step)[0], row)
        assert torch.equal(pair.batch_indices(step)[1], row)


def test_batches_have_shape_k_by_batch_and_come_from_the_own_shard() -> None:
    s = ReplicaSampler(IID, [2, 0], 16, seed=0)
    b = s.batch_indices(4)
    assert b.shape == (2, 16)
    assert b.dtype == torch.int64
    assert np.isin(b[0].numpy(), IID[2]).all()
    assert np.isin(b[1].numpy(), IID[0]).all()


def test_every_shard_element_is_visited_once_per_epoch() -> None:
    s = ReplicaSampler(IID, range(4), 16, seed=5)
    assert s.steps_per_epoch == 10
    epochs = []
    for e in range(3):
        stream = torch.stack([s.batch_indices(e * 10 + t) for t in range(10)], dim=1)  # [4,10,16]
        for r in range(4):
            assert np.array_equal(np.sort(stream[r].reshape(-1).numpy()), np.sort(IID[r]))
        epochs.append(stream)
    assert not torch.equal(epochs[0], epochs[1])  # a fresh permutation every epoch


def test_short_shards_wrap_with_fresh_permutations_and_long_ones_do_not_repeat() -> None:
    parts = [np.arange(0, 10), np.arange(10, 100)]  # mean 50, batch 10 → 5 steps = 50 draws
    s = ReplicaSampler(parts, [0, 1], 10, seed=0)
    assert s.steps_per_epoch == 5
    stream = torch.stack([s.batch_indices(t) for t in range(5)], dim=1)
    short = np.bincount(stream[0].reshape(-1).numpy(), minlength=10)
    assert short.tolist() == [5] * 10  # 50 draws = 5 whole permutations of 10
    long = stream[1].reshape(-1).numpy()
    assert len(set(long.tolist())) == 50  # 50 of the 90 without repetition


def test_steps_per_epoch_uses_the_mean_shard_size_over_all_parts() -> None:
    parts = [np.arange(0, 10), np.arange(10, 44)]  # mean 22 → 22 / 8 = 2.75 → 3
    assert ReplicaSampler(parts, [0], 8, seed=0).steps_per_epoch == 3
    assert ReplicaSampler(parts, [1], 64, seed=0).steps_per_epoch == 1  # max(1, round(0.34))


def test_steps_can_be_requested_in_any_order() -> None:
    seq = ReplicaSampler(IID, range(4), 16, seed=2)
    expected = [seq.batch_indices(t).clone() for t in range(40)]
    rnd = ReplicaSampler(IID, range(4), 16, seed=2)
    for t in [25, 3, 39, 25, 0, 17, 3]:
        assert torch.equal(rnd.batch_indices(t), expected[t])


def test_invalid_arguments_are_rejected_with_the_parameter_name() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        ReplicaSampler(IID, [0], 0, seed=0)
    with pytest.raises(ValueError, match="distinct"):
        ReplicaSampler(IID, [1, 1], 4, seed=0)
    with pytest.raises(ValueError, match=r"outside 0\.\.3"):
        ReplicaSampler(IID, [4], 4, seed=0)
    with pytest.raises(ValueError, match="empty"):
        ReplicaSampler([np.arange(4), np.zeros(0, np.int64)], [1], 2, seed=0)
    with pytest.raises(ValueError, match="step"):
        ReplicaSampler(IID, [0], 4, seed=0).batch_indices(-1)
    with pytest.raises(ValueError, match="seed"):
        ReplicaSampler(IID, [0], 4, seed=-1)
