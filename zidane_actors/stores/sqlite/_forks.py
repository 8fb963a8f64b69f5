"""The SQLite store's ``fork_session`` and ``list_forks``: a fork shares its source's rows."""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from ... import model
from ...errors import ConflictError, InvalidNameError, SessionNotFoundError
from ...model import SessionData, SessionRun, SessionTurn, fork_document, preview
from .._protocol import Revision, stale
from .._validate import checked_int
from ..sql import SQLITE
from ..sql._forks import RowRange, ranges_select
from ._base import SQLiteBase
from ._rows import (
    _Conn,
    _decode_extra,
    _decode_metadata,
    _decode_turns,
    _session_id,
    _valid_header,
)
from ._sharing import FORK_SQL, counts, ranges, set_counts, visible_rows

__all__ = ["SQLiteForks"]


class SQLiteForks(SQLiteBase):
    """``fork_session`` and ``list_forks``: a fork is a header, its runs and one link row."""

    def _op_fork_session(
        self,
        conn: _Conn,
        source_id: str,
        new_id: str,
        *,
        at: str | None,
        created_at: int,
        expected_rev: int | None = None,
    ) -> Revision:
        _session_id(source_id)
        head = self._header(conn, source_id)
        if head is None:
            raise SessionNotFoundError(
                f"cannot fork: SQLite store {self._path} has no session {preview(source_id)}"
            )
        rev = int(head[8])
        if expected_rev is not None and rev != expected_rev:
            raise stale(source_id, expected_rev, rev)
        checked_int(created_at, "createdAt")
        try:
            model.validate_id(new_id)
        except InvalidNameError as exc:
            raise InvalidNameError(str(exc), path="$.id") from None
        shared = ranges(conn, source_id)
        count, users, first_user = counts(conn, source_id)
        bound = count if at is None else self._turn_seq(conn, shared, at) + 1
        if self._rev(conn, new_id):
            raise ConflictError(f"cannot fork into {preview(new_id)}: that session exists")
        tail = _decode_turns(source_id, visible_rows(conn, source_id, bound, within=shared))
        last = visible_rows(conn, source_id, bound - 1, 1, within=shared) if bound else []
        source = SessionData(
            id=source_id,
            created_at=head[4],
            updated_at=head[5],
            status=head[2],
            metadata=_decode_metadata(head[3], source_id),
            turns=_decode_turns(source_id, last),
            runs=(),
            agent_id=head[0],
            project_root=head[1],
            extra_fields=_decode_extra(head[9], source_id),
        )
        fork = _valid_header(fork_document(source, new_id=new_id, at=None, created_at=created_at))
        self._write_header(conn, fork, fork.metadata)
        set_counts(
            conn,
            new_id,
            (
                bound,
                users - sum(t.role == "user" for t in tail),
                first_user if first_user is not None and first_user < bound else None,
            ),
        )
        runs = self._runs(conn, source_id)
        if tail:
            runs = self._kept_runs(conn, shared, bound, runs, tail)
        self._replace_runs(conn, new_id, runs)
        if bound:
            conn.execute(FORK_SQL.link, (new_id, source_id, bound))
            conn.execute("INSERT INTO search_stale (session_id) VALUES (?)", (new_id,))
        return Revision(0, self._rev(conn, new_id))

    @staticmethod
    def _turn_seq(conn: _Conn, shared: Sequence[RowRange], at: object) -> int:
        """The seq of the turn ``at`` names among the rows ``shared``."""
        if isinstance(at, str):
            sql, params = ranges_select(shared, "seq", SQLITE, where="id = ?", values=(at,))
            row = conn.execute(sql, params).fetchone()
            if row is not None:
                return int(row[0])
        model.turn_index((), at)  # type: ignore[arg-type]  # raises the rule's error
        raise AssertionError("unreachable")

    @staticmethod
    def _kept_runs(
        conn: _Conn,
        shared: Sequence[RowRange],
        bound: int,
        runs: tuple[SessionRun, ...],
        tail: Sequence[SessionTurn],
    ) -> tuple[SessionRun, ...]:
        """``runs`` without those only the ``tail`` (the turns past ``bound``) belongs to:
        :func:`~zidane_actors.model.fork_document`'s rule, reading the kept turns only
        where their JSON names such a run."""
        held = {run.id for run in runs}
        left = {t.run_id for t in tail if t.run_id in held}
        kept = [c for r in shared if (c := r.within(0, bound))]
        for run_id in sorted(left, key=str):
            needle = b'"runId":' + model.encode(run_id)
            sql, params = ranges_select(
                kept, "seq, id, role, body", SQLITE, where="instr(body, ?) > 0", values=(needle,)
            )
            rows = conn.execute(sql, params).fetchall()
            if any(t.run_id == run_id for t in _decode_turns("", rows)):
                left.discard(run_id)
        return tuple(run for run in runs if run.id not in left)

    async def fork_session(
        self,
        source_id: str,
        new_id: str,
        *,
        at: str | None,
        created_at: int,
        expected_rev: int | None = None,
    ) -> Revision | None:
        """Create ``new_id`` as :func:`~zidane_actors.model.fork_document` of ``source_id``,
        in one transaction whose cost does not grow with the history: the fork shares the
        source's rows (see :mod:`..sql._forks`)."""
        return await self._write(
            lambda conn: self._op_fork_session(
                conn, source_id, new_id, at=at, created_at=created_at, expected_rev=expected_rev
            )
        )

    async def list_forks(self, source_id: str) -> builtins.list[str]:
        """The ids of the sessions whose ``forkedFrom`` names ``source_id``, sorted."""
        _session_id(source_id)

        def op(conn: _Conn) -> builtins.list[str]:
            rows = conn.execute(
                "SELECT id, metadata FROM sessions WHERE json_valid(metadata)"
                " AND json_extract(metadata, '$.forkedFrom.sessionId') = ?",
                (source_id,),
            ).fetchall()
            found = []
            for sid, metadata in rows:
                origin = model.forked_from(_decode_metadata(metadata, sid))
                if origin is not None and origin.session_id == source_id:
                    found.append(sid)
            return sorted(found)

        return await self._read(op)
