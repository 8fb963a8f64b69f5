"""The PostgreSQL store's codecs, error mapping and the constants its modules share."""

from __future__ import annotations

import itertools
import logging
import re
import struct
from typing import Any, Final, TypeAlias, TypeVar

import msgspec
import psycopg
from msgspec import UNSET
from psycopg import errors as pg_errors
from psycopg.adapt import Dumper
from psycopg.pq import Format

from ...errors import (
    ConflictError,
    StoreError,
    StoreUnavailableError,
    ValidationError,
    ZidaneActorsError,
)
from ...model import (
    ExtraFields,
    SessionData,
    encode_str,
    preview,
)
from .._validate import (
    checked,
    checked_header,
)
from ..sql import POSTGRES, SharedSQL, decode_row

__all__ = []


T = TypeVar("T")
_Cursor: TypeAlias = psycopg.Cursor[tuple[Any, ...]]
_Connection: TypeAlias = psycopg.Connection[tuple[Any, ...]]


class TextArray(list[str]):
    """A list of ``str`` sent as a binary ``text[]`` in one pass: psycopg's own list
    dumper looks at the elements to choose their type, a cost on every hot write."""


class BigintArray(list[int]):
    """A list of ``int`` sent as a binary ``bigint[]`` in one pass (as :class:`TextArray`)."""


_ARRAY_HEAD: Final = struct.Struct("!iiIii")  # one dimension, no NULLs, element oid, size, 1
_EMPTY_HEAD: Final = struct.Struct("!iiI")  # no dimension, no NULLs, element oid
_LENGTH: Final = struct.Struct("!i").pack


class _ArrayDumper(Dumper):
    """A one-dimension array without NULLs in PostgreSQL's binary form: its head, then
    each element as its length and its bytes (:meth:`_elements`)."""

    format = Format.BINARY
    element_oid: int

    def dump(self, obj: list[Any]) -> bytes:
        if not obj:
            return _EMPTY_HEAD.pack(0, 0, self.element_oid)
        return _ARRAY_HEAD.pack(1, 0, self.element_oid, len(obj), 1) + self._elements(obj)

    def _elements(self, obj: list[Any]) -> bytes:
        raise NotImplementedError


class _TextArrayDumper(_ArrayDumper):
    oid = 1009  # text[]
    element_oid = 25

    def _elements(self, obj: list[Any]) -> bytes:
        parts = []
        for text in obj:
            data = text.encode()
            parts.append(_LENGTH(len(data)))
            parts.append(data)
        return b"".join(parts)


class _BigintArrayDumper(_ArrayDumper):
    oid = 1016  # bigint[]
    element_oid = 20

    def _elements(self, obj: list[Any]) -> bytes:
        sized = itertools.chain.from_iterable((8, n) for n in obj)
        try:
            return struct.pack(f"!{'iq' * len(obj)}", *sized)
        except struct.error as exc:
            raise psycopg.DataError(f"not a bigint: {exc}") from None


psycopg.adapters.register_dumper(TextArray, _TextArrayDumper)
psycopg.adapters.register_dumper(BigintArray, _BigintArrayDumper)

_SQL: Final = SharedSQL(POSTGRES)
_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_TRANSIENT: Final = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected)
_BACKOFF_S: Final = 0.05
_SERVER_GONE: Final = frozenset({"57P01", "57P02", "57P03"})
"""SQLSTATEs of a server session ended by the server: admin shutdown (``pg_terminate_backend``,
a fast stop), crash shutdown, and a server still starting."""
_log = logging.getLogger("zidane_actors.stores.postgres")


class _SlowPath(Exception):
    """A write of a savepoint-free batch failed: roll back and rerun with savepoints."""


def _json(value: object, what: str) -> str:
    try:
        return encode_str(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValidationError(f"{what} is not JSON-encodable: {exc}") from None


def _extra(text: str, session_id: str) -> ExtraFields:
    return ExtraFields(
        _decode(text, dict[str, Any], "sessions", f"{preview(session_id)} column extra")
    )


def _checked_data(data: object) -> SessionData:
    """``data`` validated; metadata keys mapped to ``UNSET`` are dropped (absent = removed)."""
    checked_header(data)
    assert isinstance(data, SessionData)
    metadata = {k: v for k, v in data.metadata.items() if v is not UNSET}
    return checked(msgspec.structs.replace(data, metadata=metadata), SessionData, "session data")


def _decode(text: str | None, type_: Any, table: str, key: str) -> Any:
    """A JSON column's value as ``type_`` (any type expression): the shared row codec."""
    return decode_row(text, type_, table, key)


def _map_error(exc: BaseException) -> BaseException:
    """A psycopg failure as the matching :mod:`zidane_actors.errors` exception."""
    if isinstance(exc, ZidaneActorsError) or not isinstance(exc, psycopg.Error):
        return exc
    diag = exc.diag.message_primary or str(exc)
    if isinstance(exc, psycopg.IntegrityError):
        mapped: ZidaneActorsError = ConflictError(f"PostgreSQL refused the write: {diag}")
    elif isinstance(exc, psycopg.DataError):
        mapped = ValidationError(f"PostgreSQL refused a value: {diag}")
    elif isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        mapped = StoreUnavailableError(f"PostgreSQL is unavailable: {diag}")
    else:
        mapped = StoreError(f"PostgreSQL error: {diag}")
    mapped.__cause__ = exc
    return mapped


# Schema v8: the turns a session sees, forks' shared rows included (``..sql._forks``).
def _own(session: str) -> str:
    return f"(SELECT seq, id, role, body FROM turns WHERE session_id = {session})"


def _shared(session: str) -> str:
    return (
        f"(SELECT t.seq, t.id, t.role, t.body FROM fork_ranges({session}) r"
        " JOIN turns t ON t.session_id = r.session_id AND t.seq >= r.lo"
        " AND (r.hi IS NULL OR t.seq < r.hi))"
    )


def seen_scalar(session: str, query: str) -> str:
    """SQL: the scalar subquery ``query`` (its ``{turns}`` a derived table ``(seq, id, role,
    body)``) over the turns ``session`` sees. A session sharing nothing runs it over its
    own rows (the query planned as before, its indexes used); a fork over ``fork_ranges``."""
    return (
        f"(CASE WHEN EXISTS (SELECT FROM forks WHERE session_id = {session})"
        f" THEN ({query.format(turns=_shared(session))})"
        f" ELSE ({query.format(turns=_own(session))}) END)"
    )


def visible_turns(session: str) -> str:
    """SQL: a derived table ``(seq, id, role, body)`` of the turns the session ``session``
    (an SQL expression: a column or a named parameter) sees, in one statement's snapshot.

    A session sharing nothing reads its own rows (the ``fork_ranges`` branch is skipped
    by a one-time test of its ``forks`` row)."""
    fork = f"EXISTS (SELECT FROM forks WHERE session_id = {session})"
    return (
        f"(SELECT * FROM {_own(session)} o WHERE NOT {fork}"
        f" UNION ALL SELECT * FROM {_shared(session)} f WHERE {fork})"
    )
