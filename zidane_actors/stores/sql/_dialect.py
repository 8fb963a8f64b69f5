"""What differs between SQLite and PostgreSQL in the text of a shared statement."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import attrs

from ...model import encode, encode_str

__all__ = ["POSTGRES", "SQLITE", "Dialect"]


@attrs.frozen(cache_hash=True)
class Dialect:
    """One engine's spelling of the few things its SQL says differently (hashable: the
    statements rendered in it are cached by it)."""

    name: str
    placeholder: str
    """The driver's parameter mark: ``?`` (sqlite3) or ``%s`` (psycopg)."""
    order_column: str
    """The column that keeps a table's insertion order: ``rowid`` or ``seq``."""
    key_share: str
    """The clause locking a read header row against a concurrent delete (or nothing)."""
    claim_order: str
    """The ``ORDER BY`` of send requests as claimed: PostgreSQL's ``seq``; nothing for
    SQLite, whose ``WITHOUT ROWID`` table answers them in key order."""
    text_order: str
    """What makes ``ORDER BY`` a text column compare code points (SQLite's own order)."""
    encode: Callable[[object], bytes | str]
    """A JSON body as its column holds it: ``BLOB`` bytes (SQLite), ``text`` (PostgreSQL)."""
    lock: str
    """The clause locking a header row read before its write (SQLite: the write holds the
    database lock already)."""
    next_rev: str
    """The expression of a session's next ``rev``."""
    json_param: str
    """A JSON text parameter as its column takes it (``jsonb`` in PostgreSQL)."""
    json_column: str
    """What reads a JSON column as text (``::text`` of a ``jsonb`` in PostgreSQL)."""
    contains: str
    """The condition that a turn row's ``body`` holds the text of a parameter."""
    turn_counts: str
    """The ``sessions`` columns counting a session's turns, which a fork's header sets."""

    def sql(self, text: str) -> str:
        """``text``, written with ``?`` marks, in this dialect's parameter marks."""
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)


SQLITE: Final = Dialect(
    name="sqlite",
    placeholder="?",
    order_column="rowid",
    key_share="",
    claim_order="",
    text_order="",
    encode=encode,
    lock="",
    next_rev="rev + 1",
    json_param="?",
    json_column="",
    contains="instr(body, ?) > 0",
    turn_counts="turn_count, user_turn_count, first_user_seq",
)
"""SQLite: writes hold the database lock (``BEGIN IMMEDIATE``), so no row locks."""

POSTGRES: Final = Dialect(
    name="postgres",
    placeholder="%s",
    order_column="seq",
    key_share=" FOR KEY SHARE",
    claim_order=" ORDER BY seq",
    text_order=' COLLATE "C"',
    encode=encode_str,
    lock=" FOR UPDATE",
    next_rev="nextval('revs')",
    json_param="?::jsonb",
    json_column="::text",
    contains="strpos(body, ?) > 0",
    turn_counts="turn_count, user_turn_count",
)
"""PostgreSQL through psycopg."""
