"""Every Markdown file the repository names exists in the repository, and every section anchor
given with it (a path, then ``#section``) is a heading of that file.

Scanned: every text file git knows of (tracked, plus untracked files that are not ignored). A
reference is a word ending in the Markdown extension, with or without a path; it resolves
relative to the referring file, relative to the repository root, or — for names written relative
to an output directory, as in generated reports — as the tail of a repository path. URLs are not
references. Background notes kept outside the repository must never be named.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXT = "." + "md"  # spelled apart so that this file names no Markdown file itself
REFERENCE = re.compile(r"(?<![\w./-])([\w][\w./-]*?[\w-]" + re.escape(EXT) + r")(#[\w-]+)?\b")
URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+")
# notes that live outside the repository; naming them is always an error
OUTSIDE = ("ALGORITHMS", "TRANSPORT", "DESIGN", "STYLE")
FORBIDDEN = re.compile(r"\b(" + "|".join(OUTSIDE) + r")(" + re.escape(EXT) + r"\b| §)")
SKIP_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".pt", ".pdf", ".zip", ".gz", ".whl")
# files that sweeps write into their output directory, named by the code that writes them
GENERATED = frozenset({"table" + EXT})


def repo_files() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"git ls-files unavailable: {exc}")
    return sorted({p for p in out.decode().split("\0") if p and (ROOT / p).is_file()})


def text_of(rel: str) -> str | None:
    if rel.endswith(SKIP_SUFFIXES):
        return None
    data = (ROOT / rel).read_bytes()
    if b"\0" in data or len(data) > 2_000_000:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in " -_" or cat.startswith(("L", "N")) or cat == "Mn":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


@cache
def anchors_of(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if in_fence or not m:
            continue
        base = slug(re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    for m in re.finditer(r'<a\s+(?:id|name)="([^"]+)"', path.read_text(encoding="utf-8")):
        out.add(m.group(1))
    return frozenset(out)


def unresolved(referrer: str, text: str, files: Iterable[str]) -> list[str]:
    """The Markdown references in ``text`` (of the file ``referrer``) that name no repository
    file, or an anchor that is no heading of the named file."""
    known = set(files)
    problems = []
    here = (ROOT / referrer).parent
    for m in REFERENCE.finditer(URL.sub(" ", text)):
        name, anchor = m.group(1), m.group(2)
        if name.rsplit("/", 1)[-1] in GENERATED:
            continue
        target = None
        for base in (here, ROOT):
            candidate = (base / name).resolve()
            if candidate.is_relative_to(ROOT) and candidate.relative_to(ROOT).as_posix() in known:
                target = candidate
                break
        if target is None:
            tail = "/" + name.removeprefix("./")
            if any(f.endswith(tail) for f in known):
                continue  # written relative to an output directory (generated reports)
            problems.append(f"{referrer}: {name} does not exist")
            continue
        if anchor and anchor[1:] not in anchors_of(target):
            problems.append(f"{referrer}: {name}{anchor} names no heading of {name}")
    return problems


def test_every_markdown_reference_resolves() -> None:
    files = repo_files()
    problems = []
    for rel in files:
        text = text_of(rel)
        if text is not None:
            problems += unresolved(rel, text, files)
    assert not problems, "\n".join(problems)


def test_no_file_names_notes_kept_outside_the_repository() -> None:
    hits = []
    for rel in repo_files():
        text = text_of(rel)
        if text is None:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if FORBIDDEN.search(line):
                hits.append(f"{rel}:{lineno}: {line.strip()[:100]}")
    assert not hits, "refer to docs/ instead:\n" + "\n".join(hits)


def test_the_checks_catch_planted_references() -> None:
    """Self-check: a missing file, a missing anchor and an outside note are reported; existing
    files and anchors (relative to the referrer or to the root) are not."""
    files = repo_files()
    missing = "no-such-note" + EXT
    planted = (
        f"see {missing}, docs/algorithms{EXT}#no-such-section and "
        f"[ok](algorithms{EXT}#consensus-control), docs/algorithms{EXT}#consensus-control, "
        f"README{EXT}, https://example.org/elsewhere{EXT}"
    )
    problems = unresolved("docs/index" + EXT, planted, files)
    assert problems == [
        f"docs/index{EXT}: {missing} does not exist",
        f"docs/index{EXT}: docs/algorithms{EXT}#no-such-section names no heading of "
        f"docs/algorithms{EXT}",
    ]
    assert unresolved("core/x.py", f"({missing[:-3]}{EXT})", files)  # from a source file too
    for name in OUTSIDE:
        assert FORBIDDEN.search(f"see {name}{EXT} for more")
        assert FORBIDDEN.search(f"({name} §4.1)")
    assert not FORBIDDEN.search("ALGORITHM_NAMES and _ALGORITHMS")


def test_slug_follows_github() -> None:
    assert slug("One algorithm, two engines") == "one-algorithm-two-engines"
    assert slug("`[network.tls]`") == "networktls"
    assert slug("D2 and exact diffusion") == "d2-and-exact-diffusion"
