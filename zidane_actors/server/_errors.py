"""The API's error answers: ``{"error": {"code", "message", "path"}}`` with an HTTP status."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.responses import Response

from ..model import encode
from ..stores.remote._bodies import ErrorBody, ErrorDetail

__all__ = ["ApiError", "error_response"]


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
        return error_response(self.status, self.code, self.message, self.path, self.headers)


def error_response(
    status: int,
    code: str,
    message: str,
    path: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """A JSON error answer."""
    body = ErrorBody(error=ErrorDetail(code=code, message=message, path=path))
    return Response(
        encode(body), status_code=status, media_type="application/json", headers=headers
    )
