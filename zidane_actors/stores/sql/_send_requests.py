"""Send-request records (find, list, settle, put), written once for both SQL stores.

Claiming stays each store's own: SQLite claims under its database lock,
PostgreSQL with an insert that detects the race.
"""

from __future__ import annotations

import builtins
import functools
from typing import Any, Final, TypeVar

from msgspec import UNSET

from ...errors import ValidationError
from ...model import (
    JsonValue,
    SendRequestRecord,
    check_json,
    preview,
    send_request_evictions,
    validate_id,
    validate_request_id,
)
from .._validate import checked
from ._codec import decode_row
from ._dialect import Dialect
from ._hooks import SQLHooks

__all__ = ["SQLSendRequests", "send_record", "settle_send_request"]

T = TypeVar("T")

_COLUMNS: Final = "request_id, fingerprint, created_at, result"


class _Statements:
    def __init__(self, d: Dialect) -> None:
        sql = d.sql
        self.find = sql(
            f"SELECT {_COLUMNS} FROM send_requests WHERE session_id = ? AND request_id = ?"
        )
        self.list = sql(
            f"SELECT {_COLUMNS} FROM send_requests"
            " WHERE session_id = ? ORDER BY created_at, request_id"
        )
        self.held = (
            sql(
                "SELECT request_id, fingerprint, created_at FROM send_requests WHERE session_id = ?"
            )
            + d.claim_order
        )
        self.put = sql(
            "INSERT INTO send_requests (session_id, request_id, fingerprint, created_at, result)"
            " VALUES (?, ?, ?, ?, ?)"
        )
        self.settle = sql(
            "UPDATE send_requests SET result = ? WHERE session_id = ? AND request_id = ?"
        )
        self.delete = sql("DELETE FROM send_requests WHERE session_id = ? AND request_id = ?")


_statements: Final = functools.cache(_Statements)
"""The statements in a dialect, rendered once."""


def send_record(row: tuple[Any, ...], session_id: str) -> SendRequestRecord:
    """A ``send_requests`` row (``request_id, fingerprint, created_at, result``) as a record."""
    request_id, fingerprint, created_at, result = row
    value: Any = UNSET
    if result is not None:
        key = f"(session_id={preview(session_id)}, request_id={preview(request_id)})"
        value = decode_row(result, Any, "send_requests", key)
    return SendRequestRecord(
        request_id=request_id, fingerprint=fingerprint, created_at=created_at, result=value
    )


def settle_send_request(
    d: Dialect, db: Any, session_id: str, request_id: str, result: JsonValue
) -> None:
    """Store a claimed send's result; ``None`` drops the claim; unknown ids are a no-op."""
    validate_id(session_id)
    validate_request_id(request_id, what="send request id")
    check_json(result, what="send result")
    sql = _statements(d)
    if result is None:
        db.execute(sql.delete, (session_id, request_id))
    else:
        try:
            body = d.encode(result)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValidationError(f"send result is not JSON-serializable: {exc}") from None
        db.execute(sql.settle, (body, session_id, request_id))


class SQLSendRequests(SQLHooks):
    """The send-request methods of a SQL store but its claim (see :class:`SQLSchedules`)."""

    __slots__ = ()

    def _sql_held_for_send(self, db: Any, session_id: str) -> None:
        """Refuse a send request of a session the store does not hold."""
        raise NotImplementedError

    async def find_send_request(self, session_id: str, request_id: str) -> SendRequestRecord | None:
        """The record holding ``request_id``, without claiming it."""
        validate_id(session_id)
        validate_request_id(request_id, what="send request id")
        sql = _statements(self._dialect).find

        def op(db: Any) -> SendRequestRecord | None:
            row = db.execute(sql, (session_id, request_id)).fetchone()
            return None if row is None else send_record(row, session_id)

        return await self._sql_read(op)

    async def settle_send_request(
        self, session_id: str, request_id: str, result: JsonValue
    ) -> None:
        """Store the send's result; ``None`` drops the claim; unknown ids are a no-op."""
        d = self._dialect
        await self._sql_write(lambda db: settle_send_request(d, db, session_id, request_id, result))

    async def list_send_requests(self, session_id: str) -> builtins.list[SendRequestRecord]:
        """Every request id the session holds, oldest claim first (for copies and exports)."""
        validate_id(session_id)
        sql = _statements(self._dialect).list

        def op(db: Any) -> builtins.list[SendRequestRecord]:
            return [send_record(row, session_id) for row in db.execute(sql, (session_id,))]

        return await self._sql_read(op)

    async def put_send_request(self, session_id: str, record: SendRequestRecord) -> None:
        """Store ``record`` exactly as given (a copy or an import), replacing its id's record."""
        validate_id(session_id)
        record = checked(record, SendRequestRecord, "send request")
        validate_request_id(record.request_id, what="send request id")
        result = None if record.result is UNSET else self._dialect.encode(record.result)
        sql = _statements(self._dialect)

        def op(db: Any) -> None:
            self._sql_held_for_send(db, session_id)
            db.execute(sql.delete, (session_id, record.request_id))
            held = [
                SendRequestRecord(request_id=row[0], fingerprint=row[1], created_at=row[2])
                for row in db.execute(sql.held, (session_id,))
            ]
            for request_id in send_request_evictions(held):
                db.execute(sql.delete, (session_id, request_id))
            db.execute(
                sql.put,
                (session_id, record.request_id, record.fingerprint, record.created_at, result),
            )

        await self._sql_write(op, idempotent=False)
