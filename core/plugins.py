"""User code named ``"module:attr.path"`` in a config — an algorithm class, a codec class, a
topology builder, a dataset, a partition scheme, a model: `resolve` imports it and returns the
object (what each kind expects of it: `concord.core.specs`, docs/api.md).

Where modules are found: the directory the command runs in, then every directory of
``CONCORD_PLUGIN_PATH`` (``os.pathsep``-separated; ``concord --plugin-path DIR`` sets it, so the
peer processes a command starts inherit it), then the usual ``sys.path``. A researcher's
``my_study/partitions.py`` next to the config works without installing anything; every peer
process must find the same module (same directory layout, or an installed package).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

PLUGIN_PATH_ENV = "CONCORD_PLUGIN_PATH"


class PluginError(ValueError):
    """A ``module:callable`` that cannot be imported or is not callable (the message names
    ``what`` it was for, the spec and the reason)."""


def is_spec(name: str) -> bool:
    """Whether ``name`` has the ``module:callable`` form (rather than a registered name)."""
    module, sep, attr = name.partition(":")
    return bool(sep and module and attr)


def accepts(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` takes a keyword ``name`` (declared, or through ``**kwargs``); False when
    its signature cannot be read (some builtins)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except ValueError:
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def plugin_dirs() -> list[str]:
    """The directories searched before ``sys.path``: the working directory, then
    ``CONCORD_PLUGIN_PATH``'s."""
    extra = [d for d in os.environ.get(PLUGIN_PATH_ENV, "").split(os.pathsep) if d]
    return [os.getcwd(), *(os.path.abspath(d) for d in extra)]


def _ensure_path() -> None:
    for d in reversed(plugin_dirs()):
        if d not in sys.path:
            sys.path.insert(0, d)


def _where(exc: BaseException) -> str:
    """ " at FILE:LINE" of a failed import: the syntax error's, else the innermost frame of the
    traceback outside the import machinery (the user's line)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" at {exc.filename}:{exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def resolve(spec: str, what: str, *, need_callable: bool = True) -> Any:
    """The callable ``spec`` ("module:attr.path") names (any object: ``need_callable=False``);
    `PluginError` saying which part fails (``what``: "dataset", "partition scheme", "model",
    "algorithm", "codec", "topology" — used in the message; a module that fails while importing
    is named with the file and line)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise PluginError(f"{what} {spec!r}: expected 'module:callable'")
    _ensure_path()
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(
            f"{what} {spec!r}: cannot import module {module_name!r} ({exc}); searched the "
            f"working directory, {PLUGIN_PATH_ENV} (concord --plugin-path) and sys.path"
        ) from exc
    except Exception as exc:  # the user's module failed while importing
        where = _where(exc)
        raise PluginError(
            f"{what} {spec!r}: importing module {module_name!r} failed{where}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PluginError(f"{what} {spec!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if need_callable and not callable(obj):
        raise PluginError(f"{what} {spec!r}: {attr!r} is not callable")
    return obj
