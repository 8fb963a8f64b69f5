"""Forks that share their source's rows, written once for both SQL stores.

A fork holds no copy of the history it was forked with: its ``forks`` row names the
session it shares from (``parent_id``) and how many of that session's visible turns it
sees (``bound``); its own turns continue at ``seq = bound``. Along a chain of forks
every session numbers its turns in one sequence, so a session's visible turns are its
own rows plus, for each ancestor, that ancestor's own rows below every bound between
them. :func:`visible_ranges` computes those row ranges, the one rule every read of
turns follows (loads, pages, counts, search words, turn-id checks).

A write that would delete or rewrite rows a fork still sees (a whole save, a history
edit reaching below a fork's bound, a delete) first copies them into that fork
(:data:`DETACH_SQL`), so such a write costs once what the forks need, and nothing else
ever changes what another session reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import attrs

from ._dialect import Dialect

__all__ = [
    "ForkSQL",
    "RowRange",
    "ranges_of",
    "ranges_select",
    "visible_ranges",
]


@attrs.frozen
class RowRange:
    """The turn rows of ``session_id`` with ``start <= seq < stop`` (``stop`` None: no end)."""

    session_id: str
    start: int
    stop: int | None

    def within(self, start: int, stop: int | None = None) -> RowRange | None:
        """This range cut to ``start <= seq < stop``, or ``None`` when nothing is left."""
        start = max(start, self.start)
        if stop is None or (self.stop is not None and self.stop < stop):
            stop = self.stop
        if stop is not None and start >= stop:
            return None
        return RowRange(self.session_id, start, stop)


def visible_ranges(session_id: str, chain: Iterable[tuple[str, str, int]]) -> tuple[RowRange, ...]:
    """The row ranges holding the visible turns of ``session_id``, oldest first.

    ``chain`` is the session's ``forks`` rows and its ancestors', nearest first
    (``session_id, parent_id, bound``), as :attr:`ForkSQL.chain` reads them; empty for a
    session that shares nothing.
    """
    ranges: list[RowRange] = []
    owner, stop = session_id, None
    for sid, parent, bound in chain:
        if sid != owner:  # not the next link (rows read out of order): refuse to guess
            raise AssertionError(f"fork chain of {session_id!r} is broken at {sid!r}")
        if stop is None or bound < stop:
            ranges.append(RowRange(sid, bound, stop))
            stop = bound
        owner = parent
    if stop is None or stop > 0:
        ranges.append(RowRange(owner, 0, stop))
    ranges.reverse()
    return tuple(r for r in ranges if r.stop is None or r.start < r.stop)


def ranges_select(
    ranges: Sequence[RowRange],
    columns: str,
    dialect: Dialect,
    *,
    where: str = "",
    values: Sequence[Any] = (),
) -> tuple[str, list[Any]]:
    """One SELECT of ``columns`` from ``turns`` over ``ranges``, rows in ``seq`` order; its
    SQL and parameters. ``where`` is a further condition with ``?`` marks and ``values``."""
    parts: list[str] = []
    params: list[Any] = []
    extra = f" AND {where}" if where else ""
    for r in ranges:
        bounded = "" if r.stop is None else " AND seq < ?"
        parts.append(
            f"SELECT {columns} FROM turns WHERE session_id = ? AND seq >= ?{bounded}{extra}"
        )
        params += [r.session_id, r.start] if r.stop is None else [r.session_id, r.start, r.stop]
        params += values
    if len(parts) == 1:
        return dialect.sql(parts[0] + " ORDER BY seq"), params
    union = " UNION ALL ".join(f"SELECT * FROM ({p}) r{i}" for i, p in enumerate(parts))
    return dialect.sql(f"SELECT * FROM ({union}) v ORDER BY seq"), params


_CHAIN: Final = (
    "WITH RECURSIVE chain (session_id, parent_id, bound, depth) AS ("
    " SELECT session_id, parent_id, bound, 0 FROM forks WHERE session_id = ?"
    " UNION ALL SELECT f.session_id, f.parent_id, f.bound, c.depth + 1"
    " FROM forks f JOIN chain c ON f.session_id = c.parent_id)"
    " SELECT session_id, parent_id, bound FROM chain ORDER BY depth"
)

# The sessions that see a row of ``?`` at ``seq = ?``: its forks with a bound past it,
# theirs, and so on.
_INHERITORS: Final = (
    "WITH RECURSIVE heirs (session_id) AS ("
    " SELECT session_id FROM forks WHERE parent_id = ? AND bound > ?"
    " UNION ALL SELECT f.session_id FROM forks f JOIN heirs h ON f.parent_id = h.session_id"
    " AND f.bound > ?) SELECT session_id FROM heirs"
)


class ForkSQL:
    """The statements of fork sharing in one dialect's spelling."""

    __slots__ = ("chain", "forks_of", "inheritors", "link", "link_of", "lower_bound", "unlink")

    def __init__(self, dialect: Dialect) -> None:
        sql = dialect.sql
        self.link_of = sql("SELECT parent_id, bound FROM forks WHERE session_id = ?")
        """A session's own ``forks`` row (one key lookup: most sessions have none)."""
        self.chain = sql(_CHAIN)
        """The ``forks`` rows of a session and its ancestors, nearest first."""
        self.forks_of = sql(
            "SELECT session_id, bound FROM forks WHERE parent_id = ? ORDER BY session_id"
        )
        """The sessions sharing rows of a session, and how many each sees."""
        self.inheritors = sql(_INHERITORS)
        """Parameters ``(session, seq, seq)``: the sessions seeing that row of it."""
        self.link = sql("INSERT INTO forks (session_id, parent_id, bound) VALUES (?, ?, ?)")
        self.unlink = sql("DELETE FROM forks WHERE session_id = ?")
        self.lower_bound = sql("UPDATE forks SET bound = ? WHERE session_id = ? AND bound > ?")


def ranges_of(db: Any, fork_sql: ForkSQL, session_id: str) -> tuple[RowRange, ...]:
    """The visible row ranges of ``session_id``, read through ``db`` (a session sharing
    nothing costs one key lookup)."""
    if db.execute(fork_sql.link_of, (session_id,)).fetchone() is None:
        return (RowRange(session_id, 0, None),)
    return visible_ranges(session_id, db.execute(fork_sql.chain, (session_id,)).fetchall())
