"""How deep a turn's JSON can nest, bounded without reading its bytes.

A document nested ``d`` arrays and objects deep holds ``d`` opening and ``d``
closing brackets outside its strings. The text of a turn's common blocks (a
block's text, a tool result's text output, a tool input's string values) is
most of its JSON and all inside strings: each of its characters takes at
least one byte there, plus two quotes a string. So the bytes left over bound
the brackets, and through them the depth, at the cost of a few attribute
reads rather than a count of every byte.
"""

from __future__ import annotations

from typing import Any, Final

from ._types import SessionTurn, TextBlock, ToolCallBlock, ToolResultBlock

__all__ = ["nests_at_most"]

_dict: Final = dict
_str: Final = str


def nests_at_most(turn: SessionTurn, size: int, depth: int) -> bool:
    """Whether the JSON of ``turn``, ``size`` bytes long, is sure to nest at most ``depth`` deep.

    ``True`` is a proof (too few bytes outside strings for deeper nesting);
    ``False`` only means the bytes must be looked at. ``turn`` must be what
    that JSON decodes to (or what encodes to it): its strings are tokens of it.
    The blocks are read until their strings are enough (a row's text is
    mostly its first block's).
    """
    left = size - 2 * (depth + 1)  # less the bytes inside strings: below 0 is the proof
    blocks: tuple[Any, ...] = turn.content  # told apart by exact type below
    for block in blocks:
        if left < 0:
            return True
        kind = type(block)
        if kind is TextBlock:
            left -= len(block.text) + 2
        elif kind is ToolResultBlock:
            output = block.output
            if type(output) is _str:
                left -= len(output) + 2
        elif kind is ToolCallBlock:
            given = block.input
            if type(given) is _dict:
                for value in given.values():
                    if type(value) is _str:
                        left -= len(value) + 2
    return left < 0
