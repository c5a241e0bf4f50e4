"""Training tasks: what the engines optimise, for the replicas a process holds.

`ClassificationTask` binds a dataset partition, a replica-batched model and a per-replica sampler.
The parameters of the k local replicas live in one flat tensor ``task.x`` ([k, d], the model's
`FlatParams`), so algorithms update them in place and gossip is a matrix product.

Everything here is a function of (config, seed, ranks): replica i draws the same batches and
starts from the same x⁰ whether it runs alone in a peer process (ranks = [i]) or among all n
replicas in the vectorized engine (ranks = 0..n−1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch

from concord.core.config import RunConfig
from concord.core.data import (
    Dataset,
    ReplicaSampler,
    augment_cifar,
    dataset_options,
    load_dataset,
    partition,
    partition_stats,
)
from concord.core.models import FlatParams, build_model, evaluate, loss_and_grad
from concord.core.records import EvalRecord


@dataclass
class StepLoss:
    loss: torch.Tensor  # [k] mean training loss of each replica's batch
    # [k, d], the task's gradient buffer: overwritten by the next `loss_and_grad`
    grad: torch.Tensor
    correct: torch.Tensor  # [k] correctly classified samples in the batch


def load_task_data(cfg: RunConfig, cache_dir: Path | None = None) -> Dataset:
    """The run's dataset. ``dataset.samples`` sets the size of generated datasets; for on-disk
    ones (digits, cifar10) it keeps a seeded random subset of the training set."""
    ds = cfg.dataset
    options: dict[str, Any] = dict(ds.options)
    generated = "num_samples" in dataset_options(ds.name)
    if ds.samples is not None and generated:
        options["num_samples"] = ds.samples
    data = load_dataset(ds.name, seed=cfg.seed, root=ds.root, cache_dir=cache_dir, **options)
    if ds.samples is not None and not generated and ds.samples < len(data.y_train):
        gen = torch.Generator().manual_seed(cfg.seed)
        keep = torch.randperm(len(data.y_train), generator=gen)[: ds.samples].sort().values
        meta = {**data.meta, "train_subset": ds.samples}
        groups = data.groups_train
        data = Dataset(
            data.name,
            data.x_train[keep],
            data.y_train[keep],
            data.x_test,
            data.y_test,
            data.num_classes,
            data.input_shape,
            meta,
            None if groups is None else groups[keep],
        )
    return data


def make_partition(cfg: RunConfig, data: Dataset) -> list[np.ndarray]:
    p = cfg.partition
    return partition(
        data.y_train.numpy(),
        cfg.peers,
        p.scheme,
        seed=cfg.seed,
        alpha=p.alpha,
        shuffled_fraction=p.shuffled_fraction,
        shards_per_peer=p.shards_per_peer,
        exponent=p.exponent,
        num_classes=data.num_classes,
        features=data.x_train.numpy(),
        groups=None if data.groups_train is None else data.groups_train.numpy(),
        **p.options,
    )


class RngState(TypedDict, total=False):
    """A task's random state in a checkpoint (`ClassificationTask.rng_state`)."""

    sampler: dict[str, int | list[int]]  # `Sampler.state_dict`: the key of its streams
    torch_cpu: torch.Tensor  # torch's global CPU generator


class ClassificationTask:
    """Supervised classification for the replicas ``ranks`` of an n-replica run."""

    def __init__(
        self,
        cfg: RunConfig,
        ranks: list[int],
        *,
        device: torch.device,
        data: Dataset | None = None,
        parts: list[np.ndarray] | None = None,
    ) -> None:
        self.cfg = cfg
        self.ranks = list(ranks)
        self.device = device
        self.data = data if data is not None else load_task_data(cfg)
        self.parts = parts if parts is not None else make_partition(cfg, self.data)
        k = len(self.ranks)
        opts = cfg.model.build_options()
        shape = self.data.input_shape
        classes = self.data.num_classes
        self.model = build_model(
            cfg.model.name, k, input_shape=shape, num_classes=classes, seed=cfg.seed, **opts
        ).to(device)
        self.flat = FlatParams(self.model)
        # gradients of every step land in this one buffer: a fresh [k, d] tensor per step is
        # hundreds of MB at large k, which glibc maps and unmaps (page faults) step after step
        self._grad = torch.empty_like(self.flat.data)
        self._saved: torch.Tensor | None = None  # x while a gradient is taken elsewhere
        # a one-replica twin that holds the averaged model for evaluation
        self.avg_model = build_model(
            cfg.model.name, 1, input_shape=shape, num_classes=classes, seed=cfg.seed, **opts
        ).to(device)
        self.avg_flat = FlatParams(self.avg_model)
        self.sampler = ReplicaSampler(self.parts, self.ranks, cfg.optim.batch_size, seed=cfg.seed)
        self.x_train = self.data.x_train.to(device)
        self.y_train = self.data.y_train.to(device)
        n_test = cfg.dataset.test_samples or len(self.data.y_test)
        self.x_test = self.data.x_test[:n_test].to(device)
        self.y_test = self.data.y_test[:n_test].to(device)

    @property
    def x(self) -> torch.Tensor:
        """The local replicas' parameters, [k, d] (views of the model's parameters)."""
        return self.flat.data

    @property
    def batch_size(self) -> int:
        return self.cfg.optim.batch_size

    @property
    def steps_per_epoch(self) -> int:
        return self.sampler.steps_per_epoch

    def rng_state(self) -> RngState:
        """Random state for checkpoints (tensors and plain values only). Batches and
        augmentations are drawn from generators seeded per (seed, rank, epoch) and per (seed,
        rank, step), so nothing runs on between steps: the sampler's key (checked on load) and
        torch's global CPU generator (which no training code draws from) are all there is."""
        return {"sampler": self.sampler.state_dict(), "torch_cpu": torch.get_rng_state()}

    def load_rng_state(self, state: RngState) -> None:
        """Restore `rng_state` (raises ValueError if the sampler's streams differ)."""
        if "sampler" in state:
            self.sampler.load_state_dict(state["sampler"])
        if "torch_cpu" in state:
            torch.set_rng_state(state["torch_cpu"])

    def partition_stats(self) -> dict[str, Any]:
        return partition_stats(self.data.y_train.numpy(), self.parts, self.data.num_classes)

    def loss_and_grad(self, step: int, point: torch.Tensor | None = None) -> StepLoss:
        """Stochastic gradients of every local replica at ``point`` (default: ``self.x``); the
        returned ``grad`` is valid until the next call."""
        if point is not None and point.data_ptr() != self.x.data_ptr():
            if self._saved is None:
                self._saved = torch.empty_like(self.x)
            self._saved.copy_(self.x)
            self.x.copy_(point)
            try:
                return self.loss_and_grad(step)
            finally:
                self.x.copy_(self._saved)
        idx = self.sampler.batch_indices(step).to(self.device)  # [k, B]
        xb = self.x_train[idx]
        yb = self.y_train[idx]
        if self.cfg.dataset.augment:
            xb = self._augment(xb, step)
        loss, grad, correct = loss_and_grad(self.model, self.flat, xb, yb, out=self._grad)
        return StepLoss(loss=loss.detach(), grad=grad, correct=correct)

    def _augment(self, xb: torch.Tensor, step: int) -> torch.Tensor:
        """Per-replica seeded augmentation, so replica i sees the same images in any engine."""
        if self.data.name != "cifar10":
            raise ValueError(f"dataset.augment is only defined for cifar10, not {self.data.name!r}")
        rows = []
        for row, rank in enumerate(self.ranks):
            gen = torch.Generator(device=xb.device).manual_seed(
                (self.cfg.seed * 1_000_003 + rank) * 1_000_003 + step
            )
            rows.append(augment_cifar(xb[row : row + 1], gen))
        return torch.cat(rows)

    @torch.no_grad()
    def eval_record(
        self,
        step: int,
        epoch: float | None,
        *,
        xi: float | None = None,
        peers: bool = True,
        peer_samples: int | None = None,
    ) -> EvalRecord:
        """The evaluation record after ``step``: test accuracy and loss of the averaged model
        and (``peers``) of every local replica, the latter on the first ``peer_samples`` test
        samples (None: all)."""
        self.avg_flat.data.copy_(self.x.mean(dim=0, keepdim=True))
        buffers = self.flat.buffers_flat()
        if buffers is not None:
            self.avg_flat.load_buffers_flat(buffers.mean(dim=0, keepdim=True))
        acc, loss = evaluate(self.avg_model, self.x_test, self.y_test)
        record = EvalRecord(
            step=step,
            epoch=epoch,
            xi=xi,
            accuracy_avg_model=float(acc[0]),
            loss_avg_model=float(loss[0]),
        )
        if not peers:
            return record
        m = peer_samples or len(self.y_test)
        acc, loss = evaluate(self.model, self.x_test[:m], self.y_test[:m])
        return replace(
            record,
            accuracy_mean_peer=float(acc.mean()),
            accuracy_worst_peer=float(acc.min()),
            accuracy_best_peer=float(acc.max()),
            loss_mean_peer=float(loss.mean()),
        )
