"""The one rule of ``search_meta``: what a session's words are and which sessions match.

Stores that scan sessions answer with :func:`search_page`; the indexed ones store the
:func:`index_words` of :func:`stored_turn_text` and :func:`stored_header_text` and
match the :func:`query_words` of a search the same way.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

import msgspec
from msgspec import UNSET

from ._codec import parse_json
from ._types import (
    SessionData,
    SessionMetaRow,
    SessionSearch,
    SessionSearchPage,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from ._words import index_words, query_words

__all__ = [
    "search_header_filters",
    "search_page",
    "stored_header_text",
    "stored_turn_text",
    "turn_search_text",
    "words_match",
]


def turn_search_text(turn: SessionTurn) -> str:
    """What a turn contributes to search: its text blocks and the tool names it holds."""
    parts: list[str] = []
    for block in turn.content:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ToolCallBlock | ToolResultBlock) and block.name:
            parts.append(block.name)
    return " ".join(parts)


_NAMED: Final = ("tool_call", "tool_result")


def _json(doc: bytes | str) -> Any:
    try:
        return parse_json(doc)
    except (msgspec.DecodeError, RecursionError):  # another program's row
        return None


def stored_turn_text(body: bytes | str) -> str:
    """:func:`turn_search_text` of a turn's stored JSON (``content`` read leniently, so a
    row that no longer decodes still gives its words); empty for a body that is not JSON."""
    doc = _json(body)
    content = doc.get("content") if isinstance(doc, dict) else None
    parts: list[str] = []
    for block in content if isinstance(content, list) else ():
        if isinstance(block, dict):
            kind = block.get("type")
            field = "text" if kind == "text" else "name" if kind in _NAMED else None
            value = block.get(field) if field else None
            if isinstance(value, str):
                parts.append(value)
    return " ".join(parts)


def stored_header_text(session_id: str, metadata: bytes | str) -> str:
    """What a session header contributes to search, from its stored metadata JSON: its id
    and its string ``title``."""
    doc = _json(metadata)
    title = doc.get("title") if isinstance(doc, dict) else None
    return f"{session_id} {title}" if isinstance(title, str) else session_id


def words_match(words: list[str], wanted: Iterable[str]) -> bool:
    """Whether each of ``wanted`` (:func:`query_words`) is a prefix of one of ``words``
    (sorted, as :func:`index_words` answers)."""
    for word in wanted:
        at = bisect.bisect_left(words, word)
        if at == len(words) or not words[at].startswith(word):
            return False
    return True


def _session_texts(data: SessionData) -> Iterator[str]:
    yield data.id
    title = data.metadata.get("title")
    if isinstance(title, str):
        yield title
    for turn in data.turns:
        yield turn_search_text(turn)


def _has_words(data: SessionData, wanted: list[str]) -> bool:
    return words_match(index_words(_session_texts(data)), wanted)


def search_header_filters(search: SessionSearch) -> list[tuple[str, str, Any]]:
    """The header conditions of ``search``, as ``(column, operator, value)`` in order.

    ``operator`` is ``=``, ``>=`` or ``<``, or ``"none"`` (value ``None``) for
    "no project root". The SQL stores render these; :func:`search_page`
    applies them to the sessions it scans: one rule for every store.
    """
    found: list[tuple[str, str, Any]] = []
    if search.agent_id is not None:
        found.append(("agent_id", "=", search.agent_id))
    if search.project_root is None:
        found.append(("project_root", "none", None))
    elif search.project_root is not UNSET:
        found.append(("project_root", "=", search.project_root))
    if search.status is not None:
        found.append(("status", "=", search.status))
    for column, low, high in (
        ("created_at", search.created_from, search.created_to),
        ("updated_at", search.updated_from, search.updated_to),
    ):
        if low is not None:
            found.append((column, ">=", low))
        if high is not None:
            found.append((column, "<", high))
    return found


_HOLDS: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "=": lambda a, b: bool(a == b),
    ">=": lambda a, b: bool(a >= b),
    "<": lambda a, b: bool(a < b),
    "none": lambda a, _: a is None,
}


def _passes(data: SessionData, search: SessionSearch, wanted: list[str]) -> bool:
    for column, operator, value in search_header_filters(search):
        if not _HOLDS[operator](getattr(data, column), value):
            return False
    return not wanted or _has_words(data, wanted)


def search_page(
    sessions: Iterable[SessionData],
    search: SessionSearch,
    meta_row: Callable[[SessionData], SessionMetaRow],
) -> SessionSearchPage:
    """Answer ``search`` by reading every session: the reference every store must agree with."""
    wanted = query_words(search.text or "")
    found = [d for d in sessions if _passes(d, search, wanted)]
    found.sort(key=lambda d: d.id)
    found.sort(
        key=(lambda d: d.created_at) if search.order == "created" else (lambda d: d.updated_at),
        reverse=True,
    )
    page = found[search.offset : search.offset + search.limit]
    return SessionSearchPage(
        rows=tuple(meta_row(d) for d in page),
        total=min(len(found), search.count_limit),
        total_exact=len(found) <= search.count_limit,
    )
