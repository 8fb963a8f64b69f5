"""Validation of ids and names that reach file paths, URLs and SQL."""

from __future__ import annotations

import re
import uuid

from ..errors import InvalidNameError, ValidationError
from ._preview import preview

__all__ = [
    "ID_MAX_LENGTH",
    "REQUEST_ID_MAX_LENGTH",
    "check_column_text",
    "has_lone_surrogate",
    "is_column_text",
    "new_id",
    "validate_id",
    "validate_request_id",
]

ID_MAX_LENGTH = 200
"""Longest id accepted for sessions, runs, turns, artifacts and schedules."""

_SAFE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@+=-]*")


def validate_id(value: object, *, what: str = "session id") -> str:
    """Return ``value`` if it is a safe id, else raise :class:`InvalidNameError`.

    Safe ids are 1–200 characters of letters, digits and ``_ . : @ + = -``,
    not starting with a dot or a dash: never a path separator, ``..``, or a
    control character, so an id can name a file or a URL segment as is.
    """
    if not isinstance(value, str):
        raise InvalidNameError(f"{what} must be a string, got {type(value).__name__}")
    if not value or len(value) > ID_MAX_LENGTH:
        raise InvalidNameError(f"{what} must be 1-{ID_MAX_LENGTH} characters, got {len(value)}")
    if not _SAFE_ID.fullmatch(value) or ".." in value:
        raise InvalidNameError(f"{what} {preview(value)} has characters outside [A-Za-z0-9_.:@+=-]")
    return value


REQUEST_ID_MAX_LENGTH = 1_000
"""Longest send ``requestId`` accepted."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def validate_request_id(value: object, *, what: str = "request id") -> str:
    """Return ``value`` if it is a send ``requestId`` every store can hold, else raise.

    A request id is the client's idempotency key, never a file name or a
    path: any 1-:data:`REQUEST_ID_MAX_LENGTH` characters (``req#1``,
    ``req 1``, ``a/b``), except NUL and lone surrogates, which a database
    text column cannot hold (:class:`InvalidNameError`).
    """
    if not isinstance(value, str):
        raise InvalidNameError(f"{what} must be a string, got {type(value).__name__}")
    if not value or len(value) > REQUEST_ID_MAX_LENGTH:
        raise InvalidNameError(
            f"{what} must be 1-{REQUEST_ID_MAX_LENGTH} characters, got {len(value)}"
        )
    if not is_column_text(value):
        raise InvalidNameError(f"{what} {preview(value)} holds NUL or a lone surrogate")
    return value


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone UTF-16 surrogate (JSON escapes one; UTF-8 cannot hold it)."""
    return _SURROGATE.search(text) is not None


def is_column_text(value: str) -> bool:
    """Whether a database text column can hold ``value`` (no NUL, no lone surrogate).

    A filter on column text holding either matches no stored session or artifact.
    """
    return "\x00" not in value and not has_lone_surrogate(value)


def check_column_text(value: object, *, what: str, path: str) -> None:
    """Refuse text a database column cannot hold: NUL or a lone surrogate.

    The one rule for the header text every store keeps (``agentId``,
    ``projectRoot``, an artifact's ``kind``/``uri``/``projectRoot``): SQLite
    and PostgreSQL keep such fields in text columns, so no store takes them.
    """
    if isinstance(value, str) and not is_column_text(value):
        raise ValidationError(
            f"{what} {preview(value)} holds NUL or a lone surrogate, which a database text column"
            " cannot hold",
            path=path,
        )


def new_id() -> str:
    """A fresh random id (a UUID4 string)."""
    return str(uuid.uuid4())
