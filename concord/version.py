"""The installed distribution's version, read from its metadata (one source: ``pyproject.toml``)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def concord_version() -> str:
    """The version of the installed ``concord`` distribution (``0+unknown`` when not installed)."""
    try:
        return version("concord")
    except PackageNotFoundError:
        return "0+unknown"


__version__ = concord_version()
