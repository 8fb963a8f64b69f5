"""The ``WHERE`` conditions of ``list``, ``list_meta`` and ``search_meta`` over ``sessions s``.

The rule (which header conditions a search holds) is ``model.search_header_filters``,
shared with the stores that scan; only its SQL rendering lives here.
"""

from __future__ import annotations

from typing import Any, Final

from ...model import SessionFilter, SessionSearch, is_column_text, search_header_filters

__all__ = ["equal_sql", "search_header_sql", "search_words_sql", "session_filter_sql"]

_PAST_WORDS: Final = "\U0010ffff"
"""A word prefix followed by this is past every word that starts with it, in code point
order (SQLite's ``BINARY``, PostgreSQL's ``"C"``): it is a noncharacter, never in a word."""


def search_words_sql(words: list[str], placeholder: str) -> tuple[list[str], list[Any]]:
    """The conditions that each of ``words`` (``query_words``) is a prefix of a word of the
    session ``s``, and their values.

    The words are read from ``session_words`` (each word of a session's header and turns,
    once), so a word every session holds costs a row per session, not one per turn.
    """
    clauses: list[str] = []
    params: list[Any] = []
    for word in words:
        clauses.append(
            f"s.id IN (SELECT w.session_id FROM session_words w"
            f" WHERE w.word >= {placeholder} AND w.word < {placeholder})"
        )
        params += [word, word + _PAST_WORDS]
    return clauses, params


def search_header_sql(search: SessionSearch, placeholder: str) -> tuple[list[str], list[Any]]:
    """``search_header_filters`` as SQL conditions over ``sessions s``, and their values.

    ``placeholder`` is the driver's parameter mark (``?`` for SQLite, ``%s`` for psycopg).
    """
    clauses: list[str] = []
    params: list[Any] = []
    for column, operator, value in search_header_filters(search):
        if operator == "none":
            clauses.append(f"s.{column} IS NULL")
        elif operator == "=" and isinstance(value, str):
            equal_sql(clauses, params, f"s.{column}", value, placeholder)
        else:
            clauses.append(f"s.{column} {operator} {placeholder}")
            params.append(value)
    return clauses, params


def session_filter_sql(filter: SessionFilter, placeholder: str) -> tuple[list[str], list[Any]]:
    """A ``SessionFilter``'s conditions as SQL over ``sessions s`` (its ``limit`` aside).

    ``placeholder`` is the driver's parameter mark, as for :func:`search_header_sql`.
    """
    clauses: list[str] = []
    params: list[Any] = []
    equal_sql(clauses, params, "s.agent_id", filter.agent_id, placeholder)
    if filter.project_root is None:
        clauses.append("s.project_root IS NULL")
    else:
        equal_sql(clauses, params, "s.project_root", filter.project_root, placeholder)
    return clauses, params


def equal_sql(
    clauses: list[str], params: list[Any], column: str, value: object, placeholder: str
) -> None:
    """Add ``column = value`` for a text filter value (``None`` or ``UNSET``: nothing).

    No row holds text a column cannot (NUL, a lone surrogate: ``check_column_text``
    refuses it in every store), so such a value matches none, never sent to the driver.
    """
    if isinstance(value, str):
        if is_column_text(value):
            clauses.append(f"{column} = {placeholder}")
            params.append(value)
        else:
            clauses.append("1 = 0")
