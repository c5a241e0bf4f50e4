"""The "did you mean …?" of unknown names: the closest valid name by Damerau–Levenshtein
distance (optimal string alignment), so that a transposition — the commonest typo, ``dsdg`` for
``dsgd`` — costs 1, as one insertion, deletion or substitution does."""

from __future__ import annotations

import difflib
from collections.abc import Sequence


def edit_distance(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and transpositions of adjacent characters (each 1)
    turning ``a`` into ``b`` (optimal string alignment: no substring is edited twice)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[len(b)]


def closest(value: str, names: Sequence[str]) -> str | None:
    """The valid name ``value`` most likely misspells, or None if none is close.

    Close: at most max(1, len/3) edits (case ignored). Ties go to the longer common prefix, then
    the higher `difflib` similarity, then the earlier name in ``names`` (registries list the
    common names first). Nothing that close: `difflib`'s best match (e.g. a name given only in
    part), if any.
    """
    typed = value.lower()
    limit = max(1, len(typed) // 3)
    ranked = []
    for index, name in enumerate(names):
        distance = edit_distance(typed, name.lower())
        if distance <= limit:
            prefix = len(_common_prefix(typed, name.lower()))
            ratio = difflib.SequenceMatcher(None, typed, name.lower()).ratio()
            ranked.append((distance, -prefix, -ratio, index, name))
    if ranked:
        return min(ranked)[-1]
    close = difflib.get_close_matches(value, names, n=1)
    return close[0] if close else None


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]
