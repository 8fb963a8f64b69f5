"""The words of search text, and the bound on the search text a query may carry."""

from __future__ import annotations

import re
from typing import Final

from ..errors import ValidationError

__all__ = [
    "MAX_SEARCH_TEXT",
    "MAX_SEARCH_WORDS",
    "MAX_SEARCH_WORD_LENGTH",
    "check_search_text",
    "search_words",
]

MAX_SEARCH_TEXT: Final = 1_000
"""The most characters the ``text`` of a :class:`~zidane_actors.model.SessionSearch` holds."""

MAX_SEARCH_WORDS: Final = 64
"""The most words (see :func:`search_words`) the ``text`` of a search holds."""

MAX_SEARCH_WORD_LENGTH: Final = 100
"""The most characters one word of a search's ``text`` holds (after lower-casing)."""

_WORD: Final = re.compile(r"[^\W_]+")


def search_words(text: str) -> list[str]:
    """The words of ``text``: runs of letters and digits, lower-cased, in order."""
    return _WORD.findall(text.lower())


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
