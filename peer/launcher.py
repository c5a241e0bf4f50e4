"""A peer's id and GPU from the launcher that started it: torchrun, Slurm, a Kubernetes Indexed
Job or StatefulSet, or Concord's own ``CONCORD_PEER_ID``.

A peer started without ``--id`` takes its id from the first of these that is set:

1. ``CONCORD_PEER_ID`` (compose files, hand-written scripts);
2. ``RANK`` (torchrun, ``torch.distributed`` launchers);
3. ``SLURM_PROCID`` (``srun``: one task per peer);
4. ``JOB_COMPLETION_INDEX`` (a Kubernetes Indexed Job);
5. the ordinal of a StatefulSet pod's hostname (``<name>-<ordinal>``, e.g. ``peer-17``).

Its local device index — which GPU of its node, on a node with several — comes from
``LOCAL_RANK`` (torchrun) or ``SLURM_LOCALID`` (Slurm), when set and the config's ``device`` is
``auto`` or ``cuda``; otherwise the peer id modulo the node's GPU count, as before. The source
chosen is logged (``peer.identity``), so a launcher mix-up shows in the first lines of the log.
A variable that is set but is not a non-negative integer is an error naming it: a peer never
guesses past a value it cannot read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

ID_VARIABLES = ("CONCORD_PEER_ID", "RANK", "SLURM_PROCID", "JOB_COMPLETION_INDEX")
LOCAL_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID")
_ORDINAL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?-(?P<ordinal>0|[1-9][0-9]*)$")


class LauncherError(ValueError):
    """The launcher's environment does not name this peer (or names it unreadably)."""


@dataclass(frozen=True)
class Identity:
    peer_id: int
    source: str  # "--id", an environment variable's name, or "hostname <name>"
    local_index: int | None = None  # the GPU index on this node, when a launcher said
    local_source: str | None = None


def _integer(name: str, value: str) -> int:
    text = value.strip()
    if not text.isdigit():
        raise LauncherError(f"{name}={value!r} is not a non-negative integer (a peer id)")
    return int(text)


def local_index(environ: Mapping[str, str]) -> tuple[int | None, str | None]:
    """(this process's device index on its node, the variable that said), or (None, None)."""
    for name in LOCAL_VARIABLES:
        value = environ.get(name)
        if value is not None and value.strip() != "":
            return _integer(name, value), name
    return None, None


def resolve_identity(
    explicit: int | None, environ: Mapping[str, str], hostname: str, peers: int
) -> Identity:
    """This peer's id: ``explicit`` (``--id``) when given, else from the launcher (module
    docstring); it must be below ``peers`` (the config's). Raises `LauncherError` naming what
    was read and why it does not do."""
    index, index_source = local_index(environ)
    if explicit is not None:
        peer_id, source = explicit, "--id"
    else:
        found: tuple[int, str] | None = None
        for name in ID_VARIABLES:
            value = environ.get(name)
            if value is not None and value.strip() != "":
                found = (_integer(name, value), name)
                break
        if found is None:
            match = _ORDINAL.match(hostname.split(".")[0])
            if match is None:
                raise LauncherError(
                    "no peer id: pass --id, or start the peer under a launcher that sets one "
                    f"of {', '.join(ID_VARIABLES)}, or in a StatefulSet pod named <name>-<ordinal> "
                    f"(hostname {hostname!r})"
                )
            found = (int(match["ordinal"]), f"hostname {hostname}")
        peer_id, source = found
    if peer_id >= peers:
        raise LauncherError(
            f"peer id {peer_id} (from {source}) is not below the config's peers = {peers}"
        )
    return Identity(peer_id, source, index, index_source)
