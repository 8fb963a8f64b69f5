"""The SQLite store's listing, metadata, search, run claims and history rewrites."""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Callable, Mapping
from typing import Any, Final

import trio

from ... import model
from ...errors import (
    CorruptDataError,
    ValidationError,
)
from ...model import (
    SaveMetaOptions,
    SessionFilter,
    SessionHistory,
    SessionMetaRow,
    SessionSearch,
    SessionSearchPage,
    SessionTurn,
    query_words,
)
from .._indexer import start_indexer
from .._protocol import (
    HistoryMutation,
    MutateResult,
    Revision,
    stale,
)
from ..sql import SQLITE, meta_row, search_header_sql, search_words_sql, session_filter_sql
from ..sql._forks import first_turn_row
from ._base import SQLiteBase, turn_rows
from ._rows import (
    _BUSY_CODES,
    _SQL,
    _UPSERT_RUN,
    _Conn,
    _decode_metadata,
    _decode_owner,
    _decode_row,
    _decode_turns,
    _metadata_json,
    _now,
    _primary_code,
    _run_body,
    _session_id,
    _transaction,
    _turn_json,
    _valid_body,
    _valid_header,
)
from ._schema import index_pending, index_step

__all__ = ["SQLiteMeta"]


class SQLiteMeta(SQLiteBase):
    """Listing, metadata, search, run claims and history rewrites."""

    @staticmethod
    def _where(filter: SessionFilter | None) -> tuple[str, builtins.list[Any], str]:
        clauses: builtins.list[str] = []
        params: builtins.list[Any] = []
        limit = ""
        if filter is not None:
            _valid_body(filter, SessionFilter, "session filter")
            clauses, params = session_filter_sql(filter, SQLITE.placeholder)
            if filter.limit is not None:
                limit = f" LIMIT {int(filter.limit)}"
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        return where, params, limit

    async def list(self, filter: SessionFilter | None = None) -> builtins.list[str]:
        """Session ids, most recently updated first."""
        where, params, limit = self._where(filter)

        def op(conn: _Conn) -> builtins.list[str]:
            rows = conn.execute(
                f"{_SQL.list_ids}{where} ORDER BY s.updated_at DESC, s.id{limit}",
                params,
            ).fetchall()
            return [r[0] for r in rows]

        return await self._read(op)

    # -- header reads ---------------------------------------------------------------

    # The counts and the first user turn's seq are kept in the row by triggers
    # (schema v4), so a listed session costs one turn lookup at most: its first user
    # turn, joined when the metadata holds no title.
    # The last column is the seq of a first user turn the join missed: one a fork shares.
    _FIRST_SEQ: Final = (
        "CASE WHEN NOT json_valid(s.metadata) THEN NULL"
        " WHEN json_type(s.metadata, '$.title') IS NULL THEN s.first_user_seq END"
    )
    _META_SELECT: Final = (
        "SELECT s.id, s.agent_id, s.project_root, s.status, s.metadata, s.created_at,"
        " s.updated_at, s.run_owner, s.rev, s.turn_count, s.user_turn_count, s.run_count,"
        f" s.artifact_count, t.id, t.role, t.body, CASE WHEN t.id IS NULL THEN {_FIRST_SEQ}"
        " END FROM sessions s"
        f" LEFT JOIN turns t ON t.session_id = s.id AND t.seq = {_FIRST_SEQ}"
    )

    @staticmethod
    def _resolved(conn: _Conn, rows: builtins.list[tuple[Any, ...]]) -> builtins.list[Any]:
        """``rows`` of ``_META_SELECT`` with the first user turns forks share read."""
        resolved = []
        for row in rows:
            if row[16] is not None:
                first = first_turn_row(conn, SQLITE, row[0], row[16])
                row = (*row[:13], *(first[1:] if first else (None,) * 3))
            resolved.append(row[:16])
        return resolved

    @staticmethod
    def _meta_row(row: tuple[Any, ...]) -> SessionMetaRow:
        (sid, agent_id, project_root, status, metadata, created_at, updated_at, owner, rev,
         turns, users, runs, artifacts, first_id, first_role, first_body) = row  # fmt: skip
        first = None
        if first_body is not None:
            first_json = _turn_json(first_id, first_role, first_body)
            first = _decode_row(first_json, SessionTurn, "turns", sid, "its first user turn")
        head = (sid, agent_id, project_root, status, created_at, updated_at, rev)
        return meta_row(
            head,
            (turns, users, runs, artifacts),
            _decode_metadata(metadata, sid),
            _decode_owner(owner, sid),
            first,
        )

    @classmethod
    def _listed_row(cls, row: tuple[Any, ...]) -> SessionMetaRow:
        """``_meta_row``, or the row naming a session whose header does not decode."""
        try:
            return cls._meta_row(row)
        except CorruptDataError as exc:
            return model.corrupt_meta_row(row[0], row[6], exc)

    async def get_meta(self, session_id: str) -> SessionMetaRow | None:
        """One header row with its counts, without reading the turns."""
        return await self._run(self._get_meta_op(session_id), write=False, here=True)

    def _get_meta_op(self, session_id: str) -> Callable[[_Conn], SessionMetaRow | None]:
        _session_id(session_id)

        def op(conn: _Conn) -> SessionMetaRow | None:
            rows = conn.execute(f"{self._META_SELECT} WHERE s.id = ?", (session_id,)).fetchall()
            return None if not rows else self._meta_row(self._resolved(conn, rows)[0])

        return op

    async def list_meta(self, filter: SessionFilter | None = None) -> builtins.list[SessionMetaRow]:
        """Header rows with SQL aggregates, most recently updated first, in one query."""
        where, params, limit = self._where(filter)

        def op(conn: _Conn) -> builtins.list[SessionMetaRow]:
            rows = conn.execute(
                f"{self._META_SELECT}{where} ORDER BY s.updated_at DESC, s.id{limit}", params
            ).fetchall()
            return [self._listed_row(r) for r in self._resolved(conn, rows)]

        return await self._read(op)

    @staticmethod
    def _search_where(search: SessionSearch) -> tuple[str, builtins.list[Any]]:
        """The WHERE clause of ``search`` over ``sessions s``: words through ``session_words``."""
        clauses, params = search_words_sql(query_words(search.text or ""), SQLITE.placeholder)
        header, values = search_header_sql(search, SQLITE.placeholder)
        clauses += header
        params += values
        return (f" WHERE {' AND '.join(clauses)}" if clauses else ""), params

    async def search_meta(self, search: SessionSearch) -> SessionSearchPage:
        """Sessions matching ``search`` (words found in ``session_words``), one page and a
        count.

        The count stops at ``countLimit + 1`` matches, so it costs at most that many rows.
        A search for words first indexes what the background indexer has not yet (appends
        only queue their turns): in short steps, writers going in between, then the rest
        in the search's own transaction, so it sees every stored turn.
        """
        _valid_body(search, SessionSearch, "session search")
        where, params = self._search_where(search)
        order = "s.created_at" if search.order == "created" else "s.updated_at"
        words = bool(query_words(search.text or ""))

        def op(conn: _Conn) -> SessionSearchPage:
            if words:
                index_pending(conn)
            rows = conn.execute(
                f"{self._META_SELECT}{where} ORDER BY {order} DESC, s.id LIMIT ? OFFSET ?",
                [*params, search.limit, search.offset],
            ).fetchall()
            (found,) = conn.execute(
                f"SELECT COUNT(*) FROM (SELECT 1 FROM sessions s{where} LIMIT ?)",
                [*params, search.count_limit + 1],
            ).fetchone()
            return SessionSearchPage(
                rows=tuple(self._listed_row(r) for r in self._resolved(conn, rows)),
                total=min(found, search.count_limit),
                total_exact=found <= search.count_limit,
            )

        if not words:
            return await self._read(op)
        while await self._write(index_step):
            pass
        return await self._write(op)

    def _start_indexer(self) -> trio.CancelScope:
        """Index queued turns and headers in short steps while the store is open, yielding
        the connection to callers waiting for it (``open_sqlite_store`` starts it)."""
        return start_indexer(
            f"sqlite search indexer {self._path}",
            self._index_in_background,
            lambda: self._worker.jobs_waiting > 0,
        )

    _indexed_after: int = -1
    """The transaction count when the queue was last found empty: until this store runs
    another transaction the background indexer does not look again (other processes'
    turns are left to their own indexers and to searches)."""

    async def _index_in_background(self) -> bool:
        """One background step; whether rows are left. Another process holding the write
        lock makes it skip (no wait, no busy retry: the next step or search does it)."""
        seen = self._transactions
        if seen == self._indexed_after:
            return False
        try:
            more = await self._worker.run(_background_step)
        except sqlite3.OperationalError as exc:
            if _primary_code(exc) in _BUSY_CODES:
                return False
            raise
        if not more:
            self._indexed_after = seen
        return more

    # -- header writes ---------------------------------------------------------------

    def _op_save_meta(
        self,
        conn: _Conn,
        data: model.SessionData,
        options: SaveMetaOptions | None = None,
        *,
        expected_rev: int | None = None,
    ) -> Revision:
        data = _valid_header(data)
        return self._versioned(
            conn, data.id, expected_rev, lambda: self._save_meta_checked(conn, data, options)
        )

    def _save_meta_checked(
        self, conn: _Conn, data: model.SessionData, options: SaveMetaOptions | None
    ) -> None:
        runs = [(data.id, run.id, _run_body(run)) for run in data.runs]  # each checked once
        keys = None
        if options is not None:
            keys = model.decode(
                _valid_body(options, SaveMetaOptions, "save_meta options"), SaveMetaOptions
            ).meta_keys
        stored = conn.execute("SELECT metadata FROM sessions WHERE id = ?", (data.id,)).fetchone()
        metadata = model.merge_session_metadata(
            None if stored is None else _decode_metadata(stored[0], data.id), data.metadata, keys
        )
        self._write_header(conn, data, metadata)
        conn.executemany(_UPSERT_RUN, runs)

    def _op_patch_meta(
        self, conn: _Conn, session_id: str, patch: Mapping[str, model.JsonValue]
    ) -> Revision:
        return self._versioned(
            conn, session_id, None, lambda: self._patch_meta_checked(conn, session_id, patch)
        )

    def _patch_meta_checked(
        self, conn: _Conn, session_id: str, patch: Mapping[str, model.JsonValue]
    ) -> None:
        _session_id(session_id)
        if not isinstance(patch, Mapping):
            raise ValidationError(f"metadata patch must be a mapping, got {type(patch).__name__}")
        _metadata_json(patch)
        stored = conn.execute(
            "SELECT metadata FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        if stored is None:
            return
        merged = model.patch_metadata(_decode_metadata(stored[0], session_id), patch)
        conn.execute(
            "UPDATE sessions SET metadata = ?, rev = rev + 1 WHERE id = ?",
            (_metadata_json(merged), session_id),
        )

    # -- history edits -------------------------------------------------------------------

    def _mutate(
        self,
        session_id: str,
        edit: Callable[
            [tuple[SessionTurn, ...], tuple[model.SessionRun, ...]], SessionHistory | None
        ],
        expected_rev: int | None,
    ) -> Callable[[_Conn], tuple[MutateResult, Revision]]:
        def op(conn: _Conn) -> tuple[MutateResult, Revision]:
            before = self._rev(conn, session_id)
            if expected_rev is not None and before != expected_rev:
                raise stale(session_id, expected_rev, before)
            result = edit_stored(conn)
            return result, Revision(before, self._rev(conn, session_id))

        def edit_stored(conn: _Conn) -> MutateResult:
            if self._header(conn, session_id) is None:
                return "no-session"
            rows = self._turn_rows(conn, session_id)
            turns = _decode_turns(session_id, rows)
            runs = self._runs(conn, session_id)
            result = edit(turns, runs)
            if result is None:
                return "unchanged"
            if result.turns is not turns:
                new_rows = turn_rows(result.turns, "$.turns")
                self._rewrite_turns(conn, session_id, rows, new_rows)
            if result.runs is not runs and result.runs != runs:
                self._replace_runs(conn, session_id, result.runs)
            self._bump(conn, session_id, updated_at=_now())
            return "ok"

        return op

    async def _edit_history(
        self, session_id: str, mutate: HistoryMutation, runs_too: bool, expected_rev: int | None
    ) -> tuple[MutateResult, Revision]:
        # Runs are rewritten only when the edit answers others than it was given, which
        # the turns-only form never does: ``runs_too`` needs no check here.
        def edit(
            turns: tuple[SessionTurn, ...], runs: tuple[model.SessionRun, ...]
        ) -> SessionHistory | None:
            return mutate(SessionHistory(turns=turns, runs=runs))

        return await self._write(self._mutate(session_id, edit, expected_rev))


def _background_step(conn: _Conn) -> bool:
    """:func:`index_step` in a write transaction of its own, when turns are queued and the
    write lock is free at once; whether rows are left.

    Its commit does not wait for the disk (``synchronous = NORMAL``, WAL): it writes
    only the index and the queue, so a crash can at most undo it whole, leaving its
    turns queued again; the next durable commit flushes it anyway.
    """
    if (
        conn.execute("SELECT 1 FROM search_pending LIMIT 1").fetchone() is None
        and conn.execute("SELECT 1 FROM search_stale LIMIT 1").fetchone() is None
    ):
        return False
    (timeout,) = conn.execute("PRAGMA busy_timeout").fetchone()
    (synchronous,) = conn.execute("PRAGMA synchronous").fetchone()
    conn.execute(f"PRAGMA synchronous = {min(int(synchronous), 1)}")

    def begin_at_once(conn: _Conn) -> None:
        conn.execute("PRAGMA busy_timeout = 0")
        try:
            conn.execute("BEGIN IMMEDIATE")
        finally:
            conn.execute(f"PRAGMA busy_timeout = {int(timeout)}")

    try:
        return _transaction(conn, index_step, begin_at_once)
    finally:
        conn.execute(f"PRAGMA synchronous = {int(synchronous)}")
