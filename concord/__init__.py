"""Concord: decentralized (gossip) training of PyTorch models with consensus control."""

from __future__ import annotations

from concord.version import __version__

__all__ = ["__version__"]
