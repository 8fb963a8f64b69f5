"""The words of search text: one rule for every store, and the bound on a query's text.

A store indexes the words of what it holds and matches the words of a query with
this module's functions only (never a database's own tokenizer), so every store
splits, folds and compares text alike.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable
from typing import Final

from ..errors import ValidationError

__all__ = [
    "MAX_SEARCH_TEXT",
    "MAX_SEARCH_WORDS",
    "MAX_SEARCH_WORD_LENGTH",
    "check_search_text",
    "index_words",
    "query_words",
    "search_words",
]

MAX_SEARCH_TEXT: Final = 1_000
"""The most characters the ``text`` of a :class:`~zidane_actors.model.SessionSearch` holds."""

MAX_SEARCH_WORDS: Final = 64
"""The most words (see :func:`search_words`) the ``text`` of a search holds."""

MAX_SEARCH_WORD_LENGTH: Final = 100
"""The most characters one word of a search's ``text`` holds (after folding).

Stored words are kept to this many characters (:func:`index_words`): a query word
is a prefix of a word exactly when it is a prefix of that word's first
``MAX_SEARCH_WORD_LENGTH`` characters, so the cut changes no answer, and no index
entry grows past a database's bound on one word (a long URL, a base64 blob).
"""

_ASCII_WORD: Final = re.compile(r"[a-z0-9]+")

# Unicode assigns combining marks (category M) in planes 0-3 and 14 only.
_MARK_PLANES: Final = ((0, 0x40000), (0xE0000, 0xF0000))


@functools.cache
def _word() -> re.Pattern[str]:
    """Runs of letters, combining marks and numbers (categories L, M and N).

    ``[^\\W_]`` is exactly L and N; the marks are listed once, on first use
    (a mark keeps a letter it modifies in its word: Devanagari vowel signs, ``i̇``).
    """
    ranges: list[str] = []
    start = end = -2
    for low, high in _MARK_PLANES:
        for code in range(low, high):
            if unicodedata.category(chr(code))[0] == "M":
                if code != end + 1:
                    if start >= 0:
                        ranges.append(f"{chr(start)}-{chr(end)}")
                    start = code
                end = code
    if start >= 0:
        ranges.append(f"{chr(start)}-{chr(end)}")
    return re.compile(f"(?:[^\\W_]|[{''.join(ranges)}])+")


def _fold(text: str) -> str:
    """``text`` in Unicode NFKC with case folded (and NFKC again: folding can undo it)."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


def search_words(text: str) -> list[str]:
    """The words of ``text``, in order: NFKC with case folded, then runs of letters,
    combining marks and numbers (so ``İstanbul``, ``Öl`` typed decomposed, and
    ``ΣΊΣΥΦΟΣ`` match themselves however written)."""
    if text.isascii():
        return _ASCII_WORD.findall(text.lower())
    return _word().findall(_fold(text))


def index_words(texts: Iterable[str]) -> list[str]:
    """The distinct words of ``texts`` as an index keeps them: each cut to
    :data:`MAX_SEARCH_WORD_LENGTH` characters, sorted."""
    found: set[str] = set().union(*map(search_words, texts))  # no Python loop per word
    if max(map(len, found), default=0) > MAX_SEARCH_WORD_LENGTH:
        found = {w[:MAX_SEARCH_WORD_LENGTH] for w in found}
    return sorted(found)


def query_words(text: str) -> list[str]:
    """The distinct words of a query's ``text``, in order, cut like :func:`index_words`.

    A session matches when each is a prefix of one of its index words. (A checked
    query holds no longer word: the cut only keeps every store's answer the same.)
    """
    return list(dict.fromkeys(w[:MAX_SEARCH_WORD_LENGTH] for w in search_words(text)))


def check_search_text(text: str) -> None:
    """Refuse search ``text`` past the bound, located at ``$.text``.

    No query a person types reaches it; past it a store would spend seconds
    (or fail) matching the words, so every store and the server refuse it.
    """
    if len(text) > MAX_SEARCH_TEXT:
        raise ValidationError(
            f"search text holds {len(text)} characters, more than {MAX_SEARCH_TEXT}"
            " (MAX_SEARCH_TEXT)",
            path="$.text",
        )
    words = search_words(text)
    if len(words) > MAX_SEARCH_WORDS:
        raise ValidationError(
            f"search text holds {len(words)} words, more than {MAX_SEARCH_WORDS}"
            " (MAX_SEARCH_WORDS)",
            path="$.text",
        )
    longest = max(words, key=len, default="")
    if len(longest) > MAX_SEARCH_WORD_LENGTH:
        raise ValidationError(
            f"search text holds a word of {len(longest)} characters, more than"
            f" {MAX_SEARCH_WORD_LENGTH} (MAX_SEARCH_WORD_LENGTH)",
            path="$.text",
        )
