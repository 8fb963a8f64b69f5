"""The one rule of ``search_meta``, for stores that answer it by scanning sessions."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from msgspec import UNSET

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
from ._words import search_words

__all__ = [
    "search_header_filters",
    "search_page",
    "turn_search_text",
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


def _session_texts(data: SessionData) -> Iterator[str]:
    yield data.id
    title = data.metadata.get("title")
    if isinstance(title, str):
        yield title
    for turn in data.turns:
        yield turn_search_text(turn)


def _has_words(data: SessionData, wanted: list[str]) -> bool:
    missing = set(wanted)
    for text in _session_texts(data):
        for word in search_words(text):
            missing = {w for w in missing if not word.startswith(w)}
            if not missing:
                return True
    return False


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
    wanted = search_words(search.text or "")
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
