"""Which rows a SQLite session sees when forks share them, and the copy before they change.

The rule is :mod:`..sql._forks`; these are its SQLite steps, run inside the caller's
transaction.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any, Final

from ..sql import SQLITE
from ..sql._forks import ForkSQL, RowRange, ranges_of, ranges_select
from ._rows import _Conn

__all__ = [
    "FORK_SQL",
    "counts",
    "first_turn_row",
    "has_forks",
    "heirs",
    "ranges",
    "recount",
    "set_counts",
    "share_less",
    "shared_turns",
    "unshare",
    "visible_rows",
]

FORK_SQL: Final = ForkSQL(SQLITE)

_TurnRow = tuple[int, str, str, bytes]


def ranges(conn: _Conn, session_id: str) -> tuple[RowRange, ...]:
    """The row ranges of the turns ``session_id`` sees."""
    return ranges_of(conn, FORK_SQL, session_id)


def visible_rows(
    conn: _Conn,
    session_id: str,
    from_: int = 0,
    limit: int | None = None,
    *,
    within: Sequence[RowRange] | None = None,
) -> builtins.list[_TurnRow]:
    """The ``(seq, id, role, body)`` rows ``session_id`` sees from ``seq >= from_`` on, at
    most ``limit``, in order (``within``: its ranges, when read already)."""
    clipped = [
        c
        for r in (ranges(conn, session_id) if within is None else within)
        if (c := r.within(from_))
    ]
    if not clipped:
        return []
    sql, params = ranges_select(clipped, "seq, id, role, body", SQLITE)
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return conn.execute(sql, params).fetchall()


def first_turn_row(conn: _Conn, session_id: str, seq: int) -> tuple[str, str, bytes] | None:
    """The ``(id, role, body)`` of the turn ``session_id`` sees at ``seq`` (an inherited one)."""
    rows = visible_rows(conn, session_id, seq, 1)
    return None if not rows or rows[0][0] != seq else rows[0][1:]


def shared_turns(conn: _Conn, session_id: str, ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
    """The ``role, body`` of each of ``ids`` that ``session_id`` sees in rows it shares with
    another session (none when it shares nothing)."""
    inherited = [r for r in ranges(conn, session_id) if r.session_id != session_id]
    if not inherited or not ids:
        return {}
    marks = ", ".join("?" * len(ids))
    sql, params = ranges_select(
        inherited, "seq, id, role, body", SQLITE, where=f"id IN ({marks})", values=ids
    )
    return {tid: (role, body) for _, tid, role, body in conn.execute(sql, params)}


def has_forks(conn: _Conn, session_id: str) -> bool:
    """Whether a fork shares rows of ``session_id``."""
    return conn.execute(FORK_SQL.forks_of, (session_id,)).fetchone() is not None


def heirs(conn: _Conn, session_id: str, seq: int) -> builtins.list[str]:
    """The sessions that see the row of ``session_id`` at ``seq`` besides it."""
    return [r[0] for r in conn.execute(FORK_SQL.inheritors, (session_id, seq, seq))]


def counts(conn: _Conn, session_id: str) -> tuple[Any, ...]:
    row: tuple[Any, ...] = conn.execute(
        "SELECT turn_count, user_turn_count, first_user_seq FROM sessions WHERE id = ?",
        (session_id,),
    ).fetchone()
    return row


def set_counts(conn: _Conn, session_id: str, values: Sequence[Any]) -> None:
    conn.execute(
        "UPDATE sessions SET turn_count = ?, user_turn_count = ?, first_user_seq = ? WHERE id = ?",
        (*values, session_id),
    )


def recount(conn: _Conn, session_id: str) -> None:
    """Derive the counts of ``session_id`` from the turns it sees, and rebuild its search
    words (after a write changed what it shares)."""
    sql, params = ranges_select(ranges(conn, session_id), "seq, role", SQLITE)
    derived = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(role = 'user'), 0),"
        f" MIN(CASE WHEN role = 'user' THEN seq END) FROM ({sql})",
        params,
    ).fetchone()
    set_counts(conn, session_id, derived)
    conn.execute("INSERT OR IGNORE INTO search_stale (session_id) VALUES (?)", (session_id,))


def unshare(conn: _Conn, session_id: str, keep: int = 0) -> None:
    """Copy into each fork of ``session_id`` seeing its turns past the first ``keep`` the
    rows it shares, and end its sharing: to run before those turns are deleted or
    rewritten. Forks of those forks keep sharing (from them)."""
    for fork, bound in conn.execute(FORK_SQL.forks_of, (session_id,)).fetchall():
        if bound <= keep:
            continue
        seen = counts(conn, fork)  # what it sees does not change
        inherited = [r for r in ranges(conn, fork) if r.session_id != fork]
        sql, params = ranges_select(inherited, "seq, id, role, body", SQLITE)
        conn.execute(
            f"INSERT INTO turns (session_id, seq, id, role, body) SELECT ?, * FROM ({sql})",
            [fork, *params],
        )
        conn.execute(FORK_SQL.unlink, (fork,))
        set_counts(conn, fork, seen)


def share_less(conn: _Conn, session_id: str, keep: int) -> bool:
    """Let ``session_id`` see only its first ``keep`` shared turns (its own rows from
    ``keep`` on are the caller's to rewrite); whether it saw more."""
    if keep:
        lowered = conn.execute(FORK_SQL.lower_bound, (keep, session_id, keep)).rowcount
    else:
        lowered = conn.execute(FORK_SQL.unlink, (session_id,)).rowcount
    return bool(lowered)
