"""An algorithm's checkpoint state (`Algorithm.state_dict`): its local optimizer's state and its
own buffers (a correction, a tracker, public copies), saved only once they exist.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def buffers_state(
    optimizer_state: Mapping[str, torch.Tensor], **buffers: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """An `Algorithm.state_dict`: the local optimizer's state and the algorithm's ``buffers``,
    these only when all of them are set (a fresh algorithm has none yet)."""
    state = dict(optimizer_state)
    if all(b is not None for b in buffers.values()):
        state.update({key: b for key, b in buffers.items() if b is not None})
    return state


def restored(state: Mapping[str, torch.Tensor], key: str) -> torch.Tensor | None:
    """A copy of the buffer ``key`` that `buffers_state` saved; None when it saved none."""
    saved = state.get(key)
    return None if saved is None else saved.clone()


def restored_pair(
    name: str, state: Mapping[str, torch.Tensor], first: str, second: str
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """`restored` of two buffers saved together; ValueError naming the algorithm ``name`` when
    ``state`` holds only one of them."""
    if (first in state) != (second in state):
        raise ValueError(f"{name} state needs both {first!r} and {second!r} (or neither)")
    return restored(state, first), restored(state, second)
