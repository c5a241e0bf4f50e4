"""The user's algorithm and codec of docs/api.md ("Your own algorithm"), written as ``mine.py``
into a directory outside the repository: the tests run the page's code, so the page cannot go
stale."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def mine_blocks() -> list[str]:
    """The page's ``# mine.py`` code blocks, in order."""
    text = PAGE.read_text(encoding="utf-8")
    return re.findall(r"```python\n(# mine\.py.*?)```", text, flags=re.S)


def write_mine(directory: Path) -> Path:
    """``directory/mine.py`` from the page (``MyAlgo``, ``MyCodec``); returns its path."""
    path = directory / "mine.py"
    path.write_text("\n\n".join(mine_blocks()), encoding="utf-8")
    return path
