"""Name → implementation registries (topologies, codecs, algorithms, partitioners, models,
datasets).

Every name that may appear in a config file or on the command line is registered here, so that a
config validator can list valid choices and a test can check that each name has an implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from concord.errors import UnknownNameError as UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """A small ordered mapping from public names to implementations."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            self.add(name, obj)
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._items[name] = obj

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
