"""The PostgreSQL store's reads: meta rows, filters, histories, send requests, schedules."""

from __future__ import annotations

from typing import Any, Final, Literal, cast

import msgspec

from ...errors import (
    CorruptDataError,
    ValidationError,
)
from ...model import (
    MAX_STORED_JSON_DEPTH,
    Schedule,
    ScheduleFire,
    SessionFilter,
    SessionHistory,
    SessionMetaRow,
    SessionRun,
    SessionSearch,
    SessionTurn,
    compaction_of,
    corrupt_meta_row,
    decoder,
    preview,
    query_words,
    stored_too_deep,
    validate_id,
)
from ...model._compaction import view_after
from ...model._depth import nests_at_most
from .._protocol import (
    HistoryMutation,
    MutateResult,
)
from .._validate import (
    check_ids,
    checked,
    checked_items,
    now_ms,
)
from ..sql import POSTGRES, meta_row, search_header_sql, search_words_sql, session_filter_sql
from ._rows import (
    _Cursor,
    _decode,
    seen_scalar,
)
from ._schema import MARKERS
from ._writes import (
    _lock_header,
    _metadata,
    _owner,
    _replace_runs,
    _replace_turns,
)

__all__ = []

_META_SELECT: Final = (
    "SELECT s.id, s.metadata, s.created_at, s.updated_at, s.status, s.agent_id,"
    " s.project_root, s.run_owner::text, s.rev, s.turn_count, s.user_turn_count,"
    " (SELECT count(*) FROM runs r WHERE r.session_id = s.id),"
    " (SELECT count(*) FROM artifacts a WHERE a.session_id = s.id), "
    + seen_scalar("s.id", "SELECT body FROM {turns} t WHERE role = 'user' ORDER BY seq LIMIT 1")
    + " FROM sessions s"
)


def _meta_row(row: tuple[Any, ...]) -> SessionMetaRow:
    session_id = row[0]
    metadata = _metadata(row[1], session_id)
    first_user = None
    if row[13] is not None and "title" not in metadata:
        first_user = _decode(
            row[13], SessionTurn, "turns", f"(session_id={preview(session_id)}) first"
        )
    head = (session_id, row[5], row[6], row[4], row[2], row[3], row[8])
    return meta_row(head, row[9:13], metadata, _owner(row[7], session_id), first_user)


def _listed_row(row: tuple[Any, ...]) -> SessionMetaRow:
    """``_meta_row``, or the row naming a session whose header does not decode."""
    try:
        return _meta_row(row)
    except CorruptDataError as exc:
        return corrupt_meta_row(row[0], row[3], exc)


def _session_where(filter: SessionFilter | None) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if filter is not None:
        filter = checked(filter, SessionFilter, "session filter")
        clauses, params = session_filter_sql(filter, POSTGRES.placeholder)
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    order = ' ORDER BY s.updated_at DESC, s.id COLLATE "C"'
    if filter is not None and filter.limit is not None:
        order += " LIMIT %s"
        params.append(filter.limit)
    return where + order, params


def _search_where(search: SessionSearch) -> tuple[str, list[Any]]:
    """The WHERE clause of ``search`` over ``sessions s``: words through ``session_words``."""
    clauses, params = search_words_sql(query_words(search.text or ""), POSTGRES.placeholder)
    header, values = search_header_sql(search, POSTGRES.placeholder)
    clauses += header
    params += values
    return (f" WHERE {' AND '.join(clauses)}" if clauses else ""), params


_AGG: Final = (
    "'[[' || string_agg(length(body)::text, ',' ORDER BY seq) || '],['"
    " || string_agg(body, ',' ORDER BY seq) || ']]'"
)
"""Rows' lengths and their JSON bodies, one JSON document: ``[[<length>,…],[<body>,…]]``
(``NULL`` for no rows)."""


def _decode_list(
    cur: _Cursor, text: str | None, type_: Any, table: str, session_id: str
) -> tuple[Any, ...]:
    """Decode ``table`` rows aggregated as ``[[<length>,…],[<body>,…]]`` (:data:`_AGG`).

    One decode of the whole text. Names the bad row on failure. The lengths
    count the rows, catching a row holding two documents (``{...},{...}``),
    which the joined array would read as two items; they also locate each
    row's text for its depth check (:func:`_nests_too_deep`).
    """
    if text is None:
        return ()
    try:
        sizes, items = decoder(tuple[tuple[int, ...], tuple[type_, ...]]).decode(text)
        if len(items) == len(sizes) and not _nests_too_deep(text, sizes, items):
            return cast(tuple[Any, ...], items)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        pass
    cur.execute(
        f"SELECT seq, body FROM {table} WHERE session_id = %s ORDER BY seq",
        (session_id,),
    )
    for seq, body in cur.fetchall():
        _decode(body, type_, table, f"(session_id={preview(session_id)}, seq={seq})")
    raise CorruptDataError(f"{table} rows of session {preview(session_id)} do not decode")


def _nests_too_deep(text: str, sizes: tuple[int, ...], items: tuple[Any, ...]) -> bool:
    """Whether a row of :data:`_AGG`'s ``text`` nests past ``MAX_STORED_JSON_DEPTH``.

    A turn's text bounds its brackets (:func:`nests_at_most`): only a row it
    does not bound, and every row of another table, has its brackets counted.
    """
    at = text.index("],[") + 3  # the first row's text: after the lengths (digits, commas)
    for size, item in zip(sizes, items, strict=True):
        bounded = type(item) is SessionTurn and nests_at_most(item, size, MAX_STORED_JSON_DEPTH)
        if not bounded and stored_too_deep(text[at : at + size]):
            return True
        at += size + 1
    return False


def _history(cur: _Cursor, session_id: str) -> SessionHistory:
    cur.execute(
        f"SELECT {seen_scalar('%(sid)s', f'SELECT {_AGG} FROM {{turns}} v')},"
        f" (SELECT {_AGG} FROM runs WHERE session_id = %(sid)s)",
        {"sid": session_id},
    )
    row = cur.fetchone()
    assert row is not None
    return SessionHistory(
        turns=_decode_list(cur, row[0], SessionTurn, "turns", session_id),
        runs=_decode_list(cur, row[1], SessionRun, "runs", session_id),
    )


# -- the model's view (``load_model_view``): read from the latest compaction on -----------
# Each statement reads the session's rev too: statements of one read-committed
# transaction see their own snapshots, so the view is answered only when every
# statement saw the same rev (every write of turns moves it).

_COMMANDS_PAGE: Final = 16
"""``command`` rows read at a time, newest first, looking for the latest compaction."""
_TOP: Final = 2**63 - 1


def _commands_below(
    cur: _Cursor, session_id: str, below: int
) -> tuple[int, list[tuple[int, SessionTurn]]] | None:
    """The session's rev and its turns below seq ``below`` that may be compaction markers
    (:data:`MARKERS`), newest first, one page (``turns_commands``); ``None`` when there is
    no such session."""
    cur.execute(
        "SELECT s.rev, c.seq, c.body FROM sessions s LEFT JOIN LATERAL (SELECT seq, body"
        f" FROM turns WHERE session_id = s.id AND {MARKERS} AND seq < %s"
        " ORDER BY seq DESC LIMIT %s) c ON true WHERE s.id = %s",
        (below, _COMMANDS_PAGE, session_id),
    )
    rows = cur.fetchall()
    if not rows:
        return None
    key = f"(session_id={preview(session_id)}) seq "
    commands = [
        (seq, _decode(body, SessionTurn, "turns", f"{key}{seq}"))
        for _, seq, body in rows
        if seq is not None
    ]
    return int(rows[0][0]), commands


def _turns_after(
    cur: _Cursor, session_id: str, through: str | None, below: int
) -> tuple[int, tuple[SessionTurn, ...] | None] | None:
    """The session's rev and its turns after turn ``through`` (every turn when ``None``),
    oldest first; ``None`` for the turns when ``through`` names no turn below seq
    ``below``, ``None`` alone when there is no such session."""
    if through is None:
        after = "SELECT -1 AS seq"
        params: tuple[object, ...] = (session_id,)
    else:
        after = "SELECT seq FROM turns WHERE session_id = s.id AND id = %s AND seq < %s"
        params = (through, below, session_id)
    cur.execute(
        f"SELECT s.rev, a.seq, (SELECT {_AGG} FROM turns WHERE session_id = s.id AND seq > a.seq)"
        f" FROM sessions s LEFT JOIN LATERAL ({after}) a ON true WHERE s.id = %s",
        params,
    )
    row = cur.fetchone()
    if row is None:
        return None
    if row[1] is None:
        return int(row[0]), None
    return int(row[0]), _decode_list(cur, row[2], SessionTurn, "turns", session_id)


def _model_view(cur: _Cursor, session_id: str) -> list[SessionTurn] | Literal[False] | None:
    """``model_view`` of the session's turns, reading none a compaction summarized;
    ``None`` when there is no such session, ``False`` when a write moved its rev
    between the statements (read again).

    The latest marker whose ``through`` names an earlier turn is found among the
    ``command`` rows, newest first; then only the rows after its ``through`` are read.
    """
    below, first = _TOP, None
    while True:
        page = _commands_below(cur, session_id, below)
        if page is None:
            return None if first is None else False
        rev, commands = page
        if first is not None and rev != first:
            return False
        first = rev
        for seq, turn in commands:
            found = compaction_of(turn)
            if found is None:
                continue
            read = _turns_after(cur, session_id, found.through, seq)
            if read is None or read[0] != rev:
                return False
            if read[1] is not None:
                return view_after(found, read[1])
        if len(commands) < _COMMANDS_PAGE:
            read = _turns_after(cur, session_id, None, _TOP)
            if read is None or read[0] != rev or read[1] is None:
                return False
            return view_after(None, read[1])
        below = commands[-1][0]


def _mutate(
    cur: _Cursor, session_id: str, mutate: HistoryMutation, *, runs_too: bool
) -> MutateResult:
    validate_id(session_id)
    if _lock_header(cur, session_id) is None:
        return "no-session"
    history = _history(cur, session_id)
    result = mutate(history)
    if result is None:
        return "unchanged"
    if not isinstance(result, SessionHistory):
        raise ValidationError(
            "mutate_history callback must return a SessionHistory or None,"
            f" got {type(result).__name__}"
        )
    turns = checked_items(result.turns, SessionTurn, "history turns")
    runs = history.runs
    if runs_too and result.runs != history.runs:
        runs = checked_items(result.runs, SessionRun, "history runs")
    check_ids(turns, runs)
    if turns != history.turns:
        _replace_turns(cur, session_id, turns)
    if runs is not history.runs:
        _replace_runs(cur, session_id, runs)
    cur.execute(
        "UPDATE sessions SET updated_at = %s, rev = nextval('revs') WHERE id = %s",
        (now_ms(), session_id),
    )
    return "ok"


def _schedule(row: tuple[Any, ...]) -> Schedule:
    schedule: Schedule = _decode(row[0], Schedule, "schedules", f"id={preview(row[1])}")
    last_fire = None
    if row[3] is not None:
        last_fire = _decode(
            row[3], ScheduleFire, "schedule_fires", f"schedule_id={preview(row[1])}"
        )
    return msgspec.structs.replace(schedule, next_fire_at=row[2], last_fire=last_fire)


def _gen_uuid(cur: _Cursor) -> str:
    cur.execute("SELECT gen_random_uuid()::text")
    row = cur.fetchone()
    assert row is not None
    return str(row[0])
