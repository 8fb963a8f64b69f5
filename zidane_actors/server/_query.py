"""A request's query parameters, lone surrogates kept.

A value may hold a lone surrogate (a stored agent id, a filter a client
sends): it travels as its UTF-8 bytes (``surrogatepass``), which the usual
decoding would turn into U+FFFD, so a filter would match something else.
Bytes that are not UTF-8 at all read as U+FFFD, as they always did.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.requests import Request

__all__ = ["query_params"]


def query_params(request: Request) -> dict[str, str]:
    """The query's parameters by name (the last of a repeated one)."""
    cached = request.scope.get("zidane.query")
    if cached is None:
        raw = request.scope.get("query_string", b"").decode("latin-1")
        pairs = parse_qsl(raw, keep_blank_values=True, encoding="latin-1")
        cached = request.scope["zidane.query"] = {_text(k): _text(v) for k, v in pairs}
    return cached


def _text(latin: str) -> str:
    """A parameter's bytes (read as latin-1) as text: UTF-8, lone surrogates included."""
    data = latin.encode("latin-1")
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace")
