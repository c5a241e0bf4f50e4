"""Concord's exceptions: one hierarchy rooted in `ConcordError`.

Each class also derives from the builtin exception its callers have always caught (a bad config is
a ``ValueError``, an unknown registry name a ``KeyError``, a missing dataset a
``FileNotFoundError``), so ``except ValueError`` keeps working while ``except ConcordError``
catches everything Concord raises on purpose. Bugs are not in this hierarchy: an ``AssertionError``
or ``TypeError`` from inside Concord is a defect to report.

    ConcordError
    ├── ConfigError                config keys that do not validate (all problems at once)
    │   └── PeerConfigError        a valid config that cannot drive this peer
    ├── UnknownNameError           a name no registry knows (also a KeyError)
    ├── TopologyError              invalid topology, graph, schedule or mixing matrix
    │   └── UnknownTopologyError   (also an UnknownNameError)
    ├── DataError
    │   ├── DatasetNotFoundError   (also a FileNotFoundError)
    │   ├── DatasetFormatError
    │   ├── UnsafePickleError      (also a pickle.UnpicklingError)
    │   └── PartitionError
    ├── CodecError                 malformed encoded tensor parts
    ├── ProtocolError              input from the wire that breaks its contract
    │   ├── MalformedFrameError    a data-plane frame that does not parse
    │   ├── RejectedError          a frame or handshake that breaks the data-plane contract
    │   └── PayloadError           a control-plane message that does not match its schema
    ├── CertError                  missing or mismatching certificate material
    ├── OrchestratorError          the orchestrator cannot go on with the run
    ├── TorchPlaneError            the torch.distributed data plane failed (fixed world)
    ├── ProcessesError             the processes engine could not run
    └── RunDirBusyError            another live process writes that run directory

This module imports nothing of Concord's: every layer may raise these.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence

__all__ = [
    "CertError",
    "CodecError",
    "ConcordError",
    "ConfigError",
    "DataError",
    "DatasetFormatError",
    "DatasetNotFoundError",
    "MalformedFrameError",
    "OrchestratorError",
    "PartitionError",
    "PayloadError",
    "PeerConfigError",
    "ProcessesError",
    "ProtocolError",
    "RejectedError",
    "RunDirBusyError",
    "TopologyError",
    "TorchPlaneError",
    "UnknownNameError",
    "UnknownTopologyError",
    "UnsafePickleError",
]


class ConcordError(Exception):
    """Base of every exception Concord raises on purpose."""


class ConfigError(ConcordError, ValueError):
    """Invalid configuration; ``problems`` holds (dotted key, message) pairs, all of them."""

    def __init__(self, problems: Sequence[tuple[str, str]], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        lines = [f"  - {key or '<root>'}: {msg}" for key, msg in self.problems]
        super().__init__(f"{len(self.problems)} config problem(s){where}:\n" + "\n".join(lines))


class PeerConfigError(ConcordError, ValueError):
    """The run config cannot drive this peer."""


class UnknownNameError(ConcordError, KeyError):
    """A name that is not registered; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want a plain sentence
        return str(self.args[0]) if self.args else ""


class TopologyError(ConcordError, ValueError):
    """Invalid topology, graph, schedule or mixing matrix; the message says what and why."""


class UnknownTopologyError(TopologyError, UnknownNameError):
    """An unknown topology or weight-rule name (a ValueError *and* a registry KeyError).

    The message lists the valid names.
    """


class DataError(ConcordError):
    """A dataset or partition that cannot be used."""


class DatasetNotFoundError(DataError, FileNotFoundError):
    """The files of an on-disk dataset are missing; the message says where they are expected."""


class DatasetFormatError(DataError, ValueError):
    """An on-disk dataset file exists but does not have the expected structure."""


class UnsafePickleError(DataError, pickle.UnpicklingError):
    """A pickle referenced a global outside the allow-list (possible code execution)."""


class PartitionError(DataError, ValueError):
    """A partition scheme failed or returned an invalid partition; the message says which peer."""


class CodecError(ConcordError, ValueError):
    """Malformed encoded input (wrong parts, dtypes, sizes, non-finite scale, bad indices)."""


class ProtocolError(ConcordError, ValueError):
    """Input from the wire (data plane or control plane) that breaks its contract."""


class MalformedFrameError(ProtocolError):
    """An ``ExchangeRaw`` message that is not ``varint(n) + FrameHeader (n bytes) + body``."""


class RejectedError(ProtocolError):
    """A frame or handshake that breaks the contract; ``reason`` is its rejection class."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


class PayloadError(ProtocolError):
    """A control-plane message that does not match its schema (``topic``: where it came from)."""

    def __init__(self, topic: str, problem: str) -> None:
        self.topic = topic
        self.problem = problem
        super().__init__(f"{topic}: {problem}")


class CertError(ConcordError, ValueError):
    """Missing, unreadable, malformed or mismatching certificate material."""


class OrchestratorError(ConcordError, RuntimeError):
    """The run cannot go on (peers never showed up, or disagree on the model or data)."""


class TorchPlaneError(ConcordError, RuntimeError):
    """The torch.distributed data plane failed: the rendezvous, an operation (a peer crashed or
    is unreachable: that plane's world is fixed) or the peers' rounds diverged."""


class ProcessesError(ConcordError, RuntimeError):
    """The processes engine could not run (a child failed to start, or the run was stopped)."""


class RunDirBusyError(ConcordError, RuntimeError):
    """Another live process writes this run directory (`concord.runtime.lock`)."""
