"""The PostgreSQL store: claims, send requests, meta and search, artifacts, schedules."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any, Final, Literal

import attrs
import trio

from ...model import SEND_REQUEST_HISTORY as _SEND_REQUEST_HISTORY
from ...model import (
    ArtifactFilter,
    SendRequestClaim,
    SendRequestRecord,
    SessionArtifact,
    SessionFilter,
    SessionMetaRow,
    SessionSearch,
    SessionSearchPage,
    SessionTurn,
    filter_artifacts,
    query_words,
    send_request_evictions,
    validate_id,
)
from ...model._compaction import model_view
from .._edits import TurnsEdits
from .._indexer import start_indexer
from .._protocol import (
    HistoryMutation,
    MutateResult,
    Revision,
)
from .._validate import (
    check_artifact_filter_ids,
    check_send_claim,
    checked,
    now_ms,
)
from ..sql import (
    POSTGRES,
    SQLClaims,
    SQLSchedules,
    SQLSendRequests,
    SQLWrites,
    equal_sql,
    send_record,
)
from ..sql._forks import fork_sql
from ._base import PostgresBase
from ._forks import PostgresForks
from ._reads import (
    _META_SELECT,
    _gen_uuid,
    _listed_row,
    _meta_row,
    _model_view,
    _mutate,
    _search_where,
    _session_where,
)
from ._rows import (
    T,
    _Cursor,
)
from ._schema import index_pending, index_step
from ._writes import (
    _artifact_row,
    _held_for_send,
    _versioned,
)

__all__ = ["PostgresStore"]

_VIEW_ATTEMPTS: Final = 4
"""Reads of the model's view one ``load_model_view`` makes before loading the session whole."""


@attrs.define(eq=False)
class PostgresStore(PostgresForks, SQLSchedules, SQLSendRequests, TurnsEdits, SQLWrites, SQLClaims):
    """A :class:`~zidane_actors.stores.FullSessionStore` and ``BatchingStore`` on PostgreSQL.

    Build it with :func:`open_postgres_store`. Beyond the protocol it offers
    :meth:`run_epoch`, the fencing token every successful :meth:`claim_run`
    increments.
    """

    def _sql_held_for_send(self, db: Any, session_id: str) -> None:
        _held_for_send(db, session_id)

    async def claim_send_request(
        self, session_id: str, request_id: str, fingerprint: str
    ) -> SendRequestClaim:
        """Insert the request id or answer the record holding it; keeps the newest ids only.

        The session must exist (:class:`SessionNotFoundError`).
        """
        check_send_claim(session_id, request_id, fingerprint)

        def op(cur: _Cursor) -> SendRequestClaim:
            _held_for_send(cur, session_id)
            cur.execute(
                "INSERT INTO send_requests (session_id, request_id, fingerprint, created_at)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING seq",
                (session_id, request_id, fingerprint, now_ms()),
            )
            inserted = cur.fetchone()
            if inserted is None:
                cur.execute(
                    "SELECT request_id, fingerprint, created_at, result FROM send_requests"
                    " WHERE session_id = %s AND request_id = %s",
                    (session_id, request_id),
                )
                row = cur.fetchone()
                assert row is not None
                return SendRequestClaim(claimed=False, record=send_record(row, session_id))
            cur.execute("SELECT count(*) FROM send_requests WHERE session_id = %s", (session_id,))
            count = cur.fetchone()
            if count is not None and count[0] > _SEND_REQUEST_HISTORY:
                cur.execute(
                    "SELECT request_id, fingerprint, created_at FROM send_requests"
                    " WHERE session_id = %s AND seq <> %s ORDER BY seq",
                    (session_id, inserted[0]),
                )
                others = [
                    SendRequestRecord(request_id=r[0], fingerprint=r[1], created_at=r[2])
                    for r in cur.fetchall()
                ]
                cur.execute(
                    "DELETE FROM send_requests WHERE session_id = %s AND request_id = ANY(%s)",
                    (session_id, send_request_evictions(others)),
                )
            return SendRequestClaim(claimed=True)

        return await self._write(op, idempotent=False)

    async def generate_session_id(self) -> str:
        """A UUID from the server's ``gen_random_uuid()``."""
        return await self._read(_gen_uuid)

    async def generate_turn_id(self) -> str:
        """A UUID from the server's ``gen_random_uuid()``."""
        return await self._read(_gen_uuid)

    async def get_meta(self, session_id: str) -> SessionMetaRow | None:
        """One session's summary row, answered from the header and indexes."""
        validate_id(session_id)

        def op(cur: _Cursor) -> SessionMetaRow | None:
            cur.execute(_META_SELECT + " WHERE s.id = %s", (session_id,))
            row = cur.fetchone()
            return None if row is None else _meta_row(row)

        return await self._read(op)

    async def load_model_view(self, session_id: str) -> builtins.list[SessionTurn] | None:
        """``model_view`` of the stored turns, reading none a compaction summarized; ``None``
        when absent. Two indexed statements (``_reads._model_view``), read again while a
        write moves the session between them, then loaded whole in one statement."""
        validate_id(session_id)

        def op(cur: _Cursor) -> builtins.list[SessionTurn] | Literal[False] | None:
            cur.execute(fork_sql(POSTGRES).link_of, (session_id,))
            if cur.fetchone() is not None:  # a fork: its turns span the rows it shares
                return False
            for _ in range(_VIEW_ATTEMPTS):
                view = _model_view(cur, session_id)
                if view is not False:
                    return view
            return False

        view = await self._read(op)
        if view is not False:
            return view
        data = await self.load(session_id)
        return None if data is None else builtins.list(model_view(data.turns))

    async def list_meta(self, filter: SessionFilter | None = None) -> builtins.list[SessionMetaRow]:
        """Session summaries, most recently updated first, in one query."""
        tail, params = _session_where(filter)

        def op(cur: _Cursor) -> builtins.list[SessionMetaRow]:
            cur.execute(_META_SELECT + tail, params)
            return [_listed_row(row) for row in cur.fetchall()]

        return await self._read(op)

    async def search_meta(self, search: SessionSearch) -> SessionSearchPage:
        """Sessions matching ``search`` (words found in ``session_words``), a page and a count.

        The count stops at ``countLimit + 1`` matches, so it costs at most that many rows.
        A search for words first computes the words the background indexer has not yet
        (writes leave them to it), in short steps, so it finds every turn stored before it
        began, but for one being rewritten or deleted at that very moment.
        """
        search = checked(search, SessionSearch, "session search")
        where, params = _search_where(search)
        order = "s.created_at" if search.order == "created" else "s.updated_at"
        words = bool(query_words(search.text or ""))

        def op(cur: _Cursor) -> SessionSearchPage:
            # The page's ids first, so the per-row subqueries run for its rows only.
            cur.execute(
                f"{_META_SELECT} WHERE s.id IN (SELECT s.id FROM sessions s{where}"
                f' ORDER BY {order} DESC, s.id COLLATE "C" LIMIT %s OFFSET %s)'
                f' ORDER BY {order} DESC, s.id COLLATE "C"',
                [*params, search.limit, search.offset],
            )
            rows = tuple(_listed_row(row) for row in cur.fetchall())
            cur.execute(
                f"SELECT count(*) FROM (SELECT 1 FROM sessions s{where} LIMIT %s) m",
                [*params, search.count_limit + 1],
            )
            counted = cur.fetchone()
            found = int(counted[0]) if counted is not None else 0
            return SessionSearchPage(
                rows=rows,
                total=min(found, search.count_limit),
                total_exact=found <= search.count_limit,
            )

        if words:
            while await self._write(index_step):
                pass
            await self._write(index_pending)
        return await self._read(op)

    _indexed_after: int = -1
    """``_writes`` when the background indexer last found nothing to fill: it does not
    look again until this store writes (other hosts' turns are left to their own
    indexers and to searches)."""

    async def _write(
        self,
        op: Callable[[_Cursor], T],
        *,
        idempotent: bool = True,
        pipelined: bool = False,
    ) -> T:
        self._writes += 1
        return await super()._write(op, idempotent=idempotent, pipelined=pipelined)

    async def _batch(self, op: Callable[[_Cursor], T]) -> T:
        self._writes += 1
        return await super()._batch(op)

    def _start_indexer(self) -> trio.CancelScope:
        """Fill the words of new turns and headers in short steps while the store is open
        (``open_postgres_store`` starts it), yielding while callers use a connection (a
        pooled one, or the batch connection): the words are computed in Python, beside
        the callers."""
        return start_indexer(
            f"postgres search indexer {self._schema}",
            self._index_in_background,
            lambda: self._idle.in_use > 0 or self._writer.limiter.borrowed_tokens > 0,
        )

    async def _index_in_background(self) -> bool:
        """One background step; whether rows may be left."""
        seen = self._writes
        if seen == self._indexed_after:
            return False
        more = await PostgresBase._write(self, index_step)
        if not more:
            self._indexed_after = seen
        return more

    async def _edit_history(
        self, session_id: str, mutate: HistoryMutation, runs_too: bool, expected_rev: int | None
    ) -> tuple[MutateResult, Revision]:
        result: list[MutateResult] = []

        def op(cur: _Cursor) -> Revision:
            result[:] = [_mutate(cur, session_id, mutate, runs_too=runs_too)]
            return Revision(0, 0)

        revision = await self._write(
            lambda cur: _versioned(cur, session_id, expected_rev, lambda: op(cur)),
            idempotent=False,
        )
        return result[0], revision

    async def list_artifacts(
        self, filter: ArtifactFilter | None = None
    ) -> builtins.list[SessionArtifact]:
        """Artifacts, newest first, filtered in SQL and ordered like ``filter_artifacts``."""
        clauses: builtins.list[str] = []
        params: builtins.list[Any] = []
        if filter is not None:
            filter = checked(filter, ArtifactFilter, "artifact filter")
            check_artifact_filter_ids(filter)
            for column, value in (
                ("session_id", filter.session_id),
                ("kind", filter.kind),
                ("uri", filter.uri),
            ):
                equal_sql(clauses, params, column, value, POSTGRES.placeholder)
            if filter.since is not None:
                clauses.append("updated_at >= %s")
                params.append(filter.since)
            if filter.project_root is None:
                clauses.append("project_root IS NULL")
            else:
                equal_sql(
                    clauses, params, "project_root", filter.project_root, POSTGRES.placeholder
                )
        query = "SELECT body, session_id, id FROM artifacts"
        if clauses:
            query += " WHERE " + " AND ".join(clauses)
        query += ' ORDER BY updated_at DESC, id COLLATE "C"'
        if filter is not None and filter.limit is not None:
            query += " LIMIT %s"
            params.append(filter.limit)

        def op(cur: _Cursor) -> builtins.list[SessionArtifact]:
            cur.execute(query, params)
            return filter_artifacts((_artifact_row(row) for row in cur.fetchall()), filter)

        return await self._read(op)
