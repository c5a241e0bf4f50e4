"""A payload's schema is its class declaration (`concord.protos.control_plane`): the base class
`Message`, validation against a declaration (`check`), and what a refused payload is told — one
specific problem, in the contract's words (`PayloadError`).

`Layout` is what encoding and error reporting need to know of a message class's declaration
(field order, declared types, embedded messages), computed once per class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import NoneType, UnionType
from typing import (
    Annotated,
    Any,
    ClassVar,
    NamedTuple,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from concord.errors import PayloadError
from concord.protos.fields import Check, Says

# decoding: strict scalars in lax containers (a dict is accepted for an embedded message);
# encoding re-validates the message object itself
_CONFIG = ConfigDict(extra="forbid", revalidate_instances="always")


@dataclass(frozen=True)
class Message:
    """Base of all payloads: ``KIND`` names the schema; subclasses declare their fields."""

    KIND: ClassVar[str] = ""
    __pydantic_config__: ClassVar[ConfigDict] = _CONFIG

    def validate(self) -> None:
        """Check the message against its schema; `PayloadError` (topic: the kind) if it fails."""
        try:
            check(type(self), self, self.KIND)
        except PayloadError as exc:  # the topic names the kind already
            raise PayloadError(self.KIND, exc.problem.removeprefix(f"{self.KIND}: ")) from None


M = TypeVar("M", bound=Message)
_ADAPTERS: dict[type[Message], TypeAdapter[Any]] = {}


def adapter(cls: type[Message]) -> TypeAdapter[Any]:
    """The pydantic validator of ``cls``'s declaration (built once per class)."""
    found = _ADAPTERS.get(cls)
    if found is None:
        found = _ADAPTERS[cls] = TypeAdapter(cls)
    return found


def check(cls: type[M], data: Any, topic: str) -> M:
    """Validate ``data`` (a map, or a message object) as a ``cls``; `PayloadError` otherwise."""
    try:
        message: M = adapter(cls).validate_python(data)
    except ValidationError as exc:
        raise PayloadError(topic, _problem(cls, data, exc.errors(include_url=False))) from None
    return message


# ---------------------------------------------------------------------------------------------
# Validation errors → one specific problem, in the contract's words
#
# "stats.theta must be float; got 'x'" (a wrong type: the field and its declared type),
# "stats.grad_norm is missing", "unknown field(s) extra in 'stats'", "stats: theta must be a
# finite number ≥ 0; got nan" (a constraint), "metrics.stats[0]: …" (inside an embedded message).
# Several errors: unknown fields first, then missing ones, wrong types, broken constraints.

_UNKNOWN, _MISSING, _TYPE, _CONSTRAINT = range(4)
_NOT_TYPE_ERRORS = {
    "value_error",
    "assertion_error",
    "finite_number",
    "literal_error",
    "string_pattern_mismatch",
}


class _Found(NamedTuple):
    rank: int  # _UNKNOWN … _CONSTRAINT
    where: str  # "" or the embedded message's place, "metrics.stats[0]: "
    kind: str  # of the message it concerns
    text: str  # the problem (for an unknown field: its name)


def _problem(cls: type[Message], data: Any, errors: list[ErrorDetails]) -> str:
    found = [_describe(cls, data, e) for e in errors]
    first = min(found, key=lambda f: f.rank)  # min keeps the first of a rank: pydantic's order
    if first.rank != _UNKNOWN:
        return first.text
    names = sorted(f.text for f in found if f[:3] == first[:3])  # all of that message, at once
    return f"{first.where}unknown field(s) {', '.join(names)} in {first.kind!r}"


def _describe(cls: type[Message], data: Any, error: ErrorDetails) -> _Found:
    loc, kind, where = list(error["loc"]), error["type"], ""
    is_type = _is_type_error(kind)
    # descend into embedded messages (metrics.stats[i]) unless the item itself has a wrong type
    while len(loc) >= 2 and isinstance(loc[1], int) and not (len(loc) == 2 and is_type):
        inner = layout(cls).embedded.get(str(loc[0]))
        if inner is None:
            break
        where += f"{cls.KIND}.{loc[0]}[{loc[1]}]: "
        data, cls, loc = _child(_child(data, loc[0]), loc[1]), inner, loc[2:]
    if not loc:  # an invariant across fields (a model validator)
        return _Found(_CONSTRAINT, where, cls.KIND, f"{where}{cls.KIND}: {_error_text(error)}")
    name = str(loc[0])
    if kind == "unexpected_keyword_argument" and len(loc) == 1:
        return _Found(_UNKNOWN, where, cls.KIND, name)
    if kind == "missing" and len(loc) == 1:
        return _Found(_MISSING, where, cls.KIND, f"{where}{cls.KIND}.{name} is missing")
    if is_type:  # the field and its declared type, whatever inside it is wrong
        shown = layout(cls).type_names.get(name, "?")
        text = f"{where}{cls.KIND}.{name} must be {shown}; got {_child(data, name)!r}"
        return _Found(_TYPE, where, cls.KIND, text)
    place = name + "".join(f"[{k!r}]" if isinstance(k, str) else f"[{k}]" for k in loc[1:])
    hint = layout(cls).hints.get(name)
    phrase = (_phrase(hint, len(loc) - 1) if hint is not None else "") or _error_text(error)
    text = f"{where}{cls.KIND}: {place} {phrase}; got {error['input']!r}"
    return _Found(_CONSTRAINT, where, cls.KIND, text)


def _is_type_error(kind: str) -> bool:
    return kind not in _NOT_TYPE_ERRORS and not kind.startswith(("greater_", "less_", "too_"))


def _error_text(error: ErrorDetails) -> str:
    ctx = error.get("ctx") or {}
    if isinstance(ctx.get("error"), Exception):
        return str(ctx["error"])
    return error["msg"]


def _child(data: Any, key: str | int) -> Any:
    try:
        if isinstance(key, str) and not isinstance(data, Mapping):
            return getattr(data, key)
        return data[key]
    except (AttributeError, KeyError, IndexError, TypeError):
        return None


@dataclass(frozen=True)
class Layout:
    """What encoding and error reporting need to know of a message class's declaration."""

    names: tuple[str, ...]  # the fields, in declaration (= wire) order
    hints: dict[str, Any]  # declared types, constraints included (``Annotated``)
    type_names: dict[str, str]  # as errors name them: "int", "float | None", "list[Stats]"
    embedded: dict[str, type[Message]]  # fields holding lists of embedded messages

    @classmethod
    def of(cls, message: type[Message]) -> Layout:
        names = tuple(f.name for f in fields(message))
        extras = get_type_hints(message, include_extras=True)
        plain = get_type_hints(message)
        embedded = {}
        for name in names:
            args = get_args(plain[name])
            if get_origin(plain[name]) is list and _is_message_class(args[0]):
                embedded[name] = args[0]
        return cls(
            names,
            {n: extras[n] for n in names},
            {n: _type_name(plain[n]) for n in names},
            embedded,
        )


_LAYOUTS: dict[type[Message], Layout] = {}


def layout(cls: type[Message]) -> Layout:
    """``cls``'s `Layout` (computed once per class)."""
    found = _LAYOUTS.get(cls)
    if found is None:
        found = _LAYOUTS[cls] = Layout.of(cls)
    return found


def _is_message_class(tp: object) -> bool:
    return isinstance(tp, type) and issubclass(tp, Message)


def _type_name(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return _type_name(args[0])
    if origin in (Union, UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(_type_name(a) for a in args)}]"
    if tp is NoneType:
        return "None"
    return getattr(tp, "__name__", None) or str(tp).removeprefix("typing.")


def _phrase(tp: Any, depth: int) -> str:
    """The wording of the constraints declared ``depth`` levels into ``tp`` (0: on the field,
    1: on a list item or dict value, …)."""
    metadata: list[Any] = []
    while True:
        if get_origin(tp) is Annotated:
            tp, *meta = get_args(tp)
            metadata += meta
            continue
        if get_origin(tp) in (Union, UnionType):  # X | None: the constraints of X
            tp = next(a for a in get_args(tp) if a is not NoneType)
            continue
        if depth == 0:
            break
        args = get_args(tp)
        if not args:
            return ""
        tp, metadata, depth = args[-1], [], depth - 1
    return _wording(metadata)


def _wording(metadata: list[Any]) -> str:
    found: dict[str, Any] = {}
    for m in metadata:
        if isinstance(m, Says):
            return m.text
        if isinstance(m, Check):
            return m.phrase
        for item in getattr(m, "metadata", [m]):  # Field(...) holds annotated-types objects
            for attr in ("ge", "gt", "le", "lt", "min_length", "allow_inf_nan", "pattern"):
                if getattr(item, attr, None) is not None:
                    found[attr] = getattr(item, attr)
    low = ("[", found["ge"]) if "ge" in found else ("(", found["gt"]) if "gt" in found else None
    high = ("]", found["le"]) if "le" in found else (")", found["lt"]) if "lt" in found else None
    finite = "a finite number " if found.get("allow_inf_nan") is False else ""
    if low and high:
        return f"must be {finite}in {low[0]}{low[1]}, {high[1]}{high[0]}"
    if low:
        return f"must be {finite}{'≥' if low[0] == '[' else '>'} {low[1]}"
    if high:
        return f"must be {finite}{'≤' if high[0] == ']' else '<'} {high[1]}"
    if "min_length" in found:
        return f"must have at least {found['min_length']} item(s)"
    if "pattern" in found:
        return f"must match {found['pattern']!r}"
    return f"must be {finite.strip()}" if finite else ""
