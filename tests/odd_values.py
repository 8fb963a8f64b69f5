"""Hypothesis strategies for what callers hand the integrations: any Python value.

``any_text`` draws any character, NUL and lone surrogates included (the
properties pin those down with explicit examples as well: derandomized runs
rarely draw them); ``any_value`` adds NaN, infinities and integers past 64
bits; ``any_json`` is what JSON itself can carry (finite floats, 64-bit ints).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

__all__ = ["any_json", "any_text", "any_value"]

any_text = st.text(
    st.sampled_from(["\x00", "\ud800", "\udfff", "\ufffd", "a"])
    | st.characters(exclude_categories=()),
    max_size=5,
)


def _tree(leaves: Any, max_leaves: int) -> Any:
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3),
        max_leaves=max_leaves,
    )


any_value = _tree(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | any_text,
    12,
)
any_json = _tree(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | any_text,
    8,
)
