"""A ``SessionStore`` that talks to the REST session API (``zidane_actors.server``).

Idempotent calls (GET, PUT, PATCH, DELETE and the turn append, which the
server deduplicates by turn id) are retried with exponential backoff and
jitter on transport errors, timeouts and 5xx answers. Claims are never
retried: a lost answer to a claim cannot be told apart from a lost race.
"""

from __future__ import annotations

import builtins
import functools
import math
import random
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import attrs
import httpx
import msgspec
import outcome
import trio

from ... import model
from ...errors import (
    ConflictError,
    InvalidNameError,
    RemoteStoreError,
    SessionNotFoundError,
    StaleSessionError,
    StoreClosedError,
    StoreUnavailableError,
    UnsupportedOperationError,
    ValidationError,
)
from ...model import (
    RunOwner,
    Schedule,
    ScheduleFire,
    SendRequestRecord,
    SessionArtifact,
    SessionData,
    SessionFilter,
    SessionMetaRow,
    SessionSearchPage,
    SessionTurn,
    check_model,
    current_run_owner,
    decode,
    decoder,
    preview,
)
from .._edits import TurnsEdits
from .._protocol import (
    HistoryMutation,
    MutateResult,
    Revision,
    RunClaim,
    StoreWrite,
)
from .._validate import (
    check_fire_ids,
    checked,
    checked_int,
)
from . import _bodies
from ._requests import (
    BATCH_BYTES,
    DEFAULT_MAX_ANSWER_BYTES,
    append_turns_write,
    artifact_params,
    checked_filter,
    delete_artifact_write,
    delete_write,
    encode_write,
    encoded_body,
    filter_params,
    patch_meta_write,
    request_seg,
    same_id,
    save_meta_write,
    save_write,
    seg,
    settle_send_request_write,
    too_big,
    typed,
    typed_or_none,
    update_run_write,
    update_status_write,
    upsert_artifact_write,
    with_query,
)

__all__ = [
    "RemoteStore",
    "RemoteStoreStatistics",
    "create_remote_store",
]

T = TypeVar("T")

# Server faults only: a 4xx says the request itself is wrong (or refused) and is final.
_RETRY_STATUSES: Final = frozenset({500, 502, 503, 504})
_BACKOFF_BASE_S: Final = 0.05
_BACKOFF_CAP_S: Final = 2.0
_RETRY_AFTER_CAP_S: Final = 10.0
_HISTORY_ATTEMPTS: Final = 8


def _backoff(attempt: int) -> float:
    """Full-jitter exponential backoff: uniform in ``[0, min(cap, base * 2**attempt)]``."""
    return random.uniform(0, min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2**attempt))


def _retry_after(response: httpx.Response) -> float:
    """The delay a 503 asks for (``Retry-After`` in seconds, capped), else 0."""
    raw = response.headers.get("retry-after", "")
    return min(float(raw), _RETRY_AFTER_CAP_S) if raw.isascii() and raw.isdigit() else 0.0


def _if_match(expected_rev: int | None) -> dict[str, str] | None:
    return None if expected_rev is None else {_bodies.IF_MATCH_HEADER: f'"{expected_rev}"'}


def _revision(response: httpx.Response | None) -> Revision | None:
    """A write answer's revision headers, or ``None`` (a store keeping no versions)."""
    if response is None:
        return None
    before = response.headers.get(_bodies.REV_BEFORE_HEADER)
    after = response.headers.get(_bodies.REV_AFTER_HEADER)
    if before is None or after is None:
        return None
    try:
        return Revision(int(before), int(after))
    except ValueError:
        raise RemoteStoreError(
            f"the server answered bad revision headers {preview(before)}, {preview(after)}",
            status=response.status_code,
        ) from None


@attrs.frozen
class RemoteStoreStatistics:
    """What :meth:`RemoteStore.statistics` answers."""

    requests: int
    """HTTP attempts sent (each retry counts)."""
    retries: int
    """Attempts that repeated an earlier one."""
    timeouts: int
    """Attempts that ran past ``timeout_ms``."""


@attrs.define(eq=False)
class RemoteStore(TurnsEdits):
    """A ``SessionStore`` over HTTP; every optional method maps to a route.

    A route the server's backing store lacks answers 501, raised here as
    :class:`~zidane_actors.errors.UnsupportedOperationError`; call
    :meth:`capabilities` to learn the server's set up front.
    """

    url: str
    _client: httpx.AsyncClient
    timeout_ms: int
    retries: int
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES
    _closed: bool = attrs.field(default=False, init=False)
    _n_requests: int = attrs.field(default=0, init=False)
    _n_retries: int = attrs.field(default=0, init=False)
    _n_timeouts: int = attrs.field(default=0, init=False)

    def statistics(self) -> RemoteStoreStatistics:
        """Counts of HTTP attempts, retries and timed-out attempts so far."""
        return RemoteStoreStatistics(
            requests=self._n_requests, retries=self._n_retries, timeouts=self._n_timeouts
        )

    async def __aenter__(self) -> RemoteStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP connection pool; later calls raise ``StoreClosedError``."""
        self._closed = True
        await self._client.aclose()

    # -- transport -------------------------------------------------------

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        params: Mapping[str, str] | None = None,
        retry: bool,
        ok_missing: bool = False,
        expect: tuple[int, ...] = (),
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response | None:
        """Send one call (retried when ``retry``); ``None`` for a 404 when ``ok_missing``.

        ``body`` is a model value, or ``bytes`` already encoded and checked. Statuses in
        ``expect`` are returned as is for the caller to read.
        """
        if self._closed:
            raise StoreClosedError(f"remote store {self.url} is closed")
        content = body if isinstance(body, bytes) else encoded_body(body, f"{method} {path}")
        sent = dict(headers or {})
        if content is not None:
            sent["content-type"] = "application/json"
        attempts = self.retries + 1 if retry else 1
        last: Exception | None = None
        wait_s = 0.0
        for attempt in range(attempts):
            if attempt:
                self._n_retries += 1
                await trio.sleep(wait_s + _backoff(attempt))
            self._n_requests += 1
            try:
                with trio.fail_after(self.timeout_ms / 1000):
                    request = self._client.build_request(
                        method, with_query(path, params), content=content, headers=sent or None
                    )
                    response = await self._read(request, f"{method} {path}")
            except (httpx.TransportError, trio.TooSlowError) as exc:
                if isinstance(exc, (httpx.TimeoutException, trio.TooSlowError)):
                    self._n_timeouts += 1
                last = exc
                wait_s = 0.0
                continue
            if response.status_code in _RETRY_STATUSES and attempt + 1 < attempts:
                last = _error(response, method, path)
                wait_s = _retry_after(response)
                continue
            if response.is_success or response.status_code in expect:
                return response
            if response.status_code == 404 and ok_missing:
                return None
            raise _error(response, method, path)
        if isinstance(last, (httpx.TransportError, trio.TooSlowError)):
            what = (
                "timed out"
                if isinstance(last, (httpx.TimeoutException, trio.TooSlowError))
                else str(last) or type(last).__name__
            )
            raise StoreUnavailableError(
                f"{method} {self.url}{path} failed after {attempts} attempt(s): {what}"
            ) from last
        assert last is not None
        raise last

    async def _read(self, request: httpx.Request, what: str) -> httpx.Response:
        """Send ``request`` and read its answer, refusing one over ``max_answer_bytes``."""
        limit = self.max_answer_bytes
        streamed = await self._client.send(request, stream=True)
        try:
            declared = streamed.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise too_big(self.url, what, limit)
            chunks: list[bytes] = []
            size = 0
            async for chunk in streamed.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise too_big(self.url, what, limit)
                chunks.append(chunk)
        finally:
            await streamed.aclose()
        return httpx.Response(
            streamed.status_code,
            headers=streamed.headers,
            content=b"".join(chunks),
            request=request,
        )

    async def _json(
        self,
        type_: type[T],
        method: str,
        path: str,
        *,
        body: object = None,
        params: Mapping[str, str] | None = None,
        retry: bool,
    ) -> T:
        response = await self._request(method, path, body=body, params=params, retry=retry)
        assert response is not None
        return decode(response.content, type_, what=f"answer of {method} {path}")

    async def _found(
        self, path: str, type_: type[T], asked: str = "", key: Callable[[T], str] | None = None
    ) -> T | None:
        """``GET path``'s answer as ``type_``, or ``None`` when the server has no such record;
        with ``key``, an answer about another record than ``asked`` is refused."""
        response = await self._request("GET", path, retry=True, ok_missing=True)
        if response is None:
            return None
        found = decode(response.content, type_, what=f"answer of GET {path}")
        if key is not None:
            same_id(key(found), asked, f"GET {path}")
        return found

    # -- required methods ------------------------------------------------

    async def capabilities(self) -> frozenset[str]:
        """The optional methods the server's backing store implements."""
        response = await self._request("GET", "/capabilities", retry=True)
        assert response is not None
        return frozenset(decode(response.content, tuple[str, ...], what="capabilities"))

    async def load(self, session_id: str) -> SessionData | None:
        """The session, or ``None`` when the server has none with that id."""
        path = f"/sessions/{seg(session_id, 'session id')}"
        return await self._found(path, SessionData, session_id, lambda data: data.id)

    async def load_versioned(self, session_id: str) -> tuple[SessionData, int] | None:
        """The session and the ``rev`` the server read it at, or ``None``.

        Raises :class:`UnsupportedOperationError` when the server's store keeps no versions.
        """
        path = f"/sessions/{seg(session_id, 'session id')}"
        response = await self._request("GET", path, retry=True, ok_missing=True)
        if response is None:
            return None
        rev = response.headers.get(_bodies.REV_HEADER)
        if rev is None or not rev.isdigit():
            raise UnsupportedOperationError(f"GET {path}: the server's store keeps no versions")
        data = decode(response.content, SessionData, what=f"answer of GET {path}")
        same_id(data.id, session_id, f"GET {path}")
        return data, int(rev)

    async def get_rev(self, session_id: str) -> int | None:
        """The session's ``rev`` (``GET /sessions/{id}/rev``), or ``None`` when absent."""
        found = await self._found(
            f"/sessions/{seg(session_id, 'session id')}/rev", _bodies.RevResult
        )
        return None if found is None else found.rev

    async def save(self, data: SessionData, *, expected_rev: int | None = None) -> Revision | None:
        """Create or overwrite the whole document (``PUT /sessions/{id}``).

        With ``expected_rev``, only while the session is at that ``rev``.
        """
        write = save_write(data)
        path = f"/sessions/{write.session.id}"
        try:
            response = await self._request(
                "PUT", path, body=write.session, retry=True, headers=_if_match(expected_rev)
            )
        except StaleSessionError as exc:
            raise _with_expected(exc, expected_rev) from None
        return _revision(response)

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[SessionTurn],
        options: model.AppendTurnsOptions | None = None,
    ) -> Revision | None:
        """Append turns; a stored identical turn is skipped, so a retry never duplicates."""
        write = append_turns_write(session_id, turns, options)
        body = _bodies.AppendTurnsBody(turns=write.turns, options=write.options)
        return _revision(
            await self._request(
                "POST", f"/sessions/{write.session_id}/turns", body=body, retry=True
            )
        )

    async def get_turns(
        self, session_id: str, from_: int = 0, limit: int | None = None
    ) -> builtins.list[SessionTurn]:
        """A slice of a session's turns, oldest first."""
        params = {"from": str(checked_int(from_, "from_"))}
        if limit is not None:
            params["limit"] = str(checked_int(limit, "limit"))
        turns = await self._json(
            tuple[SessionTurn, ...],
            "GET",
            f"/sessions/{seg(session_id, 'session id')}/turns",
            params=params,
            retry=True,
        )
        return builtins.list(turns)

    async def load_model_view(self, session_id: str) -> builtins.list[SessionTurn] | None:
        """``model_view`` of the session's stored turns, read by the server from the latest
        compaction on (``GET /sessions/{id}/model-view``); ``None`` when absent."""
        path = f"/sessions/{seg(session_id, 'session id')}/model-view"
        found = await self._found(path, tuple[SessionTurn, ...])
        return None if found is None else builtins.list(found)

    async def update_run(
        self, session_id: str, run: model.SessionRun, options: model.UpdateRunOptions | None = None
    ) -> Revision | None:
        """Upsert one run record (``PUT /sessions/{id}/runs/{runId}``)."""
        write = update_run_write(session_id, run, options)
        path = f"/sessions/{write.session_id}/runs/{write.run.id}"
        body = _bodies.UpdateRunBody(run=write.run, options=write.options)
        return _revision(await self._request("PUT", path, body=body, retry=True))

    async def update_status(
        self,
        session_id: str,
        status: model.SessionStatus,
        *,
        owner: RunOwner | None = None,
        preserve_updated_at: bool = False,
    ) -> Revision | None:
        """Set the status; ``running`` records ``owner`` (default: this client process)."""
        write = update_status_write(
            session_id, status, owner=owner, preserve_updated_at=preserve_updated_at
        )
        body = _bodies.UpdateStatusBody(
            status=write.status, owner=write.owner, preserve_updated_at=write.preserve_updated_at
        )
        return _revision(
            await self._request(
                "PUT", f"/sessions/{write.session_id}/status", body=body, retry=True
            )
        )

    async def delete(self, session_id: str) -> None:
        """Delete a session (``DELETE /sessions/{id}``)."""
        await self._request(
            "DELETE", f"/sessions/{delete_write(session_id).session_id}", retry=True
        )

    async def list(self, filter: SessionFilter | None = None) -> builtins.list[str]:
        """Session ids, most recently updated first, filtered."""
        params = filter_params(typed_or_none(filter, SessionFilter, "filter"))
        result = await self._json(_bodies.IdsResult, "GET", "/sessions", params=params, retry=True)
        return builtins.list(result.ids)

    # -- optional methods ------------------------------------------------

    async def claim_run(
        self, session_id: str, *, stale_at: int, owner: RunOwner | None = None
    ) -> RunClaim:
        """Claim the session for a run on the server, atomically (never retried)."""
        owner = typed_or_none(owner, RunOwner, "owner")
        stale_at = checked_int(stale_at, "stale_at")
        body = _bodies.ClaimRunBody(stale_at=stale_at, owner=owner or current_run_owner())
        result = await self._json(
            _bodies.ClaimRunResult,
            "POST",
            f"/sessions/{seg(session_id, 'session id')}/claim-run",
            body=body,
            retry=False,
        )
        return RunClaim(claimed=result.claimed, previous=result.previous)

    async def demote_stale_run(self, session_id: str, *, stale_at: int, now: int) -> bool:
        """Persist a load's stale-running demotion on the server, only if still stale.

        Retried: a repeat finds the marker demoted already (or held) and writes nothing.
        """
        result = await self._json(
            _bodies.DemotedResult,
            "POST",
            f"/sessions/{seg(session_id, 'session id')}/demote-stale-run",
            body=_bodies.DemoteStaleRunBody(
                stale_at=checked_int(stale_at, "stale_at"), now=checked_int(now, "now")
            ),
            retry=True,
        )
        return result.demoted

    async def claim_schedule_fire(self, id: str, due_at: int, next: int | None) -> bool:
        """Take the fire due at ``due_at`` once across every host (never retried)."""
        result = await self._json(
            _bodies.ClaimedResult,
            "POST",
            f"/schedules/{seg(id, 'schedule id')}/claim-fire",
            body=_bodies.ClaimFireBody(due_at=due_at, next=next),
            retry=False,
        )
        return result.claimed

    async def claim_send_request(
        self, session_id: str, request_id: str, fingerprint: str
    ) -> model.SendRequestClaim:
        """Claim a request id atomically on the server (never retried)."""
        path = (
            f"/sessions/{seg(session_id, 'session id')}"
            f"/send-requests/{request_seg(request_id)}/claim"
        )
        return await self._json(
            model.SendRequestClaim,
            "POST",
            path,
            body=_bodies.ClaimSendRequestBody(fingerprint=fingerprint),
            retry=False,
        )

    async def delete_artifact(self, session_id: str, artifact_id: str) -> None:
        """Remove one artifact; unknown ids are a no-op."""
        write = delete_artifact_write(session_id, artifact_id)
        path = f"/sessions/{write.session_id}/artifacts/{write.artifact_id}"
        await self._request("DELETE", path, retry=True)

    async def delete_schedule(self, id: str) -> bool:
        """Remove a schedule and its fires; ``False`` when it was gone."""
        result = await self._json(
            _bodies.DeletedResult, "DELETE", f"/schedules/{seg(id, 'schedule id')}", retry=True
        )
        return result.deleted

    async def find_send_request(self, session_id: str, request_id: str) -> SendRequestRecord | None:
        """The record of a claimed request id, or ``None``."""
        path = f"/sessions/{seg(session_id, 'session id')}/send-requests/{request_seg(request_id)}"
        return await self._found(path, SendRequestRecord, request_id, lambda r: r.request_id)

    async def list_send_requests(self, session_id: str) -> builtins.list[SendRequestRecord]:
        """Every request id the session holds, oldest claim first."""
        path = f"/sessions/{seg(session_id, 'session id')}/send-requests"
        return await self._json(builtins.list[SendRequestRecord], "GET", path, retry=True)

    async def put_send_request(self, session_id: str, record: SendRequestRecord) -> None:
        """Store ``record`` exactly as given (idempotent, so retried)."""
        record = checked(record, SendRequestRecord, "send request")
        path = (
            f"/sessions/{seg(session_id, 'session id')}"
            f"/send-requests/{request_seg(record.request_id)}"
        )
        await self._request("PUT", path, body=record, retry=True)

    async def fork_session(
        self,
        source_id: str,
        new_id: str,
        *,
        at: str | None,
        created_at: int,
        expected_rev: int | None = None,
    ) -> Revision | None:
        """Create ``new_id`` as the fork of ``source_id`` (``POST /sessions/{id}/forks``).

        Sent once (a retry of a fork that was made would conflict with it).
        """
        seg(new_id, "session id")
        path = f"/sessions/{seg(source_id, 'session id')}/forks"
        body = _bodies.ForkBody(at=at, id=new_id, expected_rev=expected_rev, created_at=created_at)
        try:
            response = await self._request("POST", path, body=body, retry=False)
        except StaleSessionError as exc:
            raise _with_expected(exc, expected_rev) from None
        assert response is not None
        made = decode(response.content, _bodies.IdResult, what=f"answer of POST {path}")
        same_id(made.id, new_id, f"POST {path}")
        return _revision(response)

    async def list_forks(self, source_id: str) -> builtins.list[str]:
        """The direct forks of ``source_id``, sorted (``GET /sessions/{id}/forks``)."""
        path = f"/sessions/{seg(source_id, 'session id')}/forks"
        found = await self._json(_bodies.IdsResult, "GET", path, retry=True)
        return builtins.list(found.ids)

    async def generate_session_id(self) -> str:
        """A new session id issued by the server's store."""
        return (await self._json(_bodies.IdResult, "POST", "/session-ids", retry=True)).id

    async def generate_turn_id(self) -> str:
        """A new turn id issued by the server's store."""
        return (await self._json(_bodies.IdResult, "POST", "/turn-ids", retry=True)).id

    async def get_meta(self, session_id: str) -> SessionMetaRow | None:
        """One session's header row, or ``None``."""
        path = f"/sessions/{seg(session_id, 'session id')}/meta"
        return await self._found(path, SessionMetaRow, session_id, lambda row: row.id)

    async def list_artifacts(
        self, filter: model.ArtifactFilter | None = None
    ) -> builtins.list[SessionArtifact]:
        """Artifacts, newest ``updatedAt`` first, filtered."""
        result = await self._json(
            tuple[SessionArtifact, ...],
            "GET",
            "/artifacts",
            params=artifact_params(checked_filter(filter)),
            retry=True,
        )
        return builtins.list(result)

    async def list_meta(self, filter: SessionFilter | None = None) -> builtins.list[SessionMetaRow]:
        """Session summaries, most recently updated first, filtered like ``list``."""
        result = await self._json(
            tuple[SessionMetaRow, ...],
            "GET",
            "/session-meta",
            params=filter_params(typed_or_none(filter, SessionFilter, "filter")),
            retry=True,
        )
        return builtins.list(result)

    async def search_meta(self, search: model.SessionSearch) -> SessionSearchPage:
        """Sessions matching ``search``, as the server's store answers ``GET /session-search``."""
        search = typed(search, model.SessionSearch, "search")
        fields = msgspec.to_builtins(search)
        params = {k: str(v) for k, v in fields.items() if k != "projectRoot"}
        if "projectRoot" in fields:
            root = fields["projectRoot"]
            params["projectRoot" if root is not None else "untaggedOnly"] = root or "true"
        result: SessionSearchPage = await self._json(
            SessionSearchPage, "GET", "/session-search", params=params, retry=True
        )
        return result

    async def list_schedule_fires(
        self, schedule_id: str, limit: int
    ) -> builtins.list[ScheduleFire]:
        """A schedule's fires, newest first."""
        result = await self._json(
            tuple[ScheduleFire, ...],
            "GET",
            f"/schedules/{seg(schedule_id, 'schedule id')}/fires",
            params={"limit": str(checked_int(limit, "limit"))},
            retry=True,
        )
        return builtins.list(result)

    async def list_schedules(self) -> builtins.list[Schedule]:
        """Every schedule with its last fire, oldest first."""
        result = await self._json(tuple[Schedule, ...], "GET", "/schedules", retry=True)
        return builtins.list(result)

    async def _history(self, session_id: str) -> _bodies.HistoryState | None:
        path = f"/sessions/{seg(session_id, 'session id')}/history"
        return await self._found(path, _bodies.HistoryState)

    async def _edit_history(
        self, session_id: str, mutate: HistoryMutation, runs_too: bool, expected_rev: int | None
    ) -> tuple[MutateResult, Revision | None]:
        """Read → ``mutate`` → write guarded by the history's revision, retried on conflict.

        The server compares the revision inside its store's atomic
        ``mutate_history``, so a turn appended between the read and the
        write is never erased: the write loses with 409 and this reads again.
        With ``expected_rev`` the write also needs the session at that
        ``rev`` (``StaleSessionError`` otherwise, never retried here). A
        turns-only edit answers the runs it was given, so they are kept.
        """
        path = f"/sessions/{seg(session_id, 'session id')}/history"
        for _ in range(_HISTORY_ATTEMPTS):
            state = await self._history(session_id)
            if state is None:
                return "no-session", None
            nxt = mutate(state.history)
            if nxt is None:
                return "unchanged", None
            check_model(nxt, what="history")
            # An identical history is still written ("ok"), as every store answers.
            target = _bodies.history_rev(nxt)
            body = _bodies.HistoryBody(history=nxt, expected_rev=state.rev)
            response = await self._request(
                "PUT", path, body=body, retry=True, expect=(409,), headers=_if_match(expected_rev)
            )
            assert response is not None
            if response.status_code == 409 and _stale_answer(response):
                raise _with_expected(_error(response, "PUT", path), expected_rev)
            if response.status_code != 409:
                result = decode(
                    response.content, _bodies.HistoryResult, what=f"answer of PUT {path}"
                )
                return result.result, _revision(response)
            # Lost the race — unless a retried attempt already wrote this very history.
            current = await self._history(session_id)
            if current is not None and current.rev == target:
                return "ok", None
        raise ConflictError(
            f"history of session {preview(session_id)} kept changing: "
            f"gave up after {_HISTORY_ATTEMPTS} attempts"
        )

    async def patch_meta(
        self, session_id: str, patch: Mapping[str, model.JsonValue]
    ) -> Revision | None:
        """Merge ``patch`` into stored metadata (``msgspec.UNSET`` removes a key)."""
        write = patch_meta_write(session_id, patch)
        body = _bodies.PatchMetaBody(set=write.set, remove=write.remove)
        return _revision(
            await self._request(
                "PATCH", f"/sessions/{write.session_id}/meta", body=body, retry=True
            )
        )

    async def record_schedule_fire(self, fire: ScheduleFire) -> None:
        """Store a fire (``POST``, not retried: a repeat would be a second fire)."""
        fire = typed(fire, ScheduleFire, "fire")
        check_fire_ids(fire)
        await self._request(
            "POST",
            f"/schedules/{seg(fire.schedule_id, 'schedule id')}/fires",
            body=fire,
            retry=False,
        )

    async def save_meta(
        self,
        data: SessionData,
        options: model.SaveMetaOptions | None = None,
        *,
        expected_rev: int | None = None,
    ) -> Revision | None:
        """Persist the header and upsert the snapshot's runs; never deletes turns.

        With ``expected_rev``, only while the session is at that ``rev``.
        """
        write = save_meta_write(data, options)
        try:
            response = await self._request(
                "PUT",
                f"/sessions/{write.session.id}/meta",
                body=_bodies.SaveMetaBody(session=write.session, options=write.options),
                retry=True,
                headers=_if_match(expected_rev),
            )
        except StaleSessionError as exc:
            raise _with_expected(exc, expected_rev) from None
        return _revision(response)

    async def save_schedule(self, schedule: Schedule, *, keep_next_fire_at: bool = False) -> None:
        """Create or replace a schedule."""
        schedule = typed(schedule, Schedule, "schedule")
        params = {"keepNextFireAt": "true"} if keep_next_fire_at else None
        await self._request(
            "PUT",
            f"/schedules/{seg(schedule.id, 'schedule id')}",
            body=schedule,
            params=params,
            retry=True,
        )

    async def settle_send_request(
        self, session_id: str, request_id: str, result: model.JsonValue
    ) -> None:
        """Store a claimed send's result; ``None`` drops the claim."""
        write = settle_send_request_write(session_id, request_id, result)
        path = f"/sessions/{write.session_id}/send-requests/{request_seg(write.request_id)}/result"
        body = _bodies.SettleSendRequestBody(result=write.result)
        await self._request("PUT", path, body=body, retry=True)

    async def upsert_artifact(self, artifact: SessionArtifact) -> SessionArtifact | None:
        """Upsert on ``(sessionId, kind, uri)``; ``None`` for an unknown session."""
        write = upsert_artifact_write(artifact)
        path = f"/sessions/{write.artifact.session_id}/artifacts"
        result = await self._json(
            _bodies.UpsertArtifactResult, "PUT", path, body=write.artifact, retry=True
        )
        return result.artifact

    # -- group commit ----------------------------------------------------

    async def apply_writes(
        self, writes: Sequence[StoreWrite]
    ) -> builtins.list[outcome.Outcome[Any]]:
        """Send ``writes`` in as few ``POST /writes`` as fit; one outcome per write, in order.

        The server applies each request's writes in order, in one transaction
        when its store can (``BatchingStore``). A write refused here (a bad
        argument) or there answers its own error; a request that fails whole
        (after its retries: every write is idempotent) answers that error for
        each of its writes.
        """
        results: builtins.list[outcome.Outcome[Any] | None] = [None] * len(writes)
        chunk: builtins.list[tuple[int, bytes]] = []
        size = 0
        for i, write in enumerate(writes):
            try:
                encoded = encode_write(write)
            except Exception as exc:
                results[i] = outcome.Error(exc)
                continue
            if chunk and (
                len(chunk) == _bodies.MAX_BATCH_WRITES or size + len(encoded) > BATCH_BYTES
            ):
                await self._send_writes(chunk, writes, results)
                chunk, size = [], 0
            chunk.append((i, encoded))
            size += len(encoded) + 1
        if chunk:
            await self._send_writes(chunk, writes, results)
        return [r for r in results if r is not None]

    async def _send_writes(
        self,
        chunk: Sequence[tuple[int, bytes]],
        writes: Sequence[StoreWrite],
        results: builtins.list[outcome.Outcome[Any] | None],
    ) -> None:
        """One ``POST /writes`` of the encoded writes in ``chunk``; fills their ``results``."""
        content = b'{"writes":[' + b",".join(encoded for _, encoded in chunk) + b"]}"
        try:
            answer = await self._json(
                _bodies.WritesResult, "POST", "/writes", body=content, retry=True
            )
            if len(answer.outcomes) != len(chunk):
                got = len(answer.outcomes)
                raise RemoteStoreError(
                    f"POST /writes answered {got} outcomes for {len(chunk)} writes", status=200
                )
        except Exception as exc:
            for i, _ in chunk:
                results[i] = outcome.Error(exc)
            return
        for (i, _), done in zip(chunk, answer.outcomes, strict=True):
            if done.error is None and 200 <= done.status < 300:
                value: Any = done.artifact if writes[i].method == "upsert_artifact" else None
                if done.revision is not None:
                    value = Revision(done.revision.before, done.revision.after)
                results[i] = outcome.Value(value)
            else:
                where = f"POST /writes ({writes[i].method})"
                error = _error_of(done.status, done.error, "", where)
                expected = writes[i].kwargs.get("expected_rev")
                results[i] = outcome.Error(_with_expected(error, expected))


def _with_expected(exc: Exception, expected_rev: object) -> Exception:
    """A stale answer's error naming the rev the write expected (the server's message says more)."""
    if isinstance(exc, StaleSessionError) and isinstance(expected_rev, int):
        return StaleSessionError(str(exc), expected=expected_rev, actual=None)
    return exc


def _stale_answer(response: httpx.Response) -> bool:
    try:
        detail = msgspec.json.decode(response.content, type=_bodies.ErrorBody).error
    except msgspec.MsgspecError:
        return False
    return detail.code == "stale_session"


def _error(response: httpx.Response, method: str, path: str) -> Exception:
    """The library exception for an error answer."""
    detail: _bodies.ErrorDetail | None
    try:
        detail = decoder(_bodies.ErrorBody).decode(response.content).error
    except msgspec.MsgspecError:
        detail = None
    text = response.text[:200] or response.reason_phrase
    return _error_of(response.status_code, detail, text, f"{method} {path}")


def _error_of(status: int, detail: _bodies.ErrorDetail | None, text: str, where: str) -> Exception:
    """The library exception for an error ``status`` with the API's ``detail`` (or ``text``)."""
    message = detail.message if detail else text
    code = detail.code if detail else None
    if status == 404 and code == "session_not_found":
        return SessionNotFoundError(message)
    if status == 409 and code == "stale_session":
        return StaleSessionError(message, expected=None, actual=None)
    if status == 409:
        return ConflictError(message)
    if status == 400 and code == "invalid_name":
        return InvalidNameError(message)
    if status in (400, 413, 422):
        return ValidationError(f"{where} rejected: {message}", path=detail.path if detail else None)
    if status == 501:
        return UnsupportedOperationError(message)
    if status in (502, 503, 504):
        return StoreUnavailableError(f"{where}: {message} (HTTP {status})")
    return RemoteStoreError(f"{where}: {message}", status=status, code=code)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default TLS context, built once: loading the CA bundle costs ~0.1 s of CPU,
    which every client would otherwise pay (even over plain http)."""
    return httpx.create_ssl_context()


def _number(value: object) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def create_remote_store(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout_ms: int = 30_000,
    retries: int = 3,
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
) -> RemoteStore:
    """A store over the REST session API at ``url``.

    ``headers`` go with every request (e.g. ``{"authorization": "Bearer …"}``);
    ``timeout_ms`` bounds each attempt; ``retries`` is how many times an
    idempotent call is repeated after a transport error, timeout or 5xx;
    an answer over ``max_answer_bytes`` is refused (:class:`StoreError`)
    instead of read whole.
    """
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValidationError(
            f"remote store url must start with http:// or https://, got {preview(url)}"
        )
    if not _number(timeout_ms) or timeout_ms <= 0:
        raise ValidationError(f"timeout_ms must be a positive number, got {preview(timeout_ms)}")
    if type(retries) is not int or retries < 0:
        raise ValidationError(f"retries must be an integer >= 0, got {preview(retries)}")
    if type(max_answer_bytes) is not int or max_answer_bytes <= 0:
        raise ValidationError(
            f"max_answer_bytes must be a positive integer, got {preview(max_answer_bytes)}"
        )
    base = url.rstrip("/")
    client = httpx.AsyncClient(
        base_url=base,
        headers=dict(headers or {}),
        timeout=timeout_ms / 1000,
        verify=_tls_context(),
    )
    return RemoteStore(
        url=base,
        client=client,
        timeout_ms=timeout_ms,
        retries=retries,
        max_answer_bytes=max_answer_bytes,
    )
