"""Per-replica minibatch index streams, identical in the vectorized engine and in peer processes.

Replica r (= peer rank r) iterates its own shard ``parts[r]``: at the start of every epoch e it
draws a fresh permutation from a numpy Generator seeded by (seed, r, e) — never from the other
replicas' streams — and, if the shard is shorter than the epoch needs, appends further fresh
permutations until the epoch's ``steps_per_epoch · batch_size`` draws are covered (surplus of a long
shard is left unused that epoch). So the rows for rank r depend only on (parts[r], seed, r, e,
batch_size, steps_per_epoch): a peer holding only [r] draws exactly the batches replica r draws when
one process holds all n.

An epoch is ``steps_per_epoch = max(1, round(mean shard size over all n parts / batch_size))`` steps
(the RelaySGD convention, docs/algorithms.md#data-partitions), the same for every replica even if
shards differ in size. The epoch's indices are precomputed at the epoch boundary as one [steps, k,
batch] tensor; `ReplicaSampler.batch_indices` is a single slice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

_STREAM_TAG = 0x5A4D50  # domain separation: sampler streams differ from other uses of the seed


class ReplicaSampler:
    """Per-replica minibatch index streams for the ranks this process holds.

    ``parts``: the n shards of global dataset indices (from
    `concord.core.data.partition.partition`);
    ``ranks``: the k ranks held here (distinct, in 0..n−1; every held shard must be non-empty);
    ``batch_size`` ≥ 1; ``seed`` ≥ 0.
    """

    def __init__(
        self, parts: Sequence[np.ndarray], ranks: Sequence[int], batch_size: int, *, seed: int
    ) -> None:
        n = len(parts)
        if n == 0:
            raise ValueError("parts must hold at least one shard")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer ≥ 1, got {batch_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ValueError(f"seed must be an integer ≥ 0, got {seed!r}")
        rank_list = [int(r) for r in ranks]
        if not rank_list:
            raise ValueError("ranks must name at least one replica")
        if len(set(rank_list)) != len(rank_list):
            raise ValueError(f"ranks must be distinct, got {rank_list}")
        bad = [r for r in rank_list if not 0 <= r < n]
        if bad:
            raise ValueError(f"ranks {bad} are outside 0..{n - 1} (n={n} parts)")
        self._parts = [np.asarray(parts[r], dtype=np.int64) for r in rank_list]
        empty = [r for r, p in zip(rank_list, self._parts, strict=True) if p.size == 0]
        if empty:
            raise ValueError(f"the shards of ranks {empty} are empty; every held shard needs data")
        mean_size = sum(len(p) for p in parts) / n
        self.n = n
        self.ranks = rank_list
        self.batch_size = batch_size
        self.seed = int(seed)
        self.steps_per_epoch = max(1, round(mean_size / batch_size))
        self._epoch = -1
        self._stream = torch.zeros(0, len(rank_list), batch_size, dtype=torch.int64)

    def state_dict(self) -> dict[str, int | list[int]]:
        """The sampler's RNG state for checkpoints. The streams are a pure function of (seed,
        rank, epoch), so there is no running generator to save: the state is the key the
        streams are derived from, checked on load (a resumed run must draw the same batches)."""
        return {
            "seed": self.seed,
            "n": self.n,
            "ranks": list(self.ranks),
            "batch_size": self.batch_size,
            "steps_per_epoch": self.steps_per_epoch,
        }

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Check that ``state`` (from `state_dict`) describes these very streams."""
        mine = self.state_dict()
        diff = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
        if diff:
            shown = ", ".join(f"{k}: saved {a!r}, here {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"sampler state does not match this sampler ({shown})")

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def replica_epoch_stream(self, rank_pos: int, epoch: int) -> np.ndarray:
        """Flat epoch stream (steps_per_epoch · batch_size indices) of ``self.ranks[rank_pos]``."""
        shard = self._parts[rank_pos]
        need = self.steps_per_epoch * self.batch_size
        rng = np.random.default_rng([_STREAM_TAG, self.seed, self.ranks[rank_pos], epoch])
        reps = -(-need // shard.shape[0])
        perms = [shard[rng.permutation(shard.shape[0])] for _ in range(reps)]
        return np.concatenate(perms)[:need]

    def _load_epoch(self, epoch: int) -> None:
        rows = [self.replica_epoch_stream(j, epoch) for j in range(len(self.ranks))]
        stream = np.stack(rows).reshape(len(self.ranks), self.steps_per_epoch, self.batch_size)
        # [steps, k, batch], contiguous so that a step's slice is contiguous too
        self._stream = torch.from_numpy(np.ascontiguousarray(stream.transpose(1, 0, 2)))
        self._epoch = epoch

    def batch_indices(self, step: int) -> torch.Tensor:
        """int64 [k, batch_size] global dataset indices for ``step`` ≥ 0 (row j ↔ ranks[j]).

        O(1) slicing within an epoch; the epoch is recomputed when ``step`` leaves it (any order
        is allowed, increasing order is cheapest). The result is a view: do not modify it in place.
        """
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
            raise ValueError(f"step must be an integer ≥ 0, got {step!r}")
        epoch, pos = divmod(int(step), self.steps_per_epoch)
        if epoch != self._epoch:
            self._load_epoch(epoch)
        return self._stream[pos]
