"""Fallback for user models: run any one-replica ``nn.Module`` for k replicas with ``torch.func``.

A user names a callable ``"package.module:factory"`` (attribute paths such as ``"pkg.mod:Cls.make"``
work too). The callable returns a standard ``nn.Module`` for ONE replica mapping
``[B, *input_shape]`` → ``[B, num_classes]``; it is called with the model options as keyword
arguments, plus ``input_shape=`` and ``num_classes=`` when its signature accepts them.

:class:`GenericReplicaModel` keeps that module as a template whose parameters and buffers are
replaced by stacked ``[k, *shape]`` tensors (same names, so ``named_parameters()`` reads like the
user's model), and runs ``torch.func.vmap`` over ``torch.func.functional_call``. BatchNorm works:
the stacked running statistics are passed in as buffers and updated in place per replica.
It is general but slower than the grouped kernels of the built-in models.

Initialisation: the factory is called inside ``torch.random.fork_rng`` with
``torch.manual_seed(seed)``, so the template gets the module's own default initialisation,
reproducibly from ``seed``, without disturbing the caller's global RNG state; all k replicas are
copies of it (independent of k).

Randomness inside forward (dropout) is refused by default (``randomness="error"``); pass
``randomness="different"`` to the constructor to allow it, drawing from the global RNG.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from concord.core.models.layers import ReplicaModel
from concord.core.plugins import accepts, is_spec, resolve

__all__ = ["GenericReplicaModel", "build_generic", "resolve_callable"]

_RANDOMNESS = ("error", "different", "same")


def resolve_callable(target: str) -> Callable[..., Any]:
    """Import ``"module:attr.path"`` and return the callable it names (ValueError if it cannot;
    where modules are found: `concord.core.plugins`)."""
    if not is_spec(target):
        raise ValueError(f"model {target!r} must be a registered name or 'module:callable'")
    builder: Callable[..., Any] = resolve(target, "model")
    return builder


class GenericReplicaModel(ReplicaModel):
    """k replicas of a user ``nn.Module`` via ``vmap(functional_call)``.

    ``factory()`` must return a fresh one-replica module; it is called under a seeded, forked
    global RNG at construction and by :meth:`reset_parameters`. ``arch`` is ``label`` plus the
    template's ``repr``. Parameters and buffers of the
    wrapped module (``self.net``) become ``[k, *shape]``; shared (tied) parameters stay shared.
    """

    def __init__(
        self,
        factory: Callable[[], nn.Module],
        k: int,
        *,
        input_shape: tuple[int, ...],
        num_classes: int,
        seed: int,
        label: str = "generic",
        randomness: str = "error",
    ) -> None:
        if randomness not in _RANDOMNESS:
            raise ValueError(f"randomness={randomness!r}; valid: {', '.join(_RANDOMNESS)}")
        template = self._make_template(factory, seed, input_shape, num_classes)
        super().__init__(
            k, input_shape=input_shape, num_classes=num_classes, arch=f"{label}\n{template!r}"
        )
        self._factory = factory
        self.randomness = randomness
        self._stack_into(template, k)
        self.net = template

    @staticmethod
    def _make_template(
        factory: Callable[[], nn.Module],
        seed: int,
        input_shape: tuple[int, ...],
        num_classes: int,
    ) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = factory()
        if not isinstance(module, nn.Module):
            raise ValueError(f"model factory returned {type(module).__name__}, not an nn.Module")
        with torch.no_grad():
            module.eval()
            out = module(torch.zeros(2, *input_shape))
            module.train()
        if not isinstance(out, Tensor) or tuple(out.shape) != (2, num_classes):
            shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(
                f"user model maps [2, *input_shape={input_shape}] to {shape}; "
                f"expected [2, num_classes={num_classes}]"
            )
        return module

    @staticmethod
    def _stack_into(module: nn.Module, k: int) -> None:
        """Replace every parameter/buffer of ``module`` by a ``[k, *shape]`` copy, keeping ties."""
        params: dict[int, nn.Parameter] = {}
        for name, p in module.named_parameters(remove_duplicate=False):
            owner_name, _, leaf = name.rpartition(".")
            if id(p) not in params:
                rep = p.detach().unsqueeze(0).repeat(k, *([1] * p.dim()))
                params[id(p)] = nn.Parameter(rep, requires_grad=p.requires_grad)
            module.get_submodule(owner_name)._parameters[leaf] = params[id(p)]
        buffers: dict[int, Tensor] = {}
        for name, b in module.named_buffers(remove_duplicate=False):
            owner_name, _, leaf = name.rpartition(".")
            if id(b) not in buffers:
                buffers[id(b)] = b.detach().unsqueeze(0).repeat(k, *([1] * b.dim()))
            module.get_submodule(owner_name)._buffers[leaf] = buffers[id(b)]

    def reset_parameters(self, seed: int) -> None:
        """Rebuild the template from ``seed`` and copy it into every replica (buffers too)."""
        fresh = self._make_template(
            self._factory, seed, self.input_shape, self.num_classes
        ).state_dict()
        with torch.no_grad():
            for name, t in self.net.state_dict(keep_vars=True).items():
                t.copy_(fresh[name].unsqueeze(0).expand_as(t))

    def _forward(self, x: Tensor) -> Tensor:
        params: dict[str, Tensor] = dict(self.net.named_parameters())
        buffers: dict[str, Tensor] = dict(self.net.named_buffers())

        def one(p: dict[str, Tensor], b: dict[str, Tensor], xi: Tensor) -> Tensor:
            out: Tensor = functional_call(self.net, (p, b), (xi,))
            return out

        out: Tensor = vmap(one, randomness=self.randomness)(params, buffers, x)
        return out


def build_generic(
    target: str,
    k: int,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int,
    options: dict[str, Any],
) -> GenericReplicaModel:
    """Resolve ``target`` ("module:callable"), check ``options`` against its signature, wrap it."""
    fn = resolve_callable(target)
    kwargs = dict(options)
    for key, value in (("input_shape", input_shape), ("num_classes", num_classes)):
        if accepts(fn, key) and key not in kwargs:
            kwargs[key] = value
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError as exc:
        raise ValueError(
            f"model {target!r} does not accept options {sorted(options)}: {exc}"
        ) from exc
    except ValueError:  # no introspectable signature (some builtins): let the call decide
        pass
    return GenericReplicaModel(
        lambda: fn(**kwargs),
        k,
        input_shape=input_shape,
        num_classes=num_classes,
        seed=seed,
        label=target,
    )
