"""RelaySGD: RelaySum/Model (``relaysgd``) and RelaySum/Grad (``relaysgd-grad``) — Vogels, He,
Koloskova, Karimireddy, Lin, Stich & Jaggi, "RelaySum for Decentralized Deep Learning on
Heterogeneous Data", NeurIPS 2021 (code: epfml/relaysgd). docs/algorithms.md#relaysgd.

Both relay a d-vector per directed edge of a spanning tree with the RelaySum rule
(`concord.core.algorithms.relay`), one `Comm.exchange` per step, and every replica receives every
other replica's value exactly once, delayed by (tree distance − 1) steps.

**relaysgd** (RelaySum/Model; all replicas start from the same x⁰):

    x_i^{t+½} = local optimizer step from x_i^t        (SGD, local Nesterov momentum, decay)
    relay v_i = x_i^{t+½};  N_i = 1 + Σ_j c_{j→i};  S_i = x_i^{t+½} + Σ_j m_{j→i}
    x_i^{t+1} = (1/n) [S_i + (n − N_i) x⁰]          (contributions not arrived yet: the fill x⁰)

Counts. The relayed sums and counts are both linear in the relayed values, so with
m̃ = m − c·x⁰ (the relay of v − x⁰) the update reads

    x_i^{t+1} = x⁰ + (1/n) [(x_i^{t+½} − x⁰) + Σ_j m̃_{j→i}],

identical to the rule above (tested against it to float64 round-off, dropped messages
included). This module relays the deviations v_i = x_i^{t+½} − x⁰, so the counts are implicit
in the messages: a dropped message removes its sum *and* its count, and every message stays
a d-vector — peers reject tensors whose length is not the model's d, so a count cannot ride along
as a (d+1)-th coordinate. Deviations are also better conditioned in float32 than full models.

**relaysgd-grad** (RelaySum/Grad): relay the local updates u_i = x_i^{t+½} − x_i^t (the
optimizer's step, momentum included, already multiplied by η) with zero fill,

    x_i^{t+1} = x_i^t + (1/n) [u_i + Σ_j m_{j→i}];

every replica applies every update exactly once with weight 1/n; replicas differ only through
the delays (so a constant step leaves an O(η) disagreement on heterogeneous data, while relaysgd
reaches the optimum exactly: tests/core/test_relaysgd.py).

Trees (`concord.core.graphs.trees`, hyperparameters ``hyper.tree`` ∈ {auto, chain, binary-tree,
double-binary-tree, bfs}, default auto, and ``hyper.root`` ∈ {"center", node id}, default
"center"): the topology itself if it is a tree, the two trees of ``double-binary-tree`` (even
coordinates over one, odd over the other), else the BFS spanning tree from a center of the
graph. The tree is built at the first gossip step from the support of the phase's mixing matrix
(weights are not used) and kept for the run: the topology must be static and the same in every
phase (`concord.core.config` enforces both). Bytes per step and replica: (tree degree) × d values;
on ``double-binary-tree`` each edge of the union sends a full d-vector (zeros on the other tree's
coordinates), about twice the d/2 per tree edge of the paper's implementation.

Other hyperparameters: those of the local optimizer; the learning rate is usually scaled up
with the tree's mean distance (×5 on a chain, ×3 on double binary trees for n = 16).

Invariants: every replica holds the same x⁰ (checked by `setup`); with every message delivered
and t ≥ diameter − 1, S_i contains each replica's value exactly once. Exact-averaging phases
average x^{t+½} over all replicas and restart the relay from there (memory 0, x⁰ := the average).
Consensus control: one exchange per step, its statistic θ_i = ‖x_i^{t+1} − x_i^{t+½}‖² is
reported once and a "repeat" answer is ignored (as for CHOCO).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from concord.core.algorithms.base import Algorithm, StepContext, StepReport, register_algorithm
from concord.core.algorithms.catalog import CATALOG
from concord.core.algorithms.optim import LocalSGD
from concord.core.algorithms.relay import RelaySum
from concord.core.comm import Comm
from concord.core.graphs.graph import Graph
from concord.core.graphs.trees import check_tree_choice, relay_trees


def support_graph(W: np.ndarray) -> Graph:
    """The undirected graph of the off-diagonal non-zeros of a mixing matrix."""
    rows, cols = np.nonzero(np.triu((W > 0) | (W.T > 0), k=1))
    return Graph.from_edges(W.shape[0], zip(rows.tolist(), cols.tolist(), strict=True))


class _Relay(Algorithm):
    relay_model: ClassVar[bool]

    def __init__(self, optimizer: LocalSGD, *, tree: str = "auto", root: int | str = "center"):
        check_tree_choice(tree, root)
        self.optimizer = optimizer
        self.tree = tree
        self.root = root
        self.relay: RelaySum | None = None
        self.reference: torch.Tensor | None = None  # x⁰ rows [k, d] (relaysgd)
        self._ready = False
        self._pending: torch.Tensor | None = None  # memory restored before the tree is built

    def setup(self, x: torch.Tensor, comm: Comm) -> None:
        """``x`` must hold the common initial model x⁰ in every row."""
        if x.shape[0] > 1 and not torch.equal(x, x[:1].expand_as(x)):
            gap = float((x - x[:1]).abs().max())
            raise ValueError(
                f"{self.name}: the local replicas must start from the common initial model x⁰; "
                f"rows differ by up to {gap:.3g}"
            )
        self._ready = True
        if self.relay_model:
            self.reference = x.detach().clone()

    def _base(self, x: torch.Tensor) -> torch.Tensor:
        """What the relayed values are measured from: x⁰ (relaysgd) or x^t (relaysgd-grad)."""
        if not self._ready:
            raise RuntimeError(f"{self.name}: call setup(x⁰, comm) (or load_state_dict) first")
        if not self.relay_model:
            return x.clone()
        if self.reference is None:
            raise RuntimeError(f"{self.name}: no reference model x⁰ (call setup first)")
        return self.reference

    def _relay(self, x: torch.Tensor, ctx: StepContext) -> RelaySum:
        if self.relay is None:
            W = ctx.matrix(ctx.round_offset)
            trees = relay_trees(support_graph(W), self.tree, self.root)
            relay = RelaySum(trees, ctx.comm.ranks, x.shape[1], dtype=x.dtype, device=x.device)
            if self._pending is not None:
                if self._pending.shape != relay.memory.shape:
                    raise ValueError(
                        f"{self.name}: restored relay memory has shape "
                        f"{tuple(self._pending.shape)}; this tree needs {tuple(relay.memory.shape)}"
                    )
                relay.memory = self._pending.to(x.dtype).clone()
                self._pending = None
            self.relay = relay
        return self.relay

    def step(self, x: torch.Tensor, grad: torch.Tensor, ctx: StepContext) -> StepReport:
        base = self._base(x)
        self.optimizer.step(x, grad, ctx.lr)  # x = x^{t+½}
        if ctx.phase.mode == "exact":
            x.copy_(ctx.comm.allreduce_mean(x, step=ctx.step))
            if self.relay is not None:
                self.relay.reset()
            self._pending = None
            if self.reference is not None:
                self.reference = x.detach().clone()
            return StepReport(exact_average=True)
        relay = self._relay(x, ctx)
        sums, outcome = relay.relay(x - base, ctx.comm, step=ctx.step, round=ctx.round_offset)
        new = base + sums / ctx.comm.world_size
        theta_local = (new - x).double().pow(2).sum(dim=1)
        x.copy_(new)
        ctx.control.after_round(1, x, theta_local)  # reported once; no extra rounds (docstring)
        return StepReport(
            rounds=1, theta_local=theta_local, statistics=[theta_local], outcomes=[outcome]
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = dict(self.optimizer.state_dict())
        memory = self.relay.memory if self.relay is not None else self._pending
        if memory is not None:
            state["relay_memory"] = memory
        if self.reference is not None:
            state["reference"] = self.reference
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.optimizer.load_state_dict(state)
        self._ready = True
        if "reference" in state:
            self.reference = state["reference"].clone()
        elif self.relay_model:
            raise ValueError(f"{self.name} state needs 'reference' (the fill x⁰)")
        memory = state.get("relay_memory")
        if memory is None:
            if self.relay is not None:
                self.relay.reset()
            self._pending = None
        elif self.relay is not None:
            if memory.shape != self.relay.memory.shape:
                raise ValueError(
                    f"{self.name}: relay memory of shape {tuple(memory.shape)}; this tree needs "
                    f"{tuple(self.relay.memory.shape)}"
                )
            self.relay.memory = memory.to(self.relay.memory.dtype).clone()
        else:
            self._pending = memory.clone()


@register_algorithm
class RelaySGD(_Relay):
    """RelaySum/Model: relay the models (as deviations from x⁰), fill missing ones with x⁰."""

    spec = CATALOG["relaysgd"]
    relay_model: ClassVar[bool] = True


@register_algorithm
class RelaySGDGrad(_Relay):
    """RelaySum/Grad: relay the local updates with zero fill."""

    spec = CATALOG["relaysgd-grad"]
    relay_model: ClassVar[bool] = False
