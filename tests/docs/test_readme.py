"""README's configuration block shows the true defaults of `RunConfig`.

Convention (stated in the README): every ``key = value`` line of the first TOML block after
"### Configuration" shows the default of that key, unless the line carries the marker
``# example``, which labels a non-default example value. Unset defaults are shown as commented-out
lines. (``tests/core/test_config.py`` checks that the block loads as a valid config.)
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from concord.core.config import RunConfig

ROOT = Path(__file__).resolve().parents[2]
MARKER = "# example"


def config_block() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Configuration") :]
    return section.split("```toml\n", 1)[1].split("```", 1)[0].splitlines()


def shown_values(lines: list[str]) -> list[tuple[str, Any, bool]]:
    """(dotted key, value, marked as example) of every key line, tables tracked."""
    out = []
    table = ""
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("["):
            table = stripped.split("]", 1)[0].strip("[] ")
            continue
        data = tomllib.loads(line.split(" #", 1)[0] if "=" in line else line)
        ((key, value),) = data.items()
        out.append((f"{table}.{key}" if table else key, value, MARKER in line))
    return out


def default_of(key: str) -> Any:
    node: Any = RunConfig().model_dump(mode="json")
    for part in key.split("."):
        node = node[part]
    return node


def test_readme_config_block_shows_the_defaults() -> None:
    shown = shown_values(config_block())
    assert len(shown) >= 20, "the README's configuration block lost its keys"
    wrong = [
        f"{key} = {value!r} (default {default_of(key)!r})"
        for key, value, example in shown
        if not example and value != default_of(key)
    ]
    message = "README shows non-defaults without the `# example` marker:\n"
    assert not wrong, message + "\n".join(wrong)


def test_the_check_sees_a_wrong_default() -> None:
    lines = ["peers = 64", "[control]", "factor = 0.5  # example", "mode = 'adaptive'"]
    shown = shown_values(lines)
    assert shown == [("peers", 64, False), ("control.factor", 0.5, True),
                     ("control.mode", "adaptive", False)]  # fmt: skip
    assert default_of("peers") != 64
    assert default_of("control.mode") == "adaptive"
