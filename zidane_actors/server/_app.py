"""The REST session API: every ``SessionStore`` method as a route over one backing store.

Bodies are the model's camelCase JSON. Errors are always
``{"error": {"code", "message", "path"}}``: 400 for unparsable JSON, bad
ids and bad query parameters, 422 for a body that parses but does not fit
its type, 404 for unknown sessions, 409 for a lost conditional write or a
body contradicting its URL, 413 for an oversized body, 501 for a method the
backing store lacks. The guard (``_guard``) and the limits (``_limits``)
answer 401/403/415 and 408/503 before or while a body is read.

The app runs on trio (hypercorn's trio worker, or any trio ASGI driver):
writes to one session are serialized by a per-session ``trio.Lock`` so
that the turn-id deduplication of appends and the revision check of
history writes are atomic against every other write made through this
server.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar, cast

import attrs
import msgspec
import trio
from msgspec import UNSET
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import (
    ValidationError,
)
from ..model import (
    ArtifactFilter,
    Schedule,
    ScheduleFire,
    SendRequestRecord,
    SessionArtifact,
    SessionData,
    SessionFilter,
    SessionHistory,
    SessionSearch,
    SessionSearchPage,
    convert,
    decode,
    encode,
    new_id,
    parse_json,
    preview,
    validate_id,
    validate_request_id,
)
from ..stores import MutateResult, SessionStore, fork_session, list_forks, store_capabilities
from ..stores._model_view import read_model_view
from ..stores._protocol import WRITE_METHODS, Revision, VersionedStore, is_versioned
from ..stores._validate import now_ms
from ..stores.remote._bodies import (
    IF_MATCH_HEADER,
    REV_AFTER_HEADER,
    REV_BEFORE_HEADER,
    REV_HEADER,
    AppendTurnsBody,
    ClaimedResult,
    ClaimFireBody,
    ClaimRunBody,
    ClaimRunResult,
    ClaimSendRequestBody,
    DeletedResult,
    DemotedResult,
    DemoteStaleRunBody,
    ForkBody,
    HistoryBody,
    HistoryResult,
    HistoryState,
    IdResult,
    IdsResult,
    PatchMetaBody,
    RevResult,
    SaveMetaBody,
    SettleSendRequestBody,
    UpdateRunBody,
    UpdateStatusBody,
    UpsertArtifactResult,
    encoded_history_rev,
    history_rev,
)
from ._errors import ApiError as _ApiError
from ._errors import mapped_error as _mapped
from ._errors import worth_a_traceback as _worth_a_traceback
from ._guard import Guard, SecurityHeaders
from ._limits import (
    Admission,
    AnswerBudget,
    BodyBudget,
    CloseUnread,
    ReadBudget,
    ReadHold,
    ServerLimits,
    read_body,
)
from ._numbers import integral_floats_as_ints
from ._openapi import openapi_document
from ._query import query_params
from ._ui import ui_routes
from ._writes import WritesRoutes

__all__ = ["create_app", "served_capabilities"]

T = TypeVar("T")

_SERVER_PROVIDED: Final = frozenset(
    {
        "fork_session",
        "generate_session_id",
        "generate_turn_id",
        "list_forks",
        "mutate_history",
        "mutate_turns",
    }
)
_log = logging.getLogger("zidane_actors.server")


def served_capabilities(store: object) -> frozenset[str]:
    """The optional methods the API serves over ``store``.

    The server adds id generation (random UUIDs), the history rewrite
    (over ``load`` + ``save`` under its session lock) and forks (the generic
    rule of ``stores.fork_session``) when the store lacks them; ``aclose`` is
    never exposed.
    """
    return (store_capabilities(store) | _SERVER_PROVIDED) - {"aclose"}


class _RevMismatch(Exception):
    """Raised inside a history mutation to abort it when the revision moved on."""

    def __init__(self, rev: str) -> None:
        super().__init__(rev)
        self.rev = rev


def _json(value: object, status: int = 200) -> Response:
    return Response(encode(value), status_code=status, media_type="application/json")


def _held_json(held: ReadHold, value: object, headers: dict[str, str] | None = None) -> Response:
    """The JSON answer of ``value``, a store read counted in ``held``: twice its encoding
    (the value read and the answer), until the handler returns and the answer's own
    count (``AnswerBudget``) takes over."""
    body = encode(value)
    held.add(2 * len(body))
    return Response(body, media_type="application/json", headers=headers)


def _no_content() -> Response:
    return Response(status_code=204)


def _revision_headers(revision: object) -> dict[str, str]:
    """A write's revision headers (none when the store answered no revision)."""
    if type(revision) is not Revision:
        return {}
    return {REV_BEFORE_HEADER: str(revision.before), REV_AFTER_HEADER: str(revision.after)}


def _written(revision: object) -> Response:
    """204, with the write's revision headers when the store answered one."""
    return Response(status_code=204, headers=_revision_headers(revision))


def _ui_error(exc: Exception, session_id: str | None) -> tuple[int, str]:
    """Status and message of the browser's error page for ``exc``."""
    error = _named(_mapped(exc), session_id)
    return error.status, error.message


def _named(error: _ApiError, session_id: str | None) -> _ApiError:
    """``error`` with the session it concerns named, when its message does not say."""
    if error.status < 500 or session_id is None or preview(session_id) in error.message:
        return error
    return _ApiError(
        error.status, error.code, f"session {preview(session_id)}: {error.message}", error.path
    )


def _found(value: T | None, session_id: str) -> T:
    """``value``, or the 404 of a session the store does not hold."""
    if value is None:
        raise _ApiError(404, "session_not_found", f"no session {preview(session_id)}")
    return value


def _param_int(request: Request, name: str, default: int | None = None) -> int | None:
    raw = query_params(request).get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 15:
        raise _ApiError(
            400, "invalid_query", f"query parameter {name!r} must be a non-negative integer"
        )
    return int(raw)


def _param_bool(request: Request, name: str) -> bool:
    raw = query_params(request).get(name)
    if raw is None or raw == "false":
        return False
    if raw == "true":
        return True
    raise _ApiError(400, "invalid_query", f"query parameter {name!r} must be true or false")


class _NoMatch(Exception):
    """A listing filter no row can pass: ``projectRoot=X`` with ``untaggedOnly=true``."""


def _project_root(request: Request) -> str | msgspec.UnsetType | None:
    """The tri-state project filter: ``projectRoot=X``, ``untaggedOnly=true``, or neither.

    The query's filters are a conjunction: both at once match nothing (``_NoMatch``).
    """
    root = query_params(request).get("projectRoot")
    untagged = _param_bool(request, "untaggedOnly")
    if root is not None and untagged:
        raise _NoMatch
    if untagged:
        return None
    return root if root is not None else UNSET


_SEARCH_INTS: Final = (
    "createdFrom",
    "createdTo",
    "updatedFrom",
    "updatedTo",
    "limit",
    "offset",
    "countLimit",
)
"""The integer query parameters of ``GET /session-search``."""


def _session_filter(request: Request) -> SessionFilter:
    return SessionFilter(
        agent_id=query_params(request).get("agentId"),
        limit=_param_int(request, "limit"),
        project_root=_project_root(request),
    )


def _path_id(request: Request, name: str, what: str) -> str:
    return validate_id(request.path_params[name], what=what)


@attrs.define(eq=False)
class _SessionLocks:
    """One ``trio.Lock`` per session id, dropped when nobody holds or waits on it."""

    _locks: dict[str, tuple[trio.Lock, int]] = attrs.field(factory=dict)

    def hold(self, session_id: str) -> _Held:
        """``async with locks.hold(id):`` the session's writes, one request at a time."""
        return _Held(self._locks, session_id)


@attrs.define(eq=False)
class _Held:
    """Holding one session's lock (a plain class: this is on every write's path)."""

    _locks: dict[str, tuple[trio.Lock, int]]
    _session_id: str

    async def __aenter__(self) -> None:
        lock, users = self._locks.get(self._session_id) or (trio.Lock(), 0)
        self._locks[self._session_id] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:
            self._leave()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._locks[self._session_id][0].release()
        self._leave()

    def _leave(self) -> None:
        lock, users = self._locks[self._session_id]
        if users == 1:
            del self._locks[self._session_id]
        else:
            self._locks[self._session_id] = (lock, users - 1)


Handler = Callable[[Request], Awaitable[Response]]


@attrs.define(eq=False)
class _Api(WritesRoutes):
    """The route handlers over one backing store."""

    store: SessionStore
    """Where reads (and claims, schedules, history edits) go."""
    writer: SessionStore
    """Where the ``WRITE_METHODS`` go: the store, or a store actor batching them."""
    limits: ServerLimits
    capabilities: frozenset[str]
    budget: BodyBudget
    reads: ReadBudget
    """The store reads of whole sessions (or large parts), counted in ``budget``."""
    locks: _SessionLocks = attrs.field(factory=_SessionLocks)

    def _expected(self, request: Request) -> dict[str, int]:
        """The ``expected_rev`` of a conditional write (``If-Match: "7"``), as keyword arguments."""
        value = request.headers.get(IF_MATCH_HEADER)
        if value is None:
            return {}
        digits = value.strip().removeprefix("W/").strip('"')
        if not digits.isdigit() or len(digits) > 19:
            raise _ApiError(
                400, "invalid_header", f"If-Match must be a quoted rev, got {preview(value)}"
            )
        if not is_versioned(self.capabilities):
            raise _ApiError(501, "unsupported", "the backing store keeps no versions")
        return {"expected_rev": int(digits)}

    def _optional(self, name: str) -> Any:
        if name not in self.capabilities:
            raise _ApiError(501, "unsupported", f"the backing store does not implement {name}")
        return getattr(self.writer if name in WRITE_METHODS else self.store, name)

    async def _body(self, request: Request, type_: type[T]) -> T:
        raw = await read_body(request, self.limits, self.budget)
        try:
            # msgspec reads any buffer: no copy of a body of up to max_body_bytes.
            return decode(cast("bytes", raw), type_, what="request body")
        except ValidationError as exc:
            error = exc
        try:
            value = parse_json(cast("bytes", raw))
        except msgspec.DecodeError:
            raise _ApiError(400, "invalid_json", str(error), error.path) from None
        except RecursionError:  # well-formed, but nested past MAX_JSON_DEPTH
            raise _ApiError(422, "invalid_body", str(error), error.path) from None
        if "got `float`" in str(error):  # maybe an integer spelled 2.0
            try:
                return convert(integral_floats_as_ints(value, type_), type_, what="request body")
            except ValidationError as again:
                error = again
            except RecursionError:  # free-form values nested past what Python recurses
                pass
        raise _ApiError(422, "invalid_body", str(error), error.path) from None

    # -- sessions --------------------------------------------------------

    async def capabilities_(self, request: Request) -> Response:
        return _json(sorted(self.capabilities))

    async def list_sessions(self, request: Request) -> Response:
        try:
            filter = _session_filter(request)
        except _NoMatch:
            return _json(IdsResult(ids=()))
        return _json(IdsResult(ids=tuple(await self.store.list(filter))))

    async def list_meta(self, request: Request) -> Response:
        list_meta = self._optional("list_meta")
        try:
            filter = _session_filter(request)
        except _NoMatch:
            return _json([])
        return _json(await list_meta(filter))

    async def search_meta(self, request: Request) -> Response:
        search_meta = self._optional("search_meta")
        try:
            root = _project_root(request)
        except _NoMatch:
            return _json(SessionSearchPage(rows=(), total=0, total_exact=True))
        fields: dict[str, Any] = {
            name: query_params(request)[name]
            for name in ("text", "agentId", "status", "order")
            if name in query_params(request)
        }
        for name in _SEARCH_INTS:
            value = _param_int(request, name)
            if value is not None:
                fields[name] = value
        if root is not UNSET:
            fields["projectRoot"] = root
        search = convert(fields, SessionSearch, what="session search")
        return _json(await search_meta(search))

    async def _new_session_id(self) -> str:
        make = getattr(self.store, "generate_session_id", None)
        made: str = await make() if callable(make) else new_id()
        return made

    async def generate_session_id(self, request: Request) -> Response:
        return _json(IdResult(id=await self._new_session_id()))

    async def generate_turn_id(self, request: Request) -> Response:
        make = getattr(self.store, "generate_turn_id", None)
        return _json(IdResult(id=await make() if callable(make) else new_id()))

    async def load(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        async with self.reads.hold(("session", sid)) as held:
            if not is_versioned(self.capabilities):
                return _held_json(held, _found(await self.store.load(sid), sid))
            data, rev = _found(await cast(VersionedStore, self.store).load_versioned(sid), sid)
            return _held_json(held, data, {REV_HEADER: str(rev)})

    async def get_rev(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        rev: int = _found(await self._optional("get_rev")(sid), sid)
        return _json(RevResult(rev=rev))

    async def save(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        expected = self._expected(request)
        data = await self._body(request, SessionData)
        _same(sid, data.id, "$.id", "session id")
        async with self.locks.hold(sid):
            return _written(await self.writer.save(data, **expected))

    async def delete(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        async with self.locks.hold(sid):
            await self.writer.delete(sid)
        return _no_content()

    async def get_turns(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        start = _param_int(request, "from", 0)
        assert start is not None
        limit = _param_int(request, "limit")
        async with self.reads.hold(("turns", sid, start, limit)) as held:
            return _held_json(held, await self.store.get_turns(sid, start, limit))

    async def load_model_view(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        async with self.reads.hold(("model-view", sid)) as held:
            view = await read_model_view(self.store, sid, self.capabilities)
            return _held_json(held, _found(view, sid))

    async def fork_session(self, request: Request) -> Response:
        """Fork the session (the store's own fork, or the generic rule): 201 with the fork's id."""
        sid = _path_id(request, "sessionId", "session id")
        body = await self._body(request, ForkBody)
        new = await self._new_session_id() if body.id is None else body.id
        validate_id(new, what="fork id at $.id")
        created_at = now_ms() if body.created_at is None else body.created_at
        async with self.locks.hold(new):
            revision = await fork_session(
                self.store,
                sid,
                new,
                at=body.at,
                created_at=created_at,
                expected_rev=body.expected_rev,
            )
        body_bytes = encode(IdResult(id=new))
        return Response(body_bytes, 201, _revision_headers(revision), "application/json")

    async def list_forks(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        return _json(IdsResult(ids=tuple(await list_forks(self.store, sid))))

    async def append_turns(self, request: Request) -> Response:
        """Append turns through the store's unique-turn-id rule: O(1) of the history.

        A stored identical turn is skipped (a retry), a stored id with other
        content is 409, an id repeated in the body 422.
        """
        sid = _path_id(request, "sessionId", "session id")
        body = await self._body(request, AppendTurnsBody)
        async with self.locks.hold(sid):
            return _written(await self.writer.append_turns(sid, body.turns, body.options))

    async def update_run(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        run_id = _path_id(request, "runId", "run id")
        body = await self._body(request, UpdateRunBody)
        _same(run_id, body.run.id, "$.run.id", "run id")
        async with self.locks.hold(sid):
            return _written(await self.writer.update_run(sid, body.run, body.options))

    async def update_status(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        body = await self._body(request, UpdateStatusBody)
        async with self.locks.hold(sid):
            return _written(
                await self.writer.update_status(
                    sid, body.status, owner=body.owner, preserve_updated_at=body.preserve_updated_at
                )
            )

    async def get_meta(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        return _json(_found(await self._optional("get_meta")(sid), sid))

    async def save_meta(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        save_meta = self._optional("save_meta")
        expected = self._expected(request)
        body = await self._body(request, SaveMetaBody)
        _same(sid, body.session.id, "$.session.id", "session id")
        async with self.locks.hold(sid):
            return _written(await save_meta(body.session, body.options, **expected))

    async def patch_meta(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        patch_meta = self._optional("patch_meta")
        body = await self._body(request, PatchMetaBody)
        both = sorted(set(body.set) & set(body.remove))
        if both:
            # 409, not 422: the body fits its schema, which cannot say "disjoint".
            raise _ApiError(
                409, "conflicting_patch", f"keys both set and removed: {both}", "$.remove"
            )
        patch: dict[str, Any] = dict(body.set)
        patch.update(dict.fromkeys(body.remove, UNSET))
        async with self.locks.hold(sid):
            return _written(await patch_meta(sid, patch))

    async def claim_run(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        claim_run = self._optional("claim_run")
        body = await self._body(request, ClaimRunBody)
        async with self.locks.hold(sid):
            claim = await claim_run(sid, stale_at=body.stale_at, owner=body.owner)
        return _json(ClaimRunResult(claimed=claim.claimed, previous=claim.previous))

    async def demote_stale_run(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        demote = self._optional("demote_stale_run")
        body = await self._body(request, DemoteStaleRunBody)
        async with self.locks.hold(sid):
            demoted = await demote(sid, stale_at=body.stale_at, now=body.now)
        return _json(DemotedResult(demoted=demoted))

    # -- history ---------------------------------------------------------

    async def get_history(self, request: Request) -> Response:
        """The history and its revision, from one encoding of it (the revision hashes
        the very bytes the answer holds)."""
        sid = _path_id(request, "sessionId", "session id")
        async with self.reads.hold(("history", sid)) as held:
            data = _found(await self.store.load(sid), sid)
            history = encode(SessionHistory(turns=data.turns, runs=data.runs))
            del data  # the encoding serves from here
            held.add(2 * len(history))  # the history read, then the answer built from it
            raw = cast(SessionHistory, msgspec.Raw(history))  # encoded as is, never read
            state = HistoryState(history=raw, rev=encoded_history_rev(history))
            return Response(msgspec.json.encode(state), media_type="application/json")

    async def put_history(self, request: Request) -> Response:
        """Write a history if the stored one still has ``expectedRev`` (else 409)."""
        sid = _path_id(request, "sessionId", "session id")
        body = await self._body(request, HistoryBody)
        for i, turn in enumerate(body.history.turns):  # checked even for an unknown session
            validate_id(turn.id, what=f"turn id at $.history.turns[{i}].id")
        for i, run in enumerate(body.history.runs):
            validate_id(run.id, what=f"run id at $.history.runs[{i}].id")
        expected = self._expected(request)
        told: list[Revision] = []
        try:
            async with self.locks.hold(sid):
                result = await self._write_history(sid, body, expected, told)
        except _RevMismatch as exc:
            raise _ApiError(
                409,
                "rev_mismatch",
                f"history of {preview(sid)} is at revision {exc.rev}, not {body.expected_rev}",
            ) from None
        rev = history_rev(body.history) if result == "ok" else None
        response = _json(HistoryResult(result=result, rev=rev))
        if told:
            response.headers[REV_BEFORE_HEADER] = str(told[0].before)
            response.headers[REV_AFTER_HEADER] = str(told[0].after)
        return response

    async def _write_history(
        self, sid: str, body: HistoryBody, expected: dict[str, int], told: list[Revision]
    ) -> MutateResult:
        def mutate(history: SessionHistory) -> SessionHistory:
            rev = history_rev(history)
            if rev != body.expected_rev:
                raise _RevMismatch(rev)
            return body.history

        native = getattr(self.store, "mutate_history", None)
        if callable(native):
            versioned: dict[str, Any] = {}
            if is_versioned(self.capabilities):
                versioned = {"on_revision": told.append, **expected}
            result: MutateResult = await native(sid, mutate, **versioned)
            return result
        data = await self.store.load(sid)
        if data is None:
            return "no-session"
        nxt = mutate(SessionHistory(turns=data.turns, runs=data.runs))
        await self.writer.save(msgspec.structs.replace(data, turns=nxt.turns, runs=nxt.runs))
        return "ok"

    # -- send requests ---------------------------------------------------

    async def claim_send_request(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        rid = validate_request_id(request.path_params["requestId"])
        claim = self._optional("claim_send_request")
        body = await self._body(request, ClaimSendRequestBody)
        async with self.locks.hold(sid):
            return _json(await claim(sid, rid, body.fingerprint))

    async def find_send_request(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        rid = validate_request_id(request.path_params["requestId"])
        record = await self._optional("find_send_request")(sid, rid)
        if record is None:
            raise _ApiError(
                404, "send_request_not_found", f"no request {preview(rid)} in {preview(sid)}"
            )
        return _json(record)

    async def list_send_requests(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        list_send_requests = self._optional("list_send_requests")
        async with self.reads.hold(("send-requests", sid)) as held:
            return _held_json(held, await list_send_requests(sid))

    async def put_send_request(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        rid = validate_request_id(request.path_params["requestId"])
        put = self._optional("put_send_request")
        record = await self._body(request, SendRequestRecord)
        _same(rid, record.request_id, "$.requestId", "request id", validate_request_id)
        async with self.locks.hold(sid):
            await put(sid, record)
        return _no_content()

    async def settle_send_request(self, request: Request) -> Response:
        sid = _path_id(request, "sessionId", "session id")
        rid = validate_request_id(request.path_params["requestId"])
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
        q = query_params(request)
        session_id = q.get("sessionId")
        if session_id is not None:
            validate_id(session_id, what="sessionId")
        limit = _param_int(request, "limit")
        since = _param_int(request, "since")
        try:
            project_root = _project_root(request)
        except _NoMatch:
            return _json([])
        filter = ArtifactFilter(
            kind=q.get("kind"),
            limit=limit,
            project_root=project_root,
            session_id=session_id,
            since=since,
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


def _same(
    path_value: str,
    body_value: str,
    where: str,
    what: str,
    check: Callable[..., str] = validate_id,
) -> None:
    check(body_value, what=f"{what} at {where}")
    # 409, as RFC 9110 suggests for a PUT whose representation contradicts its target.
    if path_value != body_value:
        raise _ApiError(
            409,
            "id_mismatch",
            f"{what} in the body ({preview(body_value)})"
            f" differs from the URL ({preview(path_value)})",
            where,
        )


def _guarded(handler: Handler, budget: BodyBudget) -> Handler:
    """Turn every exception of ``handler`` into a JSON error answer; give back its body bytes."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except _ApiError as exc:
            return exc.response()
        except ClientDisconnect:
            _log.info(
                "%s %s: the client left before sending its body", request.method, request.url.path
            )
            return _ApiError(400, "client_disconnected", "the client left mid-body").response()
        except Exception as exc:
            error = _named(_mapped(exc), request.path_params.get("sessionId"))
            if _worth_a_traceback(error):
                _log.exception("%s %s failed", request.method, request.url.path)
            return _ApiError(error.status, error.code, error.message, error.path).response()
        finally:
            budget.release(getattr(request.state, "body_bytes", 0))

    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return _ApiError(exc.status_code, code, str(exc.detail), headers=exc.headers).response()


def _routes(api: _Api, openapi: bytes) -> list[Route]:
    async def openapi_json(request: Request) -> Response:
        return Response(openapi, media_type="application/json")

    table: list[tuple[str, str, Handler]] = [
        ("/capabilities", "GET", api.capabilities_),
        ("/writes", "POST", api.apply_writes),
        ("/sessions", "GET", api.list_sessions),
        ("/session-meta", "GET", api.list_meta),
        ("/session-search", "GET", api.search_meta),
        ("/session-ids", "POST", api.generate_session_id),
        ("/turn-ids", "POST", api.generate_turn_id),
        ("/sessions/{sessionId}", "GET", api.load),
        ("/sessions/{sessionId}", "PUT", api.save),
        ("/sessions/{sessionId}", "DELETE", api.delete),
        ("/sessions/{sessionId}/rev", "GET", api.get_rev),
        ("/sessions/{sessionId}/turns", "GET", api.get_turns),
        ("/sessions/{sessionId}/turns", "POST", api.append_turns),
        ("/sessions/{sessionId}/model-view", "GET", api.load_model_view),
        ("/sessions/{sessionId}/forks", "POST", api.fork_session),
        ("/sessions/{sessionId}/forks", "GET", api.list_forks),
        ("/sessions/{sessionId}/runs/{runId}", "PUT", api.update_run),
        ("/sessions/{sessionId}/status", "PUT", api.update_status),
        ("/sessions/{sessionId}/meta", "GET", api.get_meta),
        ("/sessions/{sessionId}/meta", "PUT", api.save_meta),
        ("/sessions/{sessionId}/meta", "PATCH", api.patch_meta),
        ("/sessions/{sessionId}/claim-run", "POST", api.claim_run),
        ("/sessions/{sessionId}/demote-stale-run", "POST", api.demote_stale_run),
        ("/sessions/{sessionId}/history", "GET", api.get_history),
        ("/sessions/{sessionId}/history", "PUT", api.put_history),
        (
            "/sessions/{sessionId}/send-requests/{requestId:path}/claim",
            "POST",
            api.claim_send_request,
        ),
        (
            "/sessions/{sessionId}/send-requests/{requestId:path}/result",
            "PUT",
            api.settle_send_request,
        ),
        ("/sessions/{sessionId}/send-requests", "GET", api.list_send_requests),
        ("/sessions/{sessionId}/send-requests/{requestId:path}", "GET", api.find_send_request),
        ("/sessions/{sessionId}/send-requests/{requestId:path}", "PUT", api.put_send_request),
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
        by_path.setdefault(path, {})[method] = _guarded(handler, api.budget)
    routes = [Route("/openapi.json", openapi_json, methods=["GET"])]
    for path, methods in by_path.items():
        routes.append(Route(path, _dispatch(methods), methods=list(methods)))
    return routes


@attrs.define(eq=False)
class _HotRoutes:
    """ASGI middleware: the two write routes every append takes, without Starlette's routing.

    ``POST /sessions/{id}/turns`` and ``POST /writes`` are matched here (as
    the router would: an id is one path segment) and answered by the same
    guarded handlers; every other request goes to ``app``. A request reaches
    this only past the guard and the admission limit.
    """

    app: ASGIApp
    append_turns: Handler
    apply_writes: Handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            handler: Handler | None = None
            if path == "/writes":
                handler = self.apply_writes
            elif path.startswith("/sessions/") and path.endswith("/turns"):
                sid = path[len("/sessions/") : -len("/turns")]
                if sid and "/" not in sid:
                    scope["path_params"] = {"sessionId": sid}
                    handler = self.append_turns
            if handler is not None:
                response = await handler(Request(scope, receive, send))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _dispatch(methods: dict[str, Handler]) -> Handler:
    async def endpoint(request: Request) -> Response:
        handler = methods.get(request.method) or methods["GET"]  # HEAD is served as GET
        return await handler(request)

    return endpoint


def create_app(
    store: SessionStore,
    *,
    token: str | None = None,
    limits: ServerLimits | None = None,
    writer: SessionStore | None = None,
) -> ASGIApp:
    """The ASGI app serving ``store`` over REST (run it on trio).

    With ``token``, every request needs ``Authorization: Bearer <token>``
    (401 otherwise); without one, only requests from local programs are
    served (see ``Guard``). ``limits`` bounds what is accepted at once.
    ``writer`` (a store actor over ``store``, as :func:`serve` passes) takes
    the plain writes, so that concurrent ones share commits while reads
    keep the store's own concurrency.
    """
    if token is not None and not token:
        raise ValidationError("token must not be empty")
    limits = limits or ServerLimits()
    capabilities = served_capabilities(store)
    budget = BodyBudget(limits.max_body_bytes_in_flight)
    api = _Api(
        store=store,
        writer=store if writer is None else writer,
        limits=limits,
        capabilities=capabilities,
        budget=budget,
        reads=ReadBudget(budget),
    )
    openapi = encode(openapi_document(capabilities))
    routes = _routes(api, openapi) + ui_routes(store, _ui_error, api.reads)
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    hot = _HotRoutes(
        app=app,
        append_turns=_guarded(api.append_turns, api.budget),
        apply_writes=_guarded(api.apply_writes, api.budget),
    )
    budgeted = AnswerBudget(app=hot, budget=api.budget)
    guarded = Guard(app=Admission(app=budgeted, max_requests=limits.max_requests), token=token)
    return CloseUnread(app=SecurityHeaders(app=guarded))
