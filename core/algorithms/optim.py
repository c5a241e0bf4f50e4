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

from concord.core.models import cache_blocks


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
        self._work: torch.Tensor | None = None  # scratch of `step`, kept across steps

    def effective_grad(
        self, x: torch.Tensor, grad: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Gradient plus weight decay, in ``out`` (default: a new tensor)."""
        if out is None:
            out = torch.empty_like(grad)
        wd = self.config.weight_decay
        if wd == 0:
            return out.copy_(grad)
        if self.decay_mask is None:
            return torch.add(grad, x, alpha=wd, out=out)
        return torch.addcmul(grad, x, self.decay_mask, value=wd, out=out)

    def direction(
        self, x: torch.Tensor, grad: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Update the momentum buffer and return the step direction (to be scaled by −lr), in
        ``out`` (default: a new tensor; never the momentum buffer itself)."""
        g = self.effective_grad(x, grad, out)
        mu = self.config.momentum
        if mu == 0:
            return g
        if self.momentum is None:
            self.momentum = g.clone()  # torch.optim.SGD: first buffer = gradient
        else:
            self.momentum.mul_(mu).add_(g)
        if self.config.nesterov:
            return g.add_(self.momentum, alpha=mu)
        return g.copy_(self.momentum)

    def step(self, x: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
        """``x ← x − lr · direction(x, grad)``, in place."""
        mu = self.config.momentum
        m = self.momentum
        if (mu != 0 and m is None) or x.dim() != 2 or x.device.type != "cpu":
            x.sub_(self.direction(x, grad), alpha=lr)
            return
        # The same elementwise chain run block by block of rows, so each block stays in cache:
        # one pass over memory instead of five (1.6× faster at n = 1024), and a cache-sized
        # scratch instead of a fresh [k, d] direction per step (hundreds of MB at large k,
        # faulted in page by page every step).
        blocks = cache_blocks(x.shape[0], x.shape[1] * x.element_size())
        shape = (max(e - s for s, e in blocks), x.shape[1])
        if self._work is None or self._work.shape != shape or self._work.dtype != x.dtype:
            self._work = torch.empty(shape, dtype=x.dtype)
        for s, e in blocks:
            d = self.effective_grad(x[s:e], grad[s:e], self._work[: e - s])
            if m is not None:
                m[s:e].mul_(mu).add_(d)
                d = d.add_(m[s:e], alpha=mu) if self.config.nesterov else m[s:e]
            x[s:e].sub_(d, alpha=lr)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {} if self.momentum is None else {"momentum": self.momentum}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        m = state.get("momentum")
        self.momentum = None if m is None else m.clone()
