"""``POST /writes``: a batch of store writes, applied in order (the REST API's batch route)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, TypeVar

import outcome
from starlette.requests import Request
from starlette.responses import Response

from ..model import encode, validate_id, validate_request_id
from ..stores import BatchingStore, SessionStore, StoreWrite
from ..stores._protocol import OPTIONAL_METHODS, Revision
from ..stores.remote._bodies import (
    AnyWrite,
    AppendTurnsWrite,
    DeleteArtifactWrite,
    ErrorDetail,
    PatchMetaWrite,
    RevisionBody,
    SaveMetaWrite,
    SaveWrite,
    SettleSendRequestWrite,
    UpdateRunWrite,
    UpsertArtifactWrite,
    WriteOutcome,
    WritesBody,
    WritesResult,
)
from ._errors import ApiError as _ApiError
from ._errors import mapped_error as _mapped
from ._errors import worth_a_traceback as _worth_a_traceback

if TYPE_CHECKING:
    from ._app import _SessionLocks

__all__ = ["WritesRoutes"]

T = TypeVar("T")
_log = logging.getLogger("zidane_actors.server")


class WritesRoutes:
    """The ``POST /writes`` handler, mixed into the API's handlers (``_app._Api``)."""

    store: SessionStore
    writer: SessionStore
    capabilities: frozenset[str]
    locks: _SessionLocks

    async def _body(self, request: Request, type_: type[T]) -> T:
        raise NotImplementedError

    async def apply_writes(self, request: Request) -> Response:
        """Apply a batch of store writes in order; one outcome per write (``POST /writes``).

        Every id is checked first (a bad one refuses the whole batch, 400);
        then each write answers what its own route would: the writes that
        pass are applied in one transaction when the store is a
        ``BatchingStore``, holding the lock of every session they touch.
        """
        body = await self._body(request, WritesBody)
        for i, write in enumerate(body.writes):
            _check_write_ids(write, f"$.writes[{i}]")
        calls = [self._store_write(write) for write in body.writes]
        async with AsyncExitStack() as held:
            for sid in sorted({_write_session(write) for write in body.writes}):
                await held.enter_async_context(self.locks.hold(sid))
            done = iter(await self._apply([c for c in calls if isinstance(c, StoreWrite)]))
        results = [call if isinstance(call, _ApiError) else next(done) for call in calls]
        answer = WritesResult(outcomes=tuple(map(self._outcome, body.writes, results)))
        return Response(encode(answer), media_type="application/json")

    def _store_write(self, write: AnyWrite) -> StoreWrite | _ApiError:
        """The store call of ``write``, or the error its own route would answer first."""
        method = write.method
        if method in OPTIONAL_METHODS and method not in self.capabilities:
            return _ApiError(501, "unsupported", f"the backing store does not implement {method}")
        if isinstance(write, PatchMetaWrite):
            both = sorted(set(write.set) & set(write.remove))
            if both:
                return _ApiError(
                    409, "conflicting_patch", f"keys both set and removed: {both}", "$.remove"
                )
        args, kwargs = write.store_call()
        return StoreWrite(method, args, kwargs)

    async def _apply(self, writes: list[StoreWrite]) -> list[outcome.Outcome[Any]]:
        if not writes:
            return []
        if isinstance(self.store, BatchingStore):
            try:
                return await self.store.apply_writes(writes)
            except Exception as exc:  # the commit failed: every write shares its error
                return [outcome.Error(exc) for _ in writes]
        results: list[outcome.Outcome[Any]] = []
        for write in writes:
            method: Callable[..., Awaitable[Any]] = getattr(self.writer, write.method)
            try:
                results.append(outcome.Value(await method(*write.args, **write.kwargs)))
            except Exception as exc:  # a cancellation is not an outcome: it propagates
                results.append(outcome.Error(exc))
        return results

    def _outcome(self, write: AnyWrite, result: outcome.Outcome[Any] | _ApiError) -> WriteOutcome:
        if isinstance(result, outcome.Value):
            if isinstance(write, UpsertArtifactWrite):
                return WriteOutcome(status=200, artifact=result.value)
            if type(result.value) is Revision:
                revision = RevisionBody(before=result.value.before, after=result.value.after)
                return WriteOutcome(status=204, revision=revision)
            return WriteOutcome(status=204)
        if isinstance(result, _ApiError):
            error = result
        else:
            assert isinstance(result, outcome.Error)
            error = _mapped(result.error)
            if _worth_a_traceback(error):
                _log.error("POST /writes: %s failed", type(write).__name__, exc_info=result.error)
        detail = ErrorDetail(code=error.code, message=error.message, path=error.path)
        return WriteOutcome(status=error.status, error=detail)


def _write_session(write: AnyWrite) -> str:
    """The session ``write`` touches."""
    if isinstance(write, (SaveWrite, SaveMetaWrite)):
        return write.session.id
    if isinstance(write, UpsertArtifactWrite):
        return write.artifact.session_id
    return write.session_id


def _check_write_ids(write: AnyWrite, where: str) -> None:
    """Every id of ``write`` is a safe id (``InvalidNameError`` naming it otherwise)."""
    ids: list[tuple[str, str]] = []
    if isinstance(write, (SaveWrite, SaveMetaWrite)):
        ids.append((write.session.id, "session.id"))
        ids += [(t.id, f"session.turns[{k}].id") for k, t in enumerate(write.session.turns)]
        ids += [(r.id, f"session.runs[{k}].id") for k, r in enumerate(write.session.runs)]
    elif isinstance(write, UpsertArtifactWrite):
        ids += [
            (write.artifact.session_id, "artifact.sessionId"),
            (write.artifact.id, "artifact.id"),
        ]
    else:
        ids.append((write.session_id, "sessionId"))
    if isinstance(write, AppendTurnsWrite):
        ids += [(t.id, f"turns[{k}].id") for k, t in enumerate(write.turns)]
        if write.options is not None and write.options.run is not None:
            ids.append((write.options.run.id, "options.run.id"))
    elif isinstance(write, UpdateRunWrite):
        ids.append((write.run.id, "run.id"))
    elif isinstance(write, SettleSendRequestWrite):  # a client's key, any text: never a path
        validate_request_id(write.request_id, what=f"{where}.requestId")
    elif isinstance(write, DeleteArtifactWrite):
        ids.append((write.artifact_id, "artifactId"))
    for value, field in ids:
        validate_id(value, what=f"{where}.{field}")
