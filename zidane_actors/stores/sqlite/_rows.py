"""The SQLite store's row codecs and the constants its modules share."""

from __future__ import annotations

import builtins
import sqlite3
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias, TypeVar, cast

import attrs
import msgspec
from msgspec import UNSET

from ...errors import (
    CorruptDataError,
    ValidationError,
)
from ...model import (
    MAX_STORED_JSON_DEPTH,
    AppendTurnsOptions,
    ExtraFields,
    RunOwner,
    SessionData,
    SessionRun,
    SessionTurn,
    check_json,
    check_model,
    check_unique_turn_ids,
    compaction_of,
    decode,
    decoder,
    parse_json,
    preview,
    stored_too_deep,
    validate_id,
)
from ...model._checked import CheckedTurns
from ...model._codec import encode_checked
from ...model._compaction import view_after
from ...model._depth import nests_at_most
from .._validate import (
    checked_header,
)
from ..sql import SQLITE, SharedSQL
from ..sql._codec import TOO_DEEP
from ..sql._forks import ranges_of, ranges_select

__all__ = ["Durability", "SQLiteStoreStatistics"]

T = TypeVar("T")

Durability: TypeAlias = Literal["full", "normal", "off"]
"""How hard a commit is pushed to disk (``PRAGMA synchronous`` under WAL).

- ``"full"``: every commit fsyncs the WAL; an acknowledged write survives a
  process crash and a power loss.
- ``"normal"``: survives a process crash (``kill -9``); a power loss or OS
  crash may drop the last commits, never corrupting the file.
- ``"off"``: no fsync; survives a process crash only; a power loss or OS
  crash may drop recent commits or corrupt the database.
"""

_SQL: Final = SharedSQL(SQLITE)

_SYNCHRONOUS: Final = {"full": "FULL", "normal": "NORMAL", "off": "OFF"}
_BUSY_CODES: Final = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED
_CORRUPT_CODES: Final = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB

_Conn: TypeAlias = sqlite3.Connection


def _transaction(conn: _Conn, fn: Callable[[_Conn], T], begin: Callable[[_Conn], object]) -> T:
    """``fn(conn)`` between ``begin(conn)`` and its commit; rolled back on any exception."""
    begin(conn)
    try:
        result = fn(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


_TurnValues: TypeAlias = tuple[str, str, str, bytes, str | None]
"""One appended turn's parameters of ``_APPEND_TURN``: session id, id, role, body, run id."""
_RunValues: TypeAlias = tuple[str, str, bytes]
"""One run's parameters of ``_UPSERT_RUN``: session id, run id, body."""
_AppendPlan: TypeAlias = tuple[str, list[_TurnValues], _RunValues | None]

_BUMP: Final = "UPDATE sessions SET rev = rev + 1, updated_at = ? WHERE id = ?"
# The bump of an append with a run, saying whether the session is a fork (shares turns).
_BUMP_FORKED: Final = (
    _BUMP + " RETURNING rev, EXISTS (SELECT 1 FROM forks WHERE forks.session_id = ?)"
)
# The next seq is read per row, so rows inserted by one executemany follow each other; a
# fork's first own turn follows the turns it shares (its bound). A turn id the session holds
# already is skipped here; the caller compares its row.
# The row's run_id is the turn's (schema v16), given by the caller, who encoded the turn.
_APPEND_TURN: Final = (
    "INSERT INTO turns (session_id, seq, id, role, body, run_id) VALUES"
    " (?1, COALESCE((SELECT MAX(seq) FROM turns WHERE session_id = ?1) + 1,"
    " (SELECT bound FROM forks WHERE session_id = ?1), 0), ?2, ?3, ?4, ?5)"
    " ON CONFLICT (session_id, id) DO NOTHING"
)
# A run is updated in place (its position kept) or added after the session's last one, in
# one statement (a DO UPDATE fires no insert trigger: run_count stays right).
_UPSERT_RUN: Final = (
    "INSERT INTO runs (session_id, id, position, body) VALUES (?1, ?2,"
    " (SELECT COALESCE(MAX(position), -1) + 1 FROM runs WHERE session_id = ?1), ?3)"
    " ON CONFLICT (session_id, id) DO UPDATE SET body = excluded.body"
)


def _primary_code(exc: sqlite3.Error) -> int:
    """The primary result code of ``exc`` (``SQLITE_BUSY`` for ``SQLITE_BUSY_RECOVERY``…)."""
    return int(getattr(exc, "sqlite_errorcode", 0)) & 0xFF


def _now() -> int:
    return time.time_ns() // 1_000_000


_TURN: Final = decoder(SessionTurn)
_METADATA: Final = decoder(dict[str, Any])
# The connection's page cache (KiB, negative): loads of long sessions re-read
# their pages from it rather than through the OS (SQLite's default is 2 MiB).
_CACHE_KIB: Final = 65_536


class _Busy(Exception):
    """Internal: the database stayed locked past the busy timeout."""


@attrs.frozen
class SQLiteStoreStatistics:
    """Counters of one open store (``SQLiteStore.statistics()``)."""

    path: str
    transactions: int
    busy_retries: int
    tasks_waiting: int
    transactions_here: int
    """Lone writes and one-row reads run in the trio thread, the connection's thread idle."""


def _decode_row(raw: bytes | str, type_: type[T], table: str, session_id: str, where: str) -> T:
    try:
        value: T = (_TURN if type_ is SessionTurn else decoder(cast(Hashable, type_))).decode(raw)
        if stored_too_deep(raw):
            raise RecursionError
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
        reason = TOO_DEEP if isinstance(exc, RecursionError) else exc
        raise CorruptDataError(
            f"table {table}: row of session {preview(session_id)}"
            f" at {where} does not decode: {reason}"
        ) from None
    return value


# A turn row holds the turn's id and role in its columns only: its body is the rest of
# the turn's JSON, ``{"content":…}`` (schema v9). A body that starts with the id is a whole
# turn: a row written before v9, or a turn whose JSON does not start with its id and role.
_WHOLE: Final = b'{"id":'
_json_text: Final = msgspec.json.Encoder().encode


def _row_body(body: bytes, turn_id: str, role: str) -> bytes:
    """The body a row stores for the turn whose JSON is ``body``: without its id and role."""
    head = b'{"id":%s,"role":%s,' % (_json_text(turn_id), _json_text(role))
    return b"{" + body[len(head) :] if body.startswith(head) else body


def _turn_json(turn_id: str, role: str, body: bytes | str) -> bytes:
    """The whole JSON of the turn a row holds (a body given as text is read as UTF-8)."""
    if type(body) is not bytes:  # another program's value: text is read, anything else refused
        body = body.encode() if isinstance(body, str) else b""
    if body.startswith(_WHOLE):
        return body
    return b'{"id":%s,"role":%s,%s' % (_json_text(turn_id), _json_text(role), body[1:])


def _role_json(role: str) -> bytes:
    return b',"role":%s,' % _json_text(role)


_ROLE_JSON: Final = {role: _role_json(role) for role in ("user", "assistant", "system", "command")}


def _decode_turns(
    session_id: str, rows: Iterable[tuple[int, str, str, bytes]]
) -> tuple[SessionTurn, ...]:
    """Decode turn rows (``seq, id, role, body``); name a bad row's seq.

    Each body is decoded as its own document, so a row holding two
    (``{...},{...}``) is refused rather than read as two turns. A row msgspec
    alone does not read (an unknown field, a lone surrogate escape, an error)
    takes ``_decode_row``: read as the model reads it, or refused, located.
    """
    plain, roles, enc, join = _TURN.plain, _ROLE_JSON, _json_text, b"".join
    turns: builtins.list[SessionTurn] = []
    append = turns.append
    for seq, tid, role, body in rows:
        if type(body) is bytes and not body.startswith(_WHOLE):
            # _turn_json inline, the role's bytes looked up, the body's bytes copied once
            raw = join(
                (b'{"id":', enc(tid), roles.get(role) or _role_json(role), memoryview(body)[1:])
            )
        else:
            raw = _turn_json(tid, role, body)
        try:
            turn = plain(raw)
        except (msgspec.ValidationError, msgspec.DecodeError, UnicodeEncodeError, RecursionError):
            append(_decode_row(raw, SessionTurn, "turns", session_id, f"seq {seq}"))
            continue
        # The decoded text lies inside the row's strings: the bytes outside it bound the
        # row's brackets, so most rows need no count of every byte.
        if not nests_at_most(turn, len(raw), MAX_STORED_JSON_DEPTH) and stored_too_deep(raw):
            _decode_row(raw, SessionTurn, "turns", session_id, f"seq {seq}")  # raises it, located
        append(turn)
    return tuple(turns)


def _session_turns(conn: _Conn, session_id: str) -> tuple[SessionTurn, ...]:
    """Every turn the session sees, decoded as the cursor hands the rows over: each row's
    bytes are freed once decoded, so a long history's rows are never all held at once."""
    sql, params = ranges_select(ranges_of(conn, SQLITE, session_id), "seq, id, role, body", SQLITE)
    cursor = conn.execute(sql, params)
    try:
        return _decode_turns(session_id, cursor)
    finally:
        cursor.close()


def _decode_metadata(raw: str, session_id: str) -> dict[str, Any]:
    if raw == "{}":
        return {}
    try:  # the decoder held, not looked up: this runs for every row list_meta answers
        metadata: dict[str, Any] = _METADATA.decode(raw)
        if stored_too_deep(raw):
            raise RecursionError
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return _decode_row(raw, dict[str, Any], "sessions", session_id, "column metadata")
    return metadata


def _decode_extra(raw: str | None, session_id: str) -> ExtraFields | None:
    if raw is None:
        return None
    return ExtraFields(
        _decode_row(raw.encode(), dict[str, Any], "sessions", session_id, "column extra")
    )


def _decode_owner(raw: str | None, session_id: str) -> RunOwner | None:
    if raw is None:
        return None
    return _decode_row(raw.encode(), RunOwner, "sessions", session_id, "column run_owner")


def _metadata_json(metadata: Mapping[str, Any]) -> str:
    if not isinstance(metadata, Mapping):
        raise ValidationError("session metadata must be a mapping with string keys")
    kept = {k: v for k, v in metadata.items() if v is not UNSET}
    check_json(kept, what="session metadata", path="$.metadata")
    try:
        return encode_checked(kept).decode()
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValidationError(f"session metadata is not JSON-serializable: {exc}") from None


def _valid_body(value: object, type_: type[T], what: str, path: str = "$") -> bytes:
    """``value`` encoded, after checking it decodes back as ``type_`` (constraints, tags)."""
    if type(value) is not type_ and not isinstance(value, type_):
        raise ValidationError(f"{what} must be a {type_.__name__}, got {type(value).__name__}")
    check_model(value, what=what, path=path)
    try:
        body = encode_checked(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValidationError(f"{what} is not JSON-serializable: {exc}") from None
    decode(body, type_, what=what)
    return body


def _valid_header(data: object) -> SessionData:
    """``data`` with its header fields checked (turns and runs are checked one by one)."""
    data = checked_header(data)
    metadata = parse_json(_metadata_json(data.metadata))
    header = msgspec.structs.replace(data, metadata=metadata, turns=(), runs=())
    _valid_body(header, SessionData, "session data")
    return data


def _turn_rows_of(
    turns: object, start: int, where: str = "$"
) -> builtins.list[tuple[int, str, str, bytes]]:
    """Validated ``(seq, id, role, body)`` rows for ``turns`` numbered from ``start``.

    ``where`` locates ``turns`` in the caller's argument (``$.turns`` in a save).
    Turn ids must be distinct (``check_unique_turn_ids``). A ``CheckedTurns``
    was checked already: its rows take its bodies.
    """
    if type(turns) is CheckedTurns:
        pairs = enumerate(zip(turns, turns.bodies, strict=True), start)
        return [(seq, t.id, t.role, body) for seq, (t, body) in pairs]
    # Lists and tuples first: the Sequence ABC check is slow on this hot path.
    if not isinstance(turns, (list, tuple)) and (
        isinstance(turns, (str, bytes)) or not isinstance(turns, Sequence)
    ):
        raise ValidationError(
            f"turns must be a sequence of SessionTurn, got {type(turns).__name__}"
        )
    rows = []
    for i, turn in enumerate(turns):
        body = _valid_body(turn, SessionTurn, f"turn {i}", f"{where}[{i}]")
        validate_id(turn.id, what=f"turn id at $[{i}]")
        rows.append((start + i, turn.id, turn.role, body))
    check_unique_turn_ids(cast(Sequence[SessionTurn], turns), path=where)
    return rows


def _run_body(run: object) -> bytes:
    body = _valid_body(run, SessionRun, "run")
    assert isinstance(run, SessionRun)
    validate_id(run.id, what="run id")
    return body


def _options_run_body(options: object) -> tuple[str, bytes] | None:
    """The id and body of the run of append ``options`` (``None``: no run), checked with
    the options in one pass: the options' check walks and decodes their run too."""
    _valid_body(options, AppendTurnsOptions, "append options")
    run = cast(AppendTurnsOptions, options).run
    if run is None:
        return None
    validate_id(run.id, what="run id")
    return run.id, encode_checked(run)


def _owner_json(owner: RunOwner) -> str:
    return _valid_body(owner, RunOwner, "run owner").decode()


def _session_id(value: object) -> str:
    return validate_id(value, what="session id")


# -- the model's view (``load_model_view``): read from the latest compaction on -----------

_COMMANDS_PAGE: Final = 16
"""``command`` rows read at a time, newest first, looking for the latest compaction."""
_Row: TypeAlias = tuple[int, str, str, bytes]


def _commands_before(conn: _Conn, session_id: str, seq: int) -> builtins.list[_Row]:
    """The session's ``command`` rows below ``seq``, newest first, one page (``turns_commands``)."""
    rows: builtins.list[_Row] = conn.execute(
        "SELECT seq, id, role, body FROM turns WHERE session_id = ? AND role = 'command'"
        " AND seq < ? ORDER BY seq DESC LIMIT ?",
        (session_id, seq, _COMMANDS_PAGE),
    ).fetchall()
    return rows


def _seq_of(conn: _Conn, session_id: str, turn_id: str) -> int | None:
    """The seq of the session's turn ``turn_id`` (``turns_by_id``), ``None`` when it has none."""
    row = conn.execute(
        "SELECT seq FROM turns WHERE session_id = ? AND id = ?", (session_id, turn_id)
    ).fetchone()
    return None if row is None else int(row[0])


def _rows_after(conn: _Conn, session_id: str, seq: int) -> builtins.list[_Row]:
    """The session's turn rows above ``seq``, oldest first (``turns_by_session``)."""
    rows: builtins.list[_Row] = conn.execute(
        "SELECT seq, id, role, body FROM turns WHERE session_id = ? AND seq > ? ORDER BY seq",
        (session_id, seq),
    ).fetchall()
    return rows


def _model_view(conn: _Conn, session_id: str) -> builtins.list[SessionTurn]:
    """``model_view`` of the session's turns, reading none a compaction summarized.

    The latest marker whose ``through`` names an earlier turn is found among the
    ``command`` rows, newest first; then only the rows after its ``through`` are read.
    """
    below = 2**63 - 1
    while True:
        rows = _commands_before(conn, session_id, below)
        for (seq, *_), turn in zip(rows, _decode_turns(session_id, rows), strict=True):
            found = compaction_of(turn)
            at = None if found is None else _seq_of(conn, session_id, found.through)
            if at is not None and at < seq:
                return view_after(
                    found, _decode_turns(session_id, _rows_after(conn, session_id, at))
                )
        if len(rows) < _COMMANDS_PAGE:
            return view_after(None, _decode_turns(session_id, _rows_after(conn, session_id, -1)))
        below = rows[-1][0]
