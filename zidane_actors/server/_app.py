"""The REST session API: every ``SessionStore`` method as a route over one backing store.

Bodies are the model's camelCase JSON. Errors are always
``{"error": {"code", "message", "path"}}``: 400 for unparsable JSON, bad
ids and bad query parameters, 422 for a body that parses but does not fit
its type, 404 for unknown sessions, 409 for a lost conditional write, 413
for an oversized body, 501 for a method the backing store lacks.

The app runs on trio (hypercorn's trio worker, or any trio ASGI driver):
writes to one session are serialized by a per-session ``trio.Lock`` so
that the turn-id deduplication of appends and the revision check of
history writes are atomic against every other write made through this
server.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

import attrs
import msgspec
import trio
from msgspec import UNSET
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import (
    ConflictError,
    CorruptDataError,
    InvalidNameError,
    SessionNotFoundError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
    UnsupportedOperationError,
    ValidationError,
)
from ..model import (
    ArtifactFilter,
    Schedule,
    ScheduleFire,
    SessionArtifact,
    SessionData,
    SessionFilter,
    SessionHistory,
    decode,
    encode,
    new_id,
    validate_id,
)
from ..stores import MutateResult, SessionStore, store_capabilities
from ..stores._remote import (
    AppendTurnsBody,
    AppendTurnsResult,
    ClaimedResult,
    ClaimFireBody,
    ClaimRunBody,
    ClaimRunResult,
    ClaimSendRequestBody,
    DeletedResult,
    ErrorBody,
    ErrorDetail,
    HistoryBody,
    HistoryResult,
    HistoryState,
    IdResult,
    IdsResult,
    PatchMetaBody,
    SaveMetaBody,
    SettleSendRequestBody,
    UpdateRunBody,
    UpdateStatusBody,
    UpsertArtifactResult,
    history_rev,
)
from ._openapi import openapi_document
from ._ui import is_public_ui_path, ui_routes

__all__ = ["DEFAULT_MAX_BODY_BYTES", "create_app", "served_capabilities"]

T = TypeVar("T")

DEFAULT_MAX_BODY_BYTES: Final = 32 * 1024 * 1024
"""Largest request body accepted by default (a whole session document fits)."""

_SERVER_PROVIDED: Final = frozenset(
    {"generate_session_id", "generate_turn_id", "mutate_history", "mutate_turns"}
)
_log = logging.getLogger("zidane_actors.server")


def served_capabilities(store: object) -> frozenset[str]:
    """The optional methods the API serves over ``store``.

    The server adds id generation (random UUIDs) and the history rewrite
    (over ``load`` + ``save`` under its session lock) when the store lacks
    them; ``aclose`` is never exposed.
    """
    return (store_capabilities(store) | _SERVER_PROVIDED) - {"aclose"}


class _ApiError(Exception):
    """An error answer: HTTP status, stable code, message and field path."""

    def __init__(self, status: int, code: str, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.path = path


class _RevMismatch(Exception):
    """Raised inside a history mutation to abort it when the revision moved on."""

    def __init__(self, rev: str) -> None:
        super().__init__(rev)
        self.rev = rev


def _error_response(status: int, code: str, message: str, path: str | None = None) -> Response:
    body = ErrorBody(error=ErrorDetail(code=code, message=message, path=path))
    return Response(encode(body), status_code=status, media_type="application/json")


def _json(value: object, status: int = 200) -> Response:
    return Response(encode(value), status_code=status, media_type="application/json")


def _no_content() -> Response:
    return Response(status_code=204)


def _mapped(exc: Exception) -> _ApiError:
    """The API error for a library exception raised while serving."""
    if isinstance(exc, InvalidNameError):
        return _ApiError(400, "invalid_name", str(exc), exc.path)
    if isinstance(exc, ValidationError):
        return _ApiError(422, "invalid", str(exc), exc.path)
    if isinstance(exc, OverflowError):  # e.g. an integer past SQLite's 64 bits
        return _ApiError(422, "out_of_range", f"a number is out of the store's range: {exc}")
    if isinstance(exc, SessionNotFoundError):
        return _ApiError(404, "session_not_found", str(exc))
    if isinstance(exc, ConflictError):
        return _ApiError(409, "conflict", str(exc))
    if isinstance(exc, UnsupportedOperationError):
        return _ApiError(501, "unsupported", str(exc))
    if isinstance(exc, (StoreUnavailableError, StoreClosedError)):
        return _ApiError(503, "store_unavailable", str(exc))
    if isinstance(exc, CorruptDataError):
        return _ApiError(500, "corrupt_data", str(exc))
    if isinstance(exc, StoreError):
        return _ApiError(500, "store_error", str(exc))
    return _ApiError(500, "internal", f"internal error: {type(exc).__name__}")


def _ui_error(exc: Exception) -> tuple[int, str]:
    """Status and message of the browser's error page for ``exc``."""
    error = _mapped(exc)
    return error.status, error.message


def _param_int(request: Request, name: str, default: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 15:
        raise _ApiError(
            400, "invalid_query", f"query parameter {name!r} must be a non-negative integer"
        )
    return int(raw)


def _param_bool(request: Request, name: str) -> bool:
    raw = request.query_params.get(name)
    if raw is None or raw == "false":
        return False
    if raw == "true":
        return True
    raise _ApiError(400, "invalid_query", f"query parameter {name!r} must be true or false")


def _project_root(request: Request) -> str | msgspec.UnsetType | None:
    """The tri-state project filter: ``projectRoot=X``, ``untaggedOnly=true``, or neither."""
    root = request.query_params.get("projectRoot")
    untagged = _param_bool(request, "untaggedOnly")
    if root is not None and untagged:
        raise _ApiError(400, "invalid_query", "give projectRoot or untaggedOnly=true, not both")
    if untagged:
        return None
    return root if root is not None else UNSET


def _session_filter(request: Request) -> SessionFilter:
    return SessionFilter(
        agent_id=request.query_params.get("agentId"),
        limit=_param_int(request, "limit"),
        project_root=_project_root(request),
    )


def _path_id(request: Request, name: str, what: str) -> str:
    return validate_id(request.path_params[name], what=what)


@attrs.define(eq=False)
class _SessionLocks:
    """One ``trio.Lock`` per session id, dropped when nobody holds or waits on it."""

    _locks: dict[str, tuple[trio.Lock, int]] = attrs.field(factory=dict)

    @asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(session_id, (trio.Lock(), 0))
        self._locks[session_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[session_id]
            if users == 1:
                del self._locks[session_id]
            else:
                self._locks[session_id] = (lock, users - 1)


Handler = Callable[[Request], Awaitable[Response]]


@attrs.define(eq=False)
class _Api:
    """The route handlers over one backing store."""

    store: SessionStore
    max_body_bytes: int
    capabilities: frozenset[str]
    locks: _SessionLocks = attrs.field(factory=_SessionLocks)

    def _optional(self, name: str) -> Any:
        if name not in self.capabilities:
            raise _ApiError(501, "unsupported", f"the backing store does not implement {name}")
        return getattr(self.store, name)

    async def _body(self, request: Request, type_: type[T]) -> T:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise _ApiError(413, "body_too_large", self._too_large())
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _ApiError(413, "body_too_large", self._too_large())
            chunks.append(chunk)
        raw = b"".join(chunks)
        try:
            return decode(raw, type_, what="request body")
        except ValidationError as exc:
            try:
                msgspec.json.decode(raw)
            except msgspec.DecodeError:
                raise _ApiError(400, "invalid_json", str(exc), exc.path) from None
            except RecursionError:  # well-formed, but nested past MAX_JSON_DEPTH
                pass
            raise _ApiError(422, "invalid_body", str(exc), exc.path) from None

    def _too_large(self) -> str:
        return f"request body exceeds the limit of {self.max_body_bytes} bytes"

    # -- sessions --------------------------------------------------------

    async def capabilities_(self, request: Request) -> Response:
        return _json(sorted(self.capabilities))

    async def list_sessions(self, request: Request) -> Response:
        ids = await self.store.list(_session_filter(request))
        return _json(IdsResult(ids=tuple(ids)))

    async def list_meta(self, request: Request) -> Response:
        rows = await self._optional("list_meta")(_session_filter(request))
        return _json(rows)

    async def generate_session_id(self, request: Request) -> Response:
        make = getattr(self.store, "generate_session_id", None)
        return _json(IdResult(id=await make() if callable(make) else new_id()))

    async def generate_turn_id(self, request: Request) -> Response:
        make = getattr(self.store, "generate_turn_id", None)
        return _json(IdResult(id=await make() if callable(make) else new_id()))

    async def load(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        data = await self.store.load(sid)
        if data is None:
            raise _ApiError(404, "session_not_found", f"no session {sid!r}")
        return _json(data)

    async def save(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        data = await self._body(request, SessionData)
        _same(sid, data.id, "$.id", "session id")
        async with self.locks.hold(sid):
            await self.store.save(data)
        return _no_content()

    async def delete(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        async with self.locks.hold(sid):
            await self.store.delete(sid)
        return _no_content()

    async def get_turns(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        start = _param_int(request, "from", 0)
        assert start is not None
        turns = await self.store.get_turns(sid, start, _param_int(request, "limit"))
        return _json(turns)

    async def append_turns(self, request: Request) -> Response:
        """Append the turns whose ids the session does not hold yet (retry-safe)."""
        sid = _path_id(request, "sessionId", "session id")
        body = await self._body(request, AppendTurnsBody)
        async with self.locks.hold(sid):
            stored = {t.id for t in await self.store.get_turns(sid)}
            fresh = tuple(t for t in body.turns if t.id not in stored)
            # Called even with nothing fresh: an unknown session still answers 404.
            await self.store.append_turns(sid, fresh, body.options)
        skipped = tuple(t.id for t in body.turns if t.id in stored)
        return _json(AppendTurnsResult(appended=len(fresh), skipped=skipped))

    async def update_run(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        run_id = _path_id(request, "runId", "run id")
        body = await self._body(request, UpdateRunBody)
        _same(run_id, body.run.id, "$.run.id", "run id")
        async with self.locks.hold(sid):
            await self.store.update_run(sid, body.run, body.options)
        return _no_content()

    async def update_status(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        body = await self._body(request, UpdateStatusBody)
        async with self.locks.hold(sid):
            await self.store.update_status(
                sid, body.status, owner=body.owner, preserve_updated_at=body.preserve_updated_at
            )
        return _no_content()

    async def get_meta(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        row = await self._optional("get_meta")(sid)
        if row is None:
            raise _ApiError(404, "session_not_found", f"no session {sid!r}")
        return _json(row)

    async def save_meta(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        save_meta = self._optional("save_meta")
        body = await self._body(request, SaveMetaBody)
        _same(sid, body.session.id, "$.session.id", "session id")
        async with self.locks.hold(sid):
            await save_meta(body.session, body.options)
        return _no_content()

    async def patch_meta(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        patch_meta = self._optional("patch_meta")
        body = await self._body(request, PatchMetaBody)
        both = sorted(set(body.set) & set(body.remove))
        if both:
            raise _ApiError(422, "invalid_body", f"keys both set and removed: {both}", "$.remove")
        patch: dict[str, Any] = dict(body.set)
        patch.update(dict.fromkeys(body.remove, UNSET))
        async with self.locks.hold(sid):
            await patch_meta(sid, patch)
        return _no_content()

    async def claim_run(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        claim_run = self._optional("claim_run")
        body = await self._body(request, ClaimRunBody)
        async with self.locks.hold(sid):
            claim = await claim_run(sid, stale_at=body.stale_at, owner=body.owner)
        return _json(ClaimRunResult(claimed=claim.claimed, previous=claim.previous))

    # -- history ---------------------------------------------------------

    async def get_history(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        data = await self.store.load(sid)
        if data is None:
            raise _ApiError(404, "session_not_found", f"no session {sid!r}")
        history = SessionHistory(turns=data.turns, runs=data.runs)
        return _json(HistoryState(history=history, rev=history_rev(history)))

    async def put_history(self, request: Request) -> Response:
        """Write a history if the stored one still has ``expectedRev`` (else 409)."""
        sid = _path_id(request, "sessionId", "session id")
        body = await self._body(request, HistoryBody)
        try:
            async with self.locks.hold(sid):
                result = await self._write_history(sid, body)
        except _RevMismatch as exc:
            raise _ApiError(
                409,
                "rev_mismatch",
                f"history of {sid!r} is at revision {exc.rev}, not {body.expected_rev}",
            ) from None
        rev = history_rev(body.history) if result == "ok" else None
        return _json(HistoryResult(result=result, rev=rev))

    async def _write_history(self, sid: str, body: HistoryBody) -> MutateResult:
        def mutate(history: SessionHistory) -> SessionHistory:
            rev = history_rev(history)
            if rev != body.expected_rev:
                raise _RevMismatch(rev)
            return body.history

        native = getattr(self.store, "mutate_history", None)
        if callable(native):
            result: MutateResult = await native(sid, mutate)
            return result
        data = await self.store.load(sid)
        if data is None:
            return "no-session"
        nxt = mutate(SessionHistory(turns=data.turns, runs=data.runs))
        await self.store.save(msgspec.structs.replace(data, turns=nxt.turns, runs=nxt.runs))
        return "ok"

    # -- send requests ---------------------------------------------------

    async def claim_send_request(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        rid = _path_id(request, "requestId", "request id")
        claim = self._optional("claim_send_request")
        body = await self._body(request, ClaimSendRequestBody)
        async with self.locks.hold(sid):
            return _json(await claim(sid, rid, body.fingerprint))

    async def find_send_request(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        rid = _path_id(request, "requestId", "request id")
        record = await self._optional("find_send_request")(sid, rid)
        if record is None:
            raise _ApiError(404, "send_request_not_found", f"no request {rid!r} in {sid!r}")
        return _json(record)

    async def settle_send_request(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        rid = _path_id(request, "requestId", "request id")
        settle = self._optional("settle_send_request")
        body = await self._body(request, SettleSendRequestBody)
        async with self.locks.hold(sid):
            await settle(sid, rid, body.result)
        return _no_content()

    # -- artifacts -------------------------------------------------------

    async def upsert_artifact(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        upsert = self._optional("upsert_artifact")
        artifact = await self._body(request, SessionArtifact)
        _same(sid, artifact.session_id, "$.sessionId", "session id")
        validate_id(artifact.id, what="artifact id")
        async with self.locks.hold(sid):
            stored = await upsert(artifact)
        return _json(UpsertArtifactResult(artifact=stored))

    async def delete_artifact(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        aid = _path_id(request, "artifactId", "artifact id")
        delete = self._optional("delete_artifact")
        async with self.locks.hold(sid):
            await delete(sid, aid)
        return _no_content()

    async def list_artifacts(self, request: Request) -> Response:
        list_artifacts = self._optional("list_artifacts")
        q = request.query_params
        session_id = q.get("sessionId")
        if session_id is not None:
            validate_id(session_id, what="sessionId")
        filter = ArtifactFilter(
            kind=q.get("kind"),
            limit=_param_int(request, "limit"),
            project_root=_project_root(request),
            session_id=session_id,
            since=_param_int(request, "since"),
            uri=q.get("uri"),
        )
        return _json(await list_artifacts(filter))

    # -- schedules -------------------------------------------------------

    async def list_schedules(self, request: Request) -> Response:
        return _json(await self._optional("list_schedules")())

    async def save_schedule(self, request: Request) -> Response:
        sched_id = _path_id(request, "scheduleId", "schedule id")
        save = self._optional("save_schedule")
        schedule = await self._body(request, Schedule)
        _same(sched_id, schedule.id, "$.id", "schedule id")
        await save(schedule, keep_next_fire_at=_param_bool(request, "keepNextFireAt"))
        return _no_content()

    async def delete_schedule(self, request: Request) -> Response:
        sched_id = _path_id(request, "scheduleId", "schedule id")
        deleted = await self._optional("delete_schedule")(sched_id)
        return _json(DeletedResult(deleted=deleted))

    async def claim_schedule_fire(self, request: Request) -> Response:
        sched_id = _path_id(request, "scheduleId", "schedule id")
        claim = self._optional("claim_schedule_fire")
        body = await self._body(request, ClaimFireBody)
        claimed = await claim(sched_id, body.due_at, body.next)
        return _json(ClaimedResult(claimed=claimed))

    async def list_schedule_fires(self, request: Request) -> Response:
        sched_id = _path_id(request, "scheduleId", "schedule id")
        list_fires = self._optional("list_schedule_fires")
        limit = _param_int(request, "limit", 50)
        return _json(await list_fires(sched_id, limit))

    async def record_schedule_fire(self, request: Request) -> Response:
        sched_id = _path_id(request, "scheduleId", "schedule id")
        record = self._optional("record_schedule_fire")
        fire = await self._body(request, ScheduleFire)
        _same(sched_id, fire.schedule_id, "$.scheduleId", "schedule id")
        validate_id(fire.id, what="fire id")
        await record(fire)
        return _no_content()


def _same(path_value: str, body_value: str, where: str, what: str) -> None:
    if path_value != body_value:
        raise _ApiError(
            400,
            "id_mismatch",
            f"{what} in the body ({body_value!r}) differs from the URL ({path_value!r})",
            where,
        )


def _guarded(handler: Handler) -> Handler:
    """Turn every exception of ``handler`` into a JSON error answer."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except _ApiError as exc:
            return _error_response(exc.status, exc.code, exc.message, exc.path)
        except Exception as exc:
            error = _mapped(exc)
            if error.status >= 500:
                _log.exception("%s %s failed", request.method, request.url.path)
            return _error_response(error.status, error.code, error.message, error.path)

    return endpoint


def _is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@attrs.define(eq=False)
class _Guard:
    """ASGI middleware: bearer-token check, or loopback-only without a token."""

    app: ASGIApp
    token: str | None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        denied = self._denied(scope)
        if denied is None:
            await self.app(scope, receive, send)
            return
        response = _error_response(*denied)
        if denied[0] == 401:
            response.headers["www-authenticate"] = 'Bearer realm="zidane-actors"'
        await response(scope, receive, send)

    def _denied(self, scope: Scope) -> tuple[int, str, str] | None:
        if self.token is None:
            client = scope.get("client")
            if _is_loopback(client[0] if client else None):
                return None
            return (403, "forbidden", "without a token the server accepts loopback clients only")
        if is_public_ui_path(scope["path"]):
            return None  # the browser's page shells and assets hold no data
        headers: Mapping[bytes, bytes] = dict(scope["headers"])
        auth = headers.get(b"authorization", b"")
        scheme, _, given = auth.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token.encode()):
            return None
        return (401, "unauthorized", "missing or wrong bearer token")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return _error_response(exc.status_code, code, str(exc.detail))


def _routes(api: _Api, openapi: bytes) -> list[Route]:
    async def openapi_json(request: Request) -> Response:
        return Response(openapi, media_type="application/json")

    table: list[tuple[str, str, Handler]] = [
        ("/capabilities", "GET", api.capabilities_),
        ("/sessions", "GET", api.list_sessions),
        ("/session-meta", "GET", api.list_meta),
        ("/session-ids", "POST", api.generate_session_id),
        ("/turn-ids", "POST", api.generate_turn_id),
        ("/sessions/{sessionId}", "GET", api.load),
        ("/sessions/{sessionId}", "PUT", api.save),
        ("/sessions/{sessionId}", "DELETE", api.delete),
        ("/sessions/{sessionId}/turns", "GET", api.get_turns),
        ("/sessions/{sessionId}/turns", "POST", api.append_turns),
        ("/sessions/{sessionId}/runs/{runId}", "PUT", api.update_run),
        ("/sessions/{sessionId}/status", "PUT", api.update_status),
        ("/sessions/{sessionId}/meta", "GET", api.get_meta),
        ("/sessions/{sessionId}/meta", "PUT", api.save_meta),
        ("/sessions/{sessionId}/meta", "PATCH", api.patch_meta),
        ("/sessions/{sessionId}/claim-run", "POST", api.claim_run),
        ("/sessions/{sessionId}/history", "GET", api.get_history),
        ("/sessions/{sessionId}/history", "PUT", api.put_history),
        (
            "/sessions/{sessionId}/send-requests/{requestId}/claim",
            "POST",
            api.claim_send_request,
        ),
        ("/sessions/{sessionId}/send-requests/{requestId}", "GET", api.find_send_request),
        (
            "/sessions/{sessionId}/send-requests/{requestId}/result",
            "PUT",
            api.settle_send_request,
        ),
        ("/sessions/{sessionId}/artifacts", "PUT", api.upsert_artifact),
        ("/sessions/{sessionId}/artifacts/{artifactId}", "DELETE", api.delete_artifact),
        ("/artifacts", "GET", api.list_artifacts),
        ("/schedules", "GET", api.list_schedules),
        ("/schedules/{scheduleId}", "PUT", api.save_schedule),
        ("/schedules/{scheduleId}", "DELETE", api.delete_schedule),
        ("/schedules/{scheduleId}/claim-fire", "POST", api.claim_schedule_fire),
        ("/schedules/{scheduleId}/fires", "GET", api.list_schedule_fires),
        ("/schedules/{scheduleId}/fires", "POST", api.record_schedule_fire),
    ]
    by_path: dict[str, dict[str, Handler]] = {}
    for path, method, handler in table:
        by_path.setdefault(path, {})[method] = _guarded(handler)
    routes = [Route("/openapi.json", openapi_json, methods=["GET"])]
    for path, methods in by_path.items():
        routes.append(Route(path, _dispatch(methods), methods=list(methods)))
    return routes


def _dispatch(methods: dict[str, Handler]) -> Handler:
    async def endpoint(request: Request) -> Response:
        handler = methods.get(request.method) or methods["GET"]  # HEAD is served as GET
        return await handler(request)

    return endpoint


def create_app(
    store: SessionStore,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> ASGIApp:
    """The ASGI app serving ``store`` over REST (run it on trio).

    With ``token``, every request needs ``Authorization: Bearer <token>``
    (401 otherwise); without one, only loopback clients are served (403).
    Bodies over ``max_body_bytes`` answer 413.
    """
    if max_body_bytes <= 0:
        raise ValidationError(f"max_body_bytes must be positive, got {max_body_bytes}")
    if token is not None and not token:
        raise ValidationError("token must not be empty")
    capabilities = served_capabilities(store)
    api = _Api(store=store, max_body_bytes=max_body_bytes, capabilities=capabilities)
    openapi = encode(openapi_document(capabilities))
    routes = _routes(api, openapi) + ui_routes(store, _ui_error)
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    return _Guard(app=app, token=token)
