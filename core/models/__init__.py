"""Replica-batched models: one ``nn.Module`` holding k independent replicas of a classifier.

The vectorized simulator holds all n peers' models in one module (k = n) and runs their
forward/backward passes as single batched kernels; a peer process uses the same code with k = 1.

* :func:`build_model` — built-in architectures (``MODEL_NAMES``) or ``"module:callable"``;
* :class:`ReplicaModel` — ``[k, B, *input_shape]`` → ``[k, B, num_classes]``;
* :class:`FlatParams` — all parameters as views into one ``[k, d]`` tensor;
* :func:`loss_and_grad`, :func:`evaluate` — the train step's forward/backward and evaluation.
"""

from __future__ import annotations

import inspect
from typing import Any

from concord.core.models.flat import BLOCK_BYTES, FlatParams, cache_blocks, evaluate, loss_and_grad
from concord.core.models.generic import GenericReplicaModel, build_generic
from concord.core.models.layers import ReplicaModel
from concord.core.models.zoo import MODEL_NAMES, MODELS

__all__ = [
    "BLOCK_BYTES",
    "MODELS",
    "MODEL_NAMES",
    "FlatParams",
    "GenericReplicaModel",
    "ReplicaModel",
    "build_model",
    "cache_blocks",
    "evaluate",
    "loss_and_grad",
]


def canonical_options(options: dict[str, Any]) -> str:
    """A stable text form of resolved options (lists become tuples) for ``ReplicaModel.arch``."""

    def canon(v: Any) -> Any:
        return tuple(canon(i) for i in v) if isinstance(v, list | tuple) else v

    return ", ".join(f"{key}={canon(options[key])!r}" for key in sorted(options))


def build_model(
    name: str,
    k: int,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int = 0,
    **options: Any,
) -> ReplicaModel:
    """Build ``k`` identically initialised replicas of model ``name``.

    ``name`` is one of ``MODEL_NAMES`` (options: see :mod:`concord.core.models.zoo`) or
    ``"module:callable"`` for a user model (see :mod:`concord.core.models.generic`). ``input_shape``
    is one sample's shape, ``num_classes`` ≥ 1, ``seed`` any int ≥ 0: the initial weights depend
    only on (name, options, input_shape, num_classes, seed), never on k.

    Raises ``UnknownNameError`` (from the registry) for an unknown name and ``ValueError`` naming
    the offending argument for anything else invalid.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (number of replicas) must be an integer >= 1, got {k!r}")
    shape = tuple(input_shape)
    if not shape or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
        raise ValueError(
            f"input_shape must be a non-empty tuple of positive ints, got {input_shape!r}"
        )
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if ":" in name:
        return build_generic(
            name, k, input_shape=shape, num_classes=num_classes, seed=seed, options=options
        )
    builder = MODELS.get(name)
    signature = inspect.signature(builder).parameters
    valid = [p.name for p in signature.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for model {name!r}; "
            f"valid options: {', '.join(valid)}"
        )
    resolved = {key: options.get(key, signature[key].default) for key in valid}
    arch = f"{name}({canonical_options(resolved)}; input_shape={shape}, num_classes={num_classes})"
    model = builder(k, shape, num_classes, arch, **options)
    model.reset_parameters(seed)
    return model
