"""A small YAML writer for the files `concord compose` and `concord k8s` generate.

PyYAML is a test-only dependency, and generated files should read as if written by hand: block
mappings, short lists of scalars in flow style (``command: [peer, --id, "3"]``), comments and
anchors where the caller puts them (a mapping key starting with ``#`` is written as a
comment line). Scalars are plain only where every YAML 1.1 and 1.2 reader
takes them as the same string; everything else is a JSON string, which is valid YAML.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

# what a reader could take for something else: booleans of YAML 1.1, null, numbers
_SPECIAL = {"y", "n", "yes", "no", "true", "false", "on", "off", "null", "~", ""}
_PLAIN = re.compile(r"(?:[A-Za-z_/]|-+[A-Za-z_/])[A-Za-z0-9_./-]*")
_WIDTH = 100  # the project's line length


@dataclass(frozen=True)
class Raw:
    """Text written as it is: an alias (``*peer``) or a tagged or anchored value."""

    text: str


@dataclass(frozen=True)
class Anchored:
    """A mapping written with an anchor: ``key: &name`` followed by the mapping."""

    name: str
    value: Mapping[str, Node]


Node: TypeAlias = (
    "str | int | float | bool | Raw | Anchored | Mapping[str, Node] | Sequence[Node] | None"
)


def scalar(value: str | int | float | bool | None) -> str:
    """``value`` as a YAML scalar that every reader takes for the same value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if _PLAIN.fullmatch(value) and value.lower() not in _SPECIAL:
        return value
    return json.dumps(value, ensure_ascii=False)


def _key(key: str) -> str:
    return key if key == "<<" else scalar(key)


def _is_scalar(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool | Raw)


def _flow(head: str, items: Sequence[Node]) -> list[str]:
    """``head [a, b, …]``, wrapped at the line width with continuation lines aligned after the
    bracket."""
    lines, line = [], f"{head} ["
    pad = " " * len(line)
    words = [_one(v) for v in items]
    for k, word in enumerate(words):
        word += "]" if k == len(words) - 1 else ","
        if line.endswith(("[", ",")) and not line.endswith("["):
            candidate = f"{line} {word}"
        else:
            candidate = line + word
        if len(candidate) > _WIDTH and not line.endswith("[") and line.strip():
            lines.append(line)
            line = pad + word
        else:
            line = candidate
    return [*lines, line]


def _one(value: Node) -> str:
    if isinstance(value, Raw):
        return value.text
    if value is None or isinstance(value, str | int | float | bool):
        return scalar(value)
    raise TypeError(f"expected a scalar, got {value!r}")


def _lines(value: Node, indent: int) -> list[str]:
    """The block lines of a mapping or sequence, indented by ``indent`` spaces."""
    pad = " " * indent
    out: list[str] = []
    if isinstance(value, Anchored):
        value = value.value
    if isinstance(value, Mapping):
        if not value:
            return [pad + "{}"]
        for key, item in value.items():
            if key.startswith("#"):  # a comment line (its value is ignored)
                out.append(f"{pad}{key}")
                continue
            out += _entry(f"{pad}{_key(key)}:", item, indent)
        return out
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"expected a mapping or a sequence, got {value!r}")
    for item in value:
        if _is_scalar(item):
            out.append(f"{pad}- {_one(item)}")
        elif isinstance(item, Mapping) and item:
            nested = _lines(item, indent + 2)
            out.append(f"{pad}- {nested[0].lstrip()}")
            out += nested[1:]
        else:
            out += [f"{pad}-", *_lines(item, indent + 2)]
    return out


def _entry(head: str, item: Node, indent: int) -> list[str]:
    if _is_scalar(item):
        return [f"{head} {_one(item)}"]
    if isinstance(item, Anchored):
        return [f"{head} &{item.name}", *_lines(item.value, indent + 2)]
    if isinstance(item, Sequence) and not isinstance(item, str):
        if not item:
            return [f"{head} []"]
        if all(_is_scalar(v) for v in item):
            return _flow(head, item)
        return [head, *_lines(item, indent + 2)]
    if isinstance(item, Mapping) and not item:
        return [f"{head} {{}}"]
    return [head, *_lines(item, indent + 2)]


def dump(value: Mapping[str, Node]) -> str:
    """A YAML document (no ``---``) for a mapping of mappings, sequences and scalars."""
    return "\n".join(_lines(value, 0)) + "\n"


def dump_all(documents: Sequence[Mapping[str, Node]]) -> str:
    """Several documents, separated by ``---``."""
    return "---\n".join(dump(d) for d in documents)
