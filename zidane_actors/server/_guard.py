"""The app-wide request guard: bearer token, or the loopback-only rules without one.

Without a token the server trusts the machine it runs on, so it makes sure a
request really comes from a local program and not from a web page the user
has open: the client address must be loopback, the ``Host`` must name a
loopback address with the port served (a DNS-rebound name is refused), a
present ``Origin`` must be the server's own, and a body must be declared
``application/json`` (the content types a page can send without a CORS
preflight are refused with 415).
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import re
from collections.abc import Mapping
from typing import Final

import attrs
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._errors import ApiError
from ._ui import is_public_ui_path

__all__ = ["Guard", "SecurityHeaders", "is_loopback_host"]

_BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_AUTHORITY: Final = re.compile(
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::(?P<port>[0-9]{1,5}))?"
)
_JSON: Final = "application/json"


# The few distinct Host values and client addresses a server sees are judged once each
# (parsing an address costs more than the rest of the guard); bounded against floods.
@functools.lru_cache(maxsize=1024)
def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 without brackets) is this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


@functools.lru_cache(maxsize=1024)
def _host_allowed(value: str, scheme: str, server_port: int | None) -> bool:
    match = _AUTHORITY.fullmatch(value)
    if match is None:
        return False
    host = match["v6"] or match["name"]
    if not is_loopback_host(host):
        return False
    port = int(match["port"]) if match["port"] else (443 if scheme == "https" else 80)
    return server_port is None or port == server_port


def _is_json(content_type: str) -> bool:
    return content_type.partition(";")[0].strip().lower() == _JSON


@attrs.define(eq=False)
class HttpMiddleware:
    """An ASGI middleware over HTTP requests (:meth:`http`); anything else passes through."""

    app: ASGIApp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one HTTP request through :attr:`app`."""
        raise NotImplementedError


@attrs.define(eq=False)
class Guard(HttpMiddleware):
    """ASGI middleware: bearer-token check, or the loopback-only rules without a token."""

    token: str | None

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers: Mapping[bytes, bytes] = dict(scope["headers"])
        try:
            if self.token is None:
                self._check_local(scope, headers)
            elif not is_public_ui_path(scope["path"]):
                # The browser's page shells and assets hold no data: served without it.
                self._check_token(headers)
        except ApiError as denied:
            await denied.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _check_token(self, headers: Mapping[bytes, bytes]) -> None:
        assert self.token is not None
        scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token.encode()):
            return
        raise ApiError(
            401,
            "unauthorized",
            "missing or wrong bearer token",
            headers={"www-authenticate": 'Bearer realm="zidane-actors"'},
        )

    def _check_local(self, scope: Scope, headers: Mapping[bytes, bytes]) -> None:
        client = scope.get("client")
        if client is None or not is_loopback_host(client[0]):
            raise ApiError(
                403, "forbidden", "without a token the server accepts loopback clients only"
            )
        scheme: str = scope.get("scheme", "http")
        server = scope.get("server")
        host = headers.get(b"host", b"").decode("latin-1")
        if not _host_allowed(host, scheme, server[1] if server else None):
            raise ApiError(
                403,
                "forbidden_host",
                f"without a token the Host must be a loopback address with the port served, "
                f"got {host[:100]!r}",
            )
        origin = headers.get(b"origin")
        if origin is not None and origin.decode("latin-1").lower() != f"{scheme}://{host}".lower():
            raise ApiError(
                403,
                "forbidden_origin",
                f"without a token only pages of this server may call it, "
                f"not {origin.decode('latin-1')[:100]!r}",
            )
        if scope["method"] in _BODY_METHODS:
            content_type = headers.get(b"content-type")
            length = headers.get(b"content-length", b"0")
            has_body = length != b"0" or b"transfer-encoding" in headers
            declared = content_type is not None or has_body
            if declared and not _is_json((content_type or b"").decode("latin-1")):
                raise ApiError(
                    415,
                    "unsupported_media_type",
                    "request bodies must be sent as Content-Type: application/json",
                )


_BASELINE_HEADERS: Final = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"content-security-policy", b"default-src 'none'; frame-ancestors 'none'"),
)


@attrs.define(eq=False)
class SecurityHeaders(HttpMiddleware):
    """ASGI middleware: every answer (JSON, errors, redirects, 404s) carries the baseline
    security headers; an answer that sets one itself (the browser's pages) keeps its own."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {name.lower() for name, _ in headers}
                headers += [(k, v) for k, v in _BASELINE_HEADERS if k not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
