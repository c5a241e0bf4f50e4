"""The declared field types of the control-plane payloads (`concord.protos.control_plane`).

Every payload schema is its class declaration: a frozen dataclass whose field types carry their
constraints (pydantic validates them; type checkers see plain ``int``, ``str``, …). Scalars are
strict — no ``"1"`` → 1, ``1.0`` → 1 or ``True`` → 1 coercions (an int is accepted for a float);
unknown fields are refused. Invariants spanning fields are the classes' ``@model_validator``
methods. This module is that vocabulary: the allowed values (peer states, run actions, stages),
the constraints checked after the type (`Check`: `OneOf`, `HostPort`, `Shaped`) with their
wording in errors (`Says`), and the aliases the declarations use (`NonNeg`, `Round`, …).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeAlias, get_args

from pydantic import (
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    Strict,
    TypeAdapter,
    ValidationError,
    with_config,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema
from typing_extensions import TypedDict

MAX_ROUNDS = 10_000  # gossip rounds of one step: a round number beyond this is a forgery

PeerState = Literal["starting", "ready", "training", "done", "failed", "offline"]
PEER_STATES: tuple[str, ...] = get_args(PeerState)
RunAction = Literal["start", "stop"]
RUN_ACTIONS: tuple[str, ...] = get_args(RunAction)
PresenceState = Literal["online", "offline"]
PRESENCE_STATES: tuple[str, ...] = get_args(PresenceState)
Stage = Literal["calibrate", "train"]
STAGES: tuple[str, ...] = get_args(Stage)
EVENTS: tuple[str, ...] = ("step", "eval")


@dataclass(frozen=True)
class Says:
    """How a constraint reads in an error: ``<field> <text>; got <value>`` (default: derived from
    the field's bounds, e.g. "must be ≥ 0")."""

    text: str


class Check:
    """A constraint checked after the type (a ``value_error`` at the field's place); ``phrase``
    is its wording in errors, `json` what it adds to the field's JSON Schema."""

    def __init__(self, phrase: str) -> None:
        self.phrase = phrase

    def check(self, value: Any) -> bool:
        raise NotImplementedError

    def json(self) -> dict[str, Any]:
        return {}

    def _validate(self, value: Any) -> Any:
        if not self.check(value):
            raise ValueError(self.phrase)
        return value

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self._validate, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {**handler(schema), **self.json()}


class OneOf(Check):
    """A string out of ``values`` (an ``enum`` in the JSON Schema; ``str`` to type checkers, so
    senders may pass any ``str`` variable)."""

    def __init__(self, values: tuple[str, ...]) -> None:
        super().__init__(f"must be one of {', '.join(values)}")
        self.values = values

    def check(self, value: Any) -> bool:
        return value in self.values

    def json(self) -> dict[str, Any]:
        return {"enum": list(self.values)}


class HostPort(Check):
    """``host:port`` with a port in 1–65535 (a gRPC address)."""

    def __init__(self) -> None:
        super().__init__("must be 'host:port' with a port in 1–65535")

    def check(self, value: Any) -> bool:
        host, sep, port = value.rpartition(":")
        return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)

    def json(self) -> dict[str, Any]:
        return {"pattern": r"^.+:[0-9]{1,5}$"}


@with_config(ConfigDict(extra="forbid"))
class PhaseTopology(TypedDict):
    """One entry of `Schedule.phases`: a phase and its topology (None: the run's topology)."""

    index: Annotated[int, Strict(), Field(ge=0)]
    topology: Annotated[str, Strict()] | None


class Shaped(Check):
    """A map validated as a `TypedDict` (its JSON Schema), kept a plain ``dict`` in Python."""

    def __init__(self, shape: type, phrase: str) -> None:
        super().__init__(phrase)
        self.adapter: TypeAdapter[Any] = TypeAdapter(shape)

    def check(self, value: Any) -> bool:
        try:
            self.adapter.validate_python(value)
        except ValidationError:
            return False
        return True

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return self.adapter.json_schema()


Int: TypeAlias = Annotated[int, Strict()]
NonNeg: TypeAlias = Annotated[int, Strict(), Field(ge=0)]
Round: TypeAlias = Annotated[
    int, Strict(), Field(ge=1, le=MAX_ROUNDS), Says(f"is 1-based, at most {MAX_ROUNDS}")
]
Float: TypeAlias = Annotated[float, Strict()]
FiniteNonNeg: TypeAlias = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
Str: TypeAlias = Annotated[str, Strict()]
Bool: TypeAlias = Annotated[bool, Strict()]
StageName: TypeAlias = Annotated[str, Strict(), OneOf(STAGES)]
Address: TypeAlias = Annotated[str, Strict(), HostPort()]
PhaseEntry: TypeAlias = Annotated[
    dict[Str, Any], Shaped(PhaseTopology, "must be {index: int ≥ 0, topology: str | None}")
]
