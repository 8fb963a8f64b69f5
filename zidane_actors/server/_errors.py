"""The API's error answers: ``{"error": {"code", "message", "path"}}`` with an HTTP status."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.responses import Response

from ..errors import (
    ConflictError,
    CorruptDataError,
    InvalidNameError,
    SessionNotFoundError,
    StaleSessionError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
    UnsupportedOperationError,
    ValidationError,
)
from ..model import MAX_JSON_DEPTH, encode
from ..stores.remote._bodies import ErrorBody, ErrorDetail

__all__ = ["ApiError", "mapped_error", "worth_a_traceback"]


class ApiError(Exception):
    """An error answer: HTTP status, stable code, message, field path and extra headers."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        path: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.path = path
        self.headers = dict(headers or {})

    def response(self) -> Response:
        """This error as an answer."""
        body = ErrorBody(error=ErrorDetail(code=self.code, message=self.message, path=self.path))
        return Response(
            encode(body),
            status_code=self.status,
            media_type="application/json",
            headers=self.headers,
        )


def mapped_error(exc: BaseException) -> ApiError:
    """The API error for a library exception raised while serving."""
    if isinstance(exc, InvalidNameError):
        return ApiError(400, "invalid_name", str(exc), exc.path)
    if isinstance(exc, ValidationError):
        return ApiError(422, "invalid", str(exc), exc.path)
    if isinstance(exc, OverflowError):  # e.g. an integer past SQLite's 64 bits
        return ApiError(422, "out_of_range", f"a number is out of the store's range: {exc}")
    if isinstance(exc, SessionNotFoundError):
        return ApiError(404, "session_not_found", str(exc))
    if isinstance(exc, StaleSessionError):
        return ApiError(409, "stale_session", str(exc))
    if isinstance(exc, ConflictError):
        return ApiError(409, "conflict", str(exc))
    if isinstance(exc, UnsupportedOperationError):
        return ApiError(501, "unsupported", str(exc))
    if isinstance(exc, (StoreUnavailableError, StoreClosedError)):
        return ApiError(503, "store_unavailable", str(exc))
    if isinstance(exc, CorruptDataError):
        return ApiError(500, "corrupt_data", str(exc))
    if isinstance(exc, RecursionError):  # a stored value nested past what encoders recurse
        return ApiError(
            500,
            "corrupt_data",
            "stored data is nested deeper than JSON can be written back "
            f"(this version writes at most {MAX_JSON_DEPTH} levels)",
        )
    if isinstance(exc, StoreError):
        return ApiError(500, "store_error", str(exc))
    return ApiError(500, "internal", f"internal error: {type(exc).__name__}")


def worth_a_traceback(error: ApiError) -> bool:
    """A 5xx other than ``store_unavailable``: the store reports its own outages (PostgreSQL:
    one line each), and a traceback per request while it is down would flood the log."""
    return error.status >= 500 and error.code != "store_unavailable"
