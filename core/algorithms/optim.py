"""Local optimizer on flat replica-stacked parameters.

Each replica keeps its own momentum buffer ("local momentum", the convention of Consensus Control
and RelaySGD; the buffer is never communicated). Semantics match ``torch.optim.SGD`` with
``dampening=0``: weight decay is added to the gradient (only where ``decay_mask`` is 1, so biases
and normalisation parameters are not decayed, as in the RelaySGD code), then

    m ← μ m + g;   step = g + μ m (Nesterov) or m;   x ← x − η · step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SGDConfig:
    momentum: float = 0.9  # μ ∈ [0, 1)
    nesterov: bool = True
    weight_decay: float = 1e-4  # ≥ 0

    def __post_init__(self) -> None:
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1); got {self.momentum}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be ≥ 0; got {self.weight_decay}")
        if self.nesterov and self.momentum == 0:
            raise ValueError("nesterov=True needs momentum > 0")


class LocalSGD:
    """SGD (+ Nesterov momentum, weight decay) on ``x`` of shape [k, d], in place."""

    def __init__(self, config: SGDConfig, decay_mask: torch.Tensor | None = None) -> None:
        self.config = config
        self.decay_mask = decay_mask  # [d] float, 1 = decayed
        self.momentum: torch.Tensor | None = None  # [k, d]

    def effective_grad(self, x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """Gradient plus weight decay (a new tensor)."""
        wd = self.config.weight_decay
        if wd == 0:
            return grad.clone()
        if self.decay_mask is None:
            return grad.add(x, alpha=wd)
        return torch.addcmul(grad, x, self.decay_mask, value=wd)

    def direction(self, x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """Update the momentum buffer and return the step direction (to be scaled by −lr)."""
        g = self.effective_grad(x, grad)
        mu = self.config.momentum
        if mu == 0:
            return g
        if self.momentum is None:
            self.momentum = g.clone()  # torch.optim.SGD: first buffer = gradient
        else:
            self.momentum.mul_(mu).add_(g)
        if self.config.nesterov:
            return g.add_(self.momentum, alpha=mu)
        return self.momentum.clone()

    def step(self, x: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
        x.sub_(self.direction(x, grad), alpha=lr)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {} if self.momentum is None else {"momentum": self.momentum}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        m = state.get("momentum")
        self.momentum = None if m is None else m.clone()
