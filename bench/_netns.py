"""The emulated network of the benchmarks: now `concord.lab.net` (docs/network-emulation.md).

This module re-exports its public names for the benchmarks and tests that still import
``bench._netns``; new code imports `concord.lab.net`."""

from concord.lab.net import (
    PREFIX,
    Direction,
    Host,
    Net,
    NetError,
    available,
    cleanup,
    kill,
    mosquitto,
    namespaces,
    resume,
    stall,
)

__all__ = [
    "PREFIX",
    "Direction",
    "Host",
    "Net",
    "NetError",
    "available",
    "cleanup",
    "kill",
    "mosquitto",
    "namespaces",
    "resume",
    "stall",
]
