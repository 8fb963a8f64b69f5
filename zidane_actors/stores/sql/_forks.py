"""Forks that share their source's rows, written once for both SQL stores.

A fork holds no copy of the history it was forked with: its ``forks`` row names the
session it shares from (``parent_id``) and how many of that session's visible turns it
sees (``bound``); its own turns continue at ``seq = bound``. Along a chain of forks
every session numbers its turns in one sequence, so a session's visible turns are its
own rows plus, for each ancestor, that ancestor's own rows below every bound between
them. :data:`RANGES` computes those row ranges, the one rule every read of turns
follows (loads, pages, counts, search words, turn-id checks, the model's view).

A write that would delete or rewrite rows a fork still sees (a save or history edit
rewriting turns below a fork's bound, a delete) first copies those rows into that fork
and lowers its bound (:func:`unshare`), so such a write costs once what the forks need,
and nothing else ever changes what another session reads. A fork itself is made by
:func:`plan_fork` (or the store's one statement reading the same): a header, the runs
it keeps and one ``forks`` row, whatever the length of the history. Which runs it drops
(those only the turns it leaves out belong to) is decided by index probes per run
(:func:`left_out`, over ``turns_runs``: each turn's ``runId``), never reading a turn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from typing import Any, Final, NoReturn

import attrs
import msgspec

from ...model import (
    SessionData,
    SessionTurn,
    fork_document,
    forked_from,
    turn_index,
)
from .._validate import checked_int
from ._dialect import Dialect

__all__ = [
    "FORKED_FROM",
    "RANGES",
    "RUN_KEY_ROWS",
    "RUN_OF",
    "TURN_COLUMNS",
    "ForkPlan",
    "ForkSQL",
    "RowRange",
    "dropped_runs",
    "first_turn_row",
    "fork_sql",
    "forks_candidates",
    "forks_named",
    "has_forks",
    "heirs",
    "left_out",
    "link_fork",
    "no_turn",
    "plan_fork",
    "ranges_of",
    "ranges_select",
    "recount",
    "share_less",
    "shared_turns",
    "unshare",
    "visible_rows",
]

RANGES: Final = (
    "WITH RECURSIVE chain (session_id, parent_id, lo, hi) AS ("
    " SELECT s.id, f.parent_id, COALESCE(f.bound, 0), CAST(NULL AS BIGINT)"
    " FROM (SELECT CAST(? AS TEXT) AS id) s LEFT JOIN forks f ON f.session_id = s.id"
    " UNION ALL SELECT c.parent_id, f.parent_id, COALESCE(f.bound, 0),"
    " CASE WHEN c.hi IS NULL OR c.lo < c.hi THEN c.lo ELSE c.hi END"
    " FROM chain c LEFT JOIN forks f ON f.session_id = c.parent_id"
    " WHERE c.parent_id IS NOT NULL)"
    " SELECT session_id, lo, hi FROM chain WHERE hi IS NULL OR lo < hi ORDER BY lo"
)
"""The row ranges ``(session_id, lo, hi)`` holding the turns a session (the parameter)
sees, oldest first: ``lo <= seq < hi`` (``hi`` NULL: no end). Each session of its fork
chain contributes its own rows, from its bound (0 for the root) to the lowest bound
below it in the chain."""


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


class ForkSQL:
    """The statements of fork sharing in one dialect's spelling."""

    __slots__ = (
        "dialect",
        "forks_of",
        "has_forks",
        "inheritors",
        "link",
        "link_of",
        "lower_bound",
        "ranges",
        "unlink",
    )

    def __init__(self, dialect: Dialect) -> None:
        sql = dialect.sql
        self.dialect = dialect
        self.link_of = sql("SELECT parent_id, bound FROM forks WHERE session_id = ?")
        """A session's own ``forks`` row (one key lookup: most sessions have none)."""
        self.ranges = sql(RANGES)
        self.forks_of = sql(
            "SELECT session_id, bound FROM forks WHERE parent_id = ? ORDER BY session_id"
        )
        """The sessions sharing rows of a session, and how many each sees."""
        self.has_forks = sql("SELECT 1 FROM forks WHERE parent_id = ? LIMIT 1")
        self.inheritors = sql(
            "WITH RECURSIVE heirs (session_id) AS ("
            " SELECT session_id FROM forks WHERE parent_id = ? AND bound > ?"
            " UNION ALL SELECT f.session_id FROM forks f JOIN heirs h"
            " ON f.parent_id = h.session_id AND f.bound > ?) SELECT session_id FROM heirs"
        )
        """Parameters ``(session, seq, seq)``: the sessions besides it seeing that row."""
        self.link = sql("INSERT INTO forks (session_id, parent_id, bound) VALUES (?, ?, ?)")
        self.unlink = sql("DELETE FROM forks WHERE session_id = ?")
        self.lower_bound = sql("UPDATE forks SET bound = ? WHERE session_id = ? AND bound > ?")


@cache
def fork_sql(dialect: Dialect) -> ForkSQL:
    """The fork statements rendered in ``dialect`` (once per dialect)."""
    return ForkSQL(dialect)


def ranges_of(db: Any, dialect: Dialect, session_id: str) -> tuple[RowRange, ...]:
    """The row ranges of the turns ``session_id`` sees (:data:`RANGES`), read through
    ``db``; a session sharing nothing costs one key lookup."""
    statements = fork_sql(dialect)
    if db.execute(statements.link_of, (session_id,)).fetchone() is None:
        return (RowRange(session_id, 0, None),)
    rows = db.execute(statements.ranges, (session_id,)).fetchall()
    return tuple(
        RowRange(str(sid), int(lo), None if hi is None else int(hi)) for sid, lo, hi in rows
    )


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


TurnRow = tuple[int, str, str, Any]
"""A turn row as the stores read it: ``seq, id, role, body``."""

Decode = Callable[[str, Sequence[TurnRow]], tuple[SessionTurn, ...]]
"""A store's decoding of its turn rows (of a session, for its error messages)."""


def visible_rows(
    db: Any,
    dialect: Dialect,
    ranges: Sequence[RowRange],
    from_: int = 0,
    limit: int | None = None,
) -> list[TurnRow]:
    """The ``(seq, id, role, body)`` rows of ``ranges`` from ``seq >= from_`` on, at most
    ``limit``, in order."""
    clipped = [c for r in ranges if (c := r.within(from_))]
    if not clipped:
        return []
    sql, params = ranges_select(clipped, "seq, id, role, body", dialect)
    if limit is not None:
        sql += dialect.sql(" LIMIT ?")
        params.append(limit)
    rows: list[TurnRow] = db.execute(sql, params).fetchall()
    return rows


RUN_OF: Final = {
    "sqlite": ("run_id", "run_id IS NOT NULL"),
    "postgres": ("json_member(body, 'runId')", "strpos(body, '\"runId\"') > 0"),
}
"""Per dialect, SQL of a turn row's ``runId`` (NULL when its JSON does not spell
``"runId"`` or does not parse) and the condition of the index of that expression
(``turns_runs``); a query naming both finds a run's turns by index, never reading a body.
SQLite keeps it in a column its writes fill (schema v16): no JSON is read per insert."""

RUN_KEY_ROWS: Final = {"postgres": 32}
"""Per dialect whose ``turns_runs`` keys a run's rows by ``seq / n`` instead of ``seq``,
that ``n`` (PostgreSQL: B-tree deduplication stores such a key once for up to ``n`` rows,
where ``seq`` made every key unique). A probe names the keys of its seq range too, so it
checks ``seq`` on at most ``2n`` rows of the run, however long the run."""

TURN_COLUMNS: Final = {"sqlite": "id, role, body, run_id", "postgres": "id, role, body"}
"""Per dialect, the columns of a turn row besides its key (``session_id, seq``): what a
copy of the row (:func:`unshare`) takes."""

FORKED_FROM: Final = {
    "sqlite": (
        "json_extract(metadata, '$.forkedFrom.sessionId')",
        "json_valid(metadata)",
    ),
    "postgres": (
        "json_member(metadata, 'forkedFrom', 'sessionId')",
        "strpos(metadata, '\"forkedFrom\"') > 0",
    ),
}
"""Per dialect, SQL of a header's ``forkedFrom.sessionId`` and the condition of its index
(``sessions_forked_from``): ``list_forks`` finds its candidates by index."""


def forks_candidates(dialect: Dialect) -> str:
    """SQL (parameter: the source's id): the ``id, metadata`` of the sessions whose
    metadata may name the source in ``forkedFrom`` (every one it names, found by index)."""
    value, held = FORKED_FROM[dialect.name]
    return dialect.sql(f"SELECT id, metadata FROM sessions WHERE {held} AND {value} = ?")


@attrs.frozen
class ForkPlan:
    """What a fork of a source keeps: the rows it shares (``ranges`` below ``bound``), how
    many user turns it leaves out (``users_left``) and its last kept turn (``last``)."""

    ranges: tuple[RowRange, ...]
    bound: int
    count: int
    users_left: int
    last: tuple[SessionTurn, ...]

    def header(self, source: SessionData, new_id: str, created_at: int) -> SessionData:
        """The fork's header (:func:`~zidane_actors.model.fork_document` of ``source``'s
        header and its last kept turn), without turns or runs."""
        head = msgspec.structs.replace(source, turns=self.last, runs=())
        fork = fork_document(head, new_id=new_id, at=None, created_at=created_at)
        return msgspec.structs.replace(fork, turns=(), runs=())

    def kept(self) -> list[RowRange]:
        """The row ranges of the turns the fork keeps."""
        return [c for r in self.ranges if (c := r.within(0, self.bound))]

    def left(self) -> list[RowRange]:
        """The row ranges of the source's turns the fork leaves out."""
        return [c for r in self.ranges if (c := r.within(self.bound))]


def no_turn(at: object) -> NoReturn:
    """Refuse ``at`` as naming no turn of the source (``turn_index``'s error)."""
    turn_index((), at)  # type: ignore[arg-type]  # raises the rule's error
    raise AssertionError("unreachable")


def plan_fork(
    db: Any,
    dialect: Dialect,
    source_id: str,
    count: int,
    at: object,
    created_at: object,
    decode: Decode,
    *,
    shares: bool = True,
    last: tuple[SessionTurn, ...] | None = None,
) -> ForkPlan:
    """The plan of a fork of ``source_id`` (holding ``count`` turns) through turn ``at``
    (all when ``None``; naming no turn: ``turn_index``'s ``ValidationError``), made at
    ``created_at`` (checked first). Reads the turn ``at`` names by index and counts the
    user turns after it, never reading a body but that turn's; ``shares=False``: the
    caller knows the source shares no rows itself (its ranges need no reading);
    ``last``: its last turn, read already."""
    checked_int(created_at, "createdAt")
    ranges = ranges_of(db, dialect, source_id) if shares else (RowRange(source_id, 0, None),)
    bound = count
    if at is not None:
        found = None
        if isinstance(at, str):
            sql, params = ranges_select(ranges, "seq", dialect, where="id = ?", values=(at,))
            found = db.execute(sql, params).fetchone()
        if found is None:
            no_turn(at)
        bound = int(found[0]) + 1
    users = 0
    if bound < count:
        left = [c for r in ranges if (c := r.within(bound))]
        sql, params = ranges_select(left, "seq", dialect, where="role = 'user'")
        users = int(db.execute(f"SELECT COUNT(*) FROM ({sql}) u", params).fetchone()[0])
    if last is None or bound < count:
        last = decode(source_id, visible_rows(db, dialect, ranges, bound - 1, 1)) if bound else ()
    return ForkPlan(ranges, bound, count, users, last)


def _any_turn_of_run(
    ranges: Sequence[RowRange], run: str, values: Sequence[Any], dialect: Dialect
) -> tuple[str, list[Any]]:
    """SQL: whether a turn row of ``ranges`` belongs to the run ``run`` (an SQL expression,
    its parameters ``values``): one index probe (``turns_runs``) per range. A scalar
    subquery, not ``EXISTS``: PostgreSQL would hash an ``EXISTS`` over every row instead."""
    value, held = RUN_OF[dialect.name]
    held = f" AND {held}" if held else ""
    step = RUN_KEY_ROWS.get(dialect.name)
    parts: list[str] = []
    params: list[Any] = []
    for r in ranges:
        bounded = "" if r.stop is None else " AND seq < ?"
        keys = ""
        params += [r.session_id, *values]
        if step is not None:
            keys = f" AND seq / {step} >= ?" + ("" if r.stop is None else f" AND seq / {step} <= ?")
            params += [r.start // step] + ([] if r.stop is None else [(r.stop - 1) // step])
        parts.append(
            f"(SELECT 1 FROM turns WHERE session_id = ?{held} AND {value} = {run}{keys}"
            f" AND seq >= ?{bounded} LIMIT 1) IS NOT NULL"
        )
        params += [r.start] + ([] if r.stop is None else [r.stop])
    return "(" + (" OR ".join(parts) or "1 = 0") + ")", params


def left_out(
    plan: ForkPlan, dialect: Dialect, run: str, values: Sequence[Any] = ()
) -> tuple[str, list[Any]]:
    """SQL: whether the run ``run`` (an SQL expression, its parameters ``values``) is one
    only turns the fork leaves out belong to (the rule of
    :func:`~zidane_actors.model.fork_document`), by index probes: no turn is read."""
    left, left_params = _any_turn_of_run(plan.left(), run, values, dialect)
    kept, kept_params = _any_turn_of_run(plan.kept(), run, values, dialect)
    return f"{left} AND NOT {kept}", [*left_params, *kept_params]


def dropped_runs(db: Any, dialect: Dialect, plan: ForkPlan, run_ids: Iterable[str]) -> set[str]:
    """Of ``run_ids``, those only the turns a fork leaves out belong to, decided in one
    statement of :func:`left_out` per run (the run id a parameter: one seek per probe)."""
    if plan.bound >= plan.count:
        return set()
    parts: list[str] = []
    params: list[Any] = []
    for run_id in sorted(set(run_ids)):
        dropped, values = left_out(plan, dialect, "?", (run_id,))
        parts.append(f"SELECT CAST(? AS TEXT) WHERE {dropped}")
        params += [run_id, *values]
    if not parts:
        return set()
    return {row[0] for row in db.execute(dialect.sql(" UNION ALL ".join(parts)), params)}


# -- the steps of the stores' writes (inside the caller's transaction) ---------------------


def first_turn_row(db: Any, dialect: Dialect, session_id: str, seq: int) -> TurnRow | None:
    """The row of the turn ``session_id`` sees at ``seq`` (one a fork shares), or ``None``."""
    rows = visible_rows(db, dialect, ranges_of(db, dialect, session_id), seq, 1)
    return rows[0] if rows and rows[0][0] == seq else None


def shared_turns(
    db: Any, dialect: Dialect, session_id: str, ids: Sequence[str]
) -> dict[str, TurnRow]:
    """The row of each of ``ids`` that ``session_id`` sees in rows it shares with another
    session (none when it shares nothing): a fork's turn-id check."""
    inherited = [r for r in ranges_of(db, dialect, session_id) if r.session_id != session_id]
    if not inherited or not ids:
        return {}
    marks = ", ".join("?" * len(ids))
    sql, params = ranges_select(
        inherited, "seq, id, role, body", dialect, where=f"id IN ({marks})", values=ids
    )
    return {row[1]: row for row in db.execute(sql, params).fetchall()}


def has_forks(db: Any, dialect: Dialect, session_id: str) -> bool:
    """Whether a fork shares rows of ``session_id``."""
    return db.execute(fork_sql(dialect).has_forks, (session_id,)).fetchone() is not None


def heirs(db: Any, dialect: Dialect, session_id: str, seq: int) -> list[str]:
    """The sessions besides ``session_id`` that see its row at ``seq``."""
    return [r[0] for r in db.execute(fork_sql(dialect).inheritors, (session_id, seq, seq))]


def _stale(db: Any, dialect: Dialect, session_id: str) -> None:
    """Have the session's search words derived again (from the rows it sees now)."""
    db.execute(
        dialect.sql("INSERT INTO search_stale (session_id) VALUES (?) ON CONFLICT DO NOTHING"),
        (session_id,),
    )


def unshare(db: Any, dialect: Dialect, session_id: str, keep: int = 0) -> None:
    """Copy into each fork of ``session_id`` that sees its turns past the first ``keep``
    the rows it shares from there, and let it share only the first ``keep``: run before
    those turns are deleted or rewritten (the copy costs the rewritten part). What the
    fork sees, its counts and words do not change; forks of it keep sharing (from it)."""
    statements = fork_sql(dialect)
    for fork, bound in db.execute(statements.forks_of, (session_id,)).fetchall():
        if bound <= keep:
            continue
        counts = dialect.turn_counts
        seen = db.execute(
            dialect.sql(f"SELECT {counts} FROM sessions WHERE id = ?") + dialect.lock, (fork,)
        ).fetchone()
        ranges = ranges_of(db, dialect, fork)
        inherited = [c for r in ranges if r.session_id != fork and (c := r.within(keep, bound))]
        columns = TURN_COLUMNS[dialect.name]
        sql, params = ranges_select(inherited, f"seq, {columns}", dialect)
        copied = ", ".join(f"v.{c}" for c in columns.split(", "))
        db.execute(
            f"INSERT INTO turns (session_id, seq, {columns})"
            + dialect.sql(f" SELECT CAST(? AS TEXT), v.seq, {copied}")
            + f" FROM ({sql}) v",
            [fork, *params],
        )
        if keep:
            db.execute(statements.lower_bound, (keep, fork, keep))
        else:
            db.execute(statements.unlink, (fork,))
        names = counts.split(", ")
        db.execute(
            dialect.sql(f"UPDATE sessions SET {', '.join(f'{n} = ?' for n in names)} WHERE id = ?"),
            (*seen, fork),
        )


def share_less(db: Any, dialect: Dialect, session_id: str, keep: int) -> bool:
    """Let ``session_id`` see only the first ``keep`` of the turns it shares (its own rows
    from ``keep`` on are the caller's to rewrite); whether it saw more. Its search words
    are then derived again."""
    statements = fork_sql(dialect)
    if keep:
        lowered = db.execute(statements.lower_bound, (keep, session_id, keep)).rowcount
    else:
        lowered = db.execute(statements.unlink, (session_id,)).rowcount
    if lowered:
        _stale(db, dialect, session_id)
    return bool(lowered)


def recount(db: Any, dialect: Dialect, session_id: str) -> None:
    """Derive the counts of ``session_id`` (``dialect.turn_counts``) from the turns it sees."""
    sql, params = ranges_select(ranges_of(db, dialect, session_id), "seq, role", dialect)
    derived = db.execute(
        "SELECT COUNT(*), COUNT(CASE WHEN role = 'user' THEN 1 END),"
        f" MIN(CASE WHEN role = 'user' THEN seq END) FROM ({sql}) v",
        params,
    ).fetchone()
    names = dialect.turn_counts.split(", ")
    db.execute(
        dialect.sql(f"UPDATE sessions SET {', '.join(f'{n} = ?' for n in names)} WHERE id = ?"),
        (*derived[: len(names)], session_id),
    )


def link_fork(db: Any, dialect: Dialect, plan: ForkPlan, source_id: str, new_id: str) -> None:
    """Record that ``new_id`` shares the rows of ``plan`` (nothing when it keeps none); its
    search words are derived from theirs."""
    if plan.bound:
        db.execute(fork_sql(dialect).link, (new_id, source_id, plan.bound))
        _stale(db, dialect, new_id)


def forks_named(source_id: str, rows: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """The ids of ``rows`` (a session id and its metadata) whose ``forkedFrom`` names
    ``source_id`` (read as the memory store reads it), sorted: ``list_forks``."""
    return sorted(
        str(sid)
        for sid, metadata in rows
        if (origin := forked_from(metadata)) is not None and origin.session_id == source_id
    )
