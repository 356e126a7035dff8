"""Integer arithmetic the packages share: `cdiv`, the ceiling of a / b (pages for tokens, groups for
columns, words for bits), in place of the idiom -(-a // b)."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """The ceiling of a / b for ints, b > 0 (exact: no float on the way)."""
    return -(-a // b)
