"""The SQLite store's ``fork_session`` and ``list_forks``: a fork shares its source's rows."""

from __future__ import annotations

import builtins

from ... import model
from ...errors import ConflictError, SessionNotFoundError
from ...model import SessionData, preview
from .._protocol import Revision, stale
from ..sql import SQLITE
from ..sql._forks import dropped_runs, forks_candidates, forks_named, link_fork, plan_fork
from ._base import SQLiteBase
from ._rows import _Conn, _decode_metadata, _decode_turns, _session_id, _valid_header

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
        model.check_fork_id(new_id)
        head = self._header(conn, source_id)
        if head is None:
            raise SessionNotFoundError(
                f"cannot fork: SQLite store {self._path} has no session {preview(source_id)}"
            )
        rev = int(head[8])
        if expected_rev is not None and rev != expected_rev:
            raise stale(source_id, expected_rev, rev)
        count, users, first_user = conn.execute(
            "SELECT turn_count, user_turn_count, first_user_seq FROM sessions WHERE id = ?",
            (source_id,),
        ).fetchone()
        plan = plan_fork(conn, SQLITE, source_id, count, at, created_at, _decode_turns)
        if self._rev(conn, new_id):
            raise ConflictError(f"cannot fork into {preview(new_id)}: that session exists")
        source = SessionData(
            id=source_id,
            created_at=head[4],
            updated_at=head[5],
            status=head[2],
            metadata=_decode_metadata(head[3], source_id),
            turns=(),
            runs=(),
            agent_id=head[0],
            project_root=head[1],
        )
        fork = _valid_header(plan.header(source, new_id, created_at))
        self._write_header(conn, fork, fork.metadata)
        conn.execute(
            "UPDATE sessions SET turn_count = ?, user_turn_count = ?, first_user_seq = ?"
            " WHERE id = ?",
            (
                plan.bound,
                users - plan.users_left,
                first_user if first_user is not None and first_user < plan.bound else None,
                new_id,
            ),
        )
        # The runs it keeps are copied as stored, in their order (none decoded).
        ids = [r[0] for r in conn.execute("SELECT id FROM runs WHERE session_id = ?", (source_id,))]
        dropped = sorted(dropped_runs(conn, SQLITE, plan, ids))
        conn.execute(
            "INSERT INTO runs (session_id, id, position, body) SELECT ?, id,"
            " row_number() OVER (ORDER BY position) - 1, body FROM runs WHERE session_id = ?"
            f" AND id NOT IN ({', '.join('?' * len(dropped))})",
            (new_id, source_id, *dropped),
        )
        link_fork(conn, SQLITE, plan, source_id, new_id)
        return Revision(0, self._rev(conn, new_id))

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
            rows = conn.execute(forks_candidates(SQLITE), (source_id,)).fetchall()
            return forks_named(source_id, ((s, _decode_metadata(m, s)) for s, m in rows))

        return await self._read(op)
