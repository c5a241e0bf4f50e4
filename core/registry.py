"""Name → implementation registries (topologies, codecs, algorithms, partitioners, models,
datasets).

Every name that may appear in a config file or on the command line is registered here, so that a
config validator can list valid choices and a test can check that each name has an implementation.
A registry linked to a torch-free spec table (`concord.core.specs`) declares there every name it
registers: what is registered, the config accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from concord.errors import UnknownNameError as UnknownNameError

T = TypeVar("T")


class Declares(Protocol):
    """A spec table (`concord.core.specs.SpecTable`): declares a name the config accepts."""

    def declare(self, name: str) -> object: ...


class Registry(Generic[T]):
    """A small ordered mapping from public names to implementations (``table``: the spec table
    every registered name is declared in)."""

    def __init__(self, kind: str, table: Declares | None = None) -> None:
        self.kind = kind
        self.table = table
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            self.add(name, obj)
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        if self.table is not None:
            self.table.declare(name)
        self._items[name] = obj

    def remove(self, name: str) -> None:
        """Unregister ``name`` (its spec stays declared; tests clean up with both)."""
        self._items.pop(name, None)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(self._items))}"
            ) from None

    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)
