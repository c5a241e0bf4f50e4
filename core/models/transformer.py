"""``char-transformer``: a small causal (GPT-style, pre-norm) transformer for k replicas.

Input ``[k, B, L]``: character codes stored as floats (datasets hold float32 inputs; codes are
exact integers < ``num_classes``). Output ``[k, B, num_classes]``: the logits of the character
that follows position L−1 — the classification target of ``pystdlib-chars``
(`concord.core.data.pystdlib`). The context length is ``input_shape[0]`` and the vocabulary is
``num_classes`` (input codes must be < num_classes).

Architecture (Radford et al. 2019 block layout): token + learned position embeddings, ``layers``
× [x + Attn(LN(x)), x + MLP(LN(x))] with causal multi-head self-attention (``heads`` heads,
``F.scaled_dot_product_attention``) and a 4×``width`` GELU MLP, a final LayerNorm and a linear
head on the last position (the last block computes its query and MLP for that position only: the
other positions' outputs would be discarded). Every parameter is replica-stacked ``[k, ...]``:
embeddings are one ``F.embedding`` over the k tables laid end to end, linear maps are
`ReplicaLinear` (one ``baddbmm``), LayerNorm normalises without affine and applies the
per-replica scale and shift, and attention runs on ``[k·B, heads, L, width/heads]``.

Initialisation: PyTorch's defaults for the corresponding ``nn`` layers (Embedding N(0, 1),
Linear Kaiming-uniform, LayerNorm 1/0), drawn once and copied to all k replicas.

Evaluation without autograd runs the batch in chunks of `EVAL_CHUNK` samples so that the
activations of k replicas × the evaluator's 1000-sample chunks stay small.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's universal alias)
from torch import Tensor, nn

from concord.core.models.layers import ReplicaLayer, ReplicaLinear, ReplicaModel

EVAL_CHUNK = 128  # samples per forward chunk when gradients are off


class ReplicaEmbedding(ReplicaLayer):
    """k lookup tables ``weight [k, num, dim]``: int64 codes ``[k, B, L]`` → ``[k, B, L, dim]``."""

    def __init__(self, k: int, num: int, dim: int) -> None:
        super().__init__(k)
        self.num, self.dim = num, dim
        self.weight = nn.Parameter(torch.empty(k, num, dim))

    def reset_parameters(self, generator: torch.Generator) -> None:
        w = torch.empty(self.num, self.dim)
        nn.init.normal_(w, generator=generator)  # nn.Embedding's default
        self._replicate(self.weight, w)

    def forward(self, codes: Tensor) -> Tensor:
        shift = torch.arange(self.k, device=codes.device).view(-1, *([1] * (codes.dim() - 1)))
        return F.embedding(codes + shift * self.num, self.weight.reshape(-1, self.dim))

    def extra_repr(self) -> str:
        return f"k={self.k}, {self.num}, {self.dim}"


class ReplicaLayerNorm(ReplicaLayer):
    """LayerNorm over the last dim of ``[k, ..., dim]``, per-replica ``weight, bias [k, dim]``."""

    def __init__(self, k: int, dim: int, *, eps: float = 1e-5) -> None:
        super().__init__(k)
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(k, dim))
        self.bias = nn.Parameter(torch.zeros(k, dim))

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            self.weight.fill_(1.0)
            self.bias.zero_()

    def forward(self, h: Tensor) -> Tensor:
        shape = (self.k, *([1] * (h.dim() - 2)), self.dim)
        out = F.layer_norm(h, (self.dim,), eps=self.eps)
        return torch.addcmul(self.bias.view(shape), out, self.weight.view(shape))

    def extra_repr(self) -> str:
        return f"k={self.k}, {self.dim}, eps={self.eps}"


class _Block(nn.Module):
    """Pre-norm transformer block on ``[k, B, L, D]``."""

    def __init__(self, k: int, width: int, heads: int) -> None:
        super().__init__()
        self.k, self.width, self.heads = k, width, heads
        self.norm1 = ReplicaLayerNorm(k, width)
        self.qkv = ReplicaLinear(k, width, 3 * width)
        self.proj = ReplicaLinear(k, width, width)
        self.norm2 = ReplicaLayerNorm(k, width)
        self.fc = ReplicaLinear(k, width, 4 * width)
        self.out = ReplicaLinear(k, 4 * width, width)

    def forward(self, h: Tensor, *, last_only: bool = False) -> Tensor:
        """``[k, B, L, D]`` → ``[k, B, L, D]``, or only the last position ``[k, B, 1, D]`` when
        ``last_only`` (the final block: keys and values of every position, one query)."""
        k, b, length, d = h.shape
        hd = d // self.heads
        qkv = self.qkv(self.norm1(h).reshape(k, b * length, d))
        # [k, B, L, 3, H, hd] → three [k·B, H, L, hd]
        q, key, v = qkv.view(k * b, length, 3, self.heads, hd).permute(2, 0, 3, 1, 4).unbind(0)
        if last_only:  # the last query sees every position: no mask needed
            att = F.scaled_dot_product_attention(q[:, :, -1:], key, v)
            h, length = h[:, :, -1:], 1
        else:
            att = F.scaled_dot_product_attention(q, key, v, is_causal=True)
        att = att.transpose(1, 2).reshape(k, b * length, d)
        h = h + self.proj(att).view(k, b, length, d)
        mlp: Tensor = self.out(F.gelu(self.fc(self.norm2(h).reshape(k, b * length, d))))
        return h + mlp.view(k, b, length, d)


class ReplicaCharTransformer(ReplicaModel):
    """See the module docstring; ``input_shape = (context,)``."""

    def __init__(
        self,
        k: int,
        *,
        input_shape: tuple[int, ...],
        num_classes: int,
        arch: str,
        layers: int,
        width: int,
        heads: int,
    ) -> None:
        super().__init__(k, input_shape=input_shape, num_classes=num_classes, arch=arch)
        self.context = input_shape[0]
        self.tokens = ReplicaEmbedding(k, num_classes, width)
        self.positions = ReplicaEmbedding(k, self.context, width)
        self.blocks = nn.ModuleList(_Block(k, width, heads) for _ in range(layers))
        self.norm = ReplicaLayerNorm(k, width)
        self.head = ReplicaLinear(k, width, num_classes)

    def _forward(self, x: Tensor) -> Tensor:
        if not torch.is_grad_enabled() and x.shape[1] > EVAL_CHUNK:
            return torch.cat([self._run(c) for c in torch.split(x, EVAL_CHUNK, dim=1)], dim=1)
        return self._run(x)

    def _run(self, x: Tensor) -> Tensor:
        codes = x.long()
        where = torch.arange(self.context, device=x.device).expand_as(codes)
        h = self.tokens(codes) + self.positions(where)
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            h = block(h, last_only=i == last)
        out: Tensor = self.head(self.norm(h[:, :, -1]))
        return out


def build_char_transformer(
    k: int,
    input_shape: tuple[int, ...],
    num_classes: int,
    arch: str,
    *,
    layers: int = 2,
    width: int = 128,
    heads: int = 4,
) -> ReplicaModel:
    """The ``char-transformer`` builder (registered in `concord.core.models.zoo`)."""
    if len(input_shape) != 1:
        raise ValueError(f"char-transformer needs input_shape (context,), got {input_shape}")
    for name, value in (("layers", layers), ("width", width), ("heads", heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"option {name} must be an integer >= 1, got {value!r}")
    if width % heads:
        raise ValueError(f"option width={width} must be a multiple of heads={heads}")
    return ReplicaCharTransformer(
        k,
        input_shape=input_shape,
        num_classes=num_classes,
        arch=arch,
        layers=layers,
        width=width,
        heads=heads,
    )
