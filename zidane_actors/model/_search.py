"""The one rule of ``search_meta``, for stores that answer it by scanning sessions."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Final

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

__all__ = ["search_page", "search_words", "turn_search_text"]

_WORD: Final = re.compile(r"[^\W_]+")


def search_words(text: str) -> list[str]:
    """The words of ``text``: runs of letters and digits, lower-cased, in order."""
    return _WORD.findall(text.lower())


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


def _passes(data: SessionData, search: SessionSearch, wanted: list[str]) -> bool:
    if search.agent_id is not None and data.agent_id != search.agent_id:
        return False
    if search.project_root is not UNSET and data.project_root != search.project_root:
        return False
    if search.status is not None and data.status != search.status:
        return False
    for value, low, high in (
        (data.created_at, search.created_from, search.created_to),
        (data.updated_at, search.updated_from, search.updated_to),
    ):
        if (low is not None and value < low) or (high is not None and value >= high):
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
