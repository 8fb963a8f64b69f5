"""The in-memory store: every ``SessionStore`` method, nothing persisted.

It is the reference implementation of the store contract: each method is
one synchronous step between two checkpoints, so every write is atomic and
a failing write changes nothing. Values are validated on the way in (the
same JSON round trip a persistent store performs) and copied on the way
out, so a caller mutating a returned dict cannot reach the stored state.
"""

from __future__ import annotations

import builtins
import functools
import itertools
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar

import msgspec
import outcome
import trio

from .. import model
from ..errors import (
    ConflictError,
    SessionNotFoundError,
    StoreClosedError,
)
from ..model import (
    AppendTurnsOptions,
    JsonValue,
    RunOwner,
    SaveMetaOptions,
    Schedule,
    ScheduleFire,
    SendRequestClaim,
    SendRequestRecord,
    SessionArtifact,
    SessionData,
    SessionFilter,
    SessionHistory,
    SessionMetaRow,
    SessionRun,
    SessionSearch,
    SessionSearchPage,
    SessionTurn,
    UpdateRunOptions,
    check_fork_id,
    fork_document,
    forked_from,
    preview,
    search_page,
    upsert_runs,
    validate_id,
    validate_request_id,
)
from ..model._codec import encode_checked
from ..model._compaction import model_view
from ._edits import TurnsEdits
from ._protocol import (
    HistoryMutation,
    MutateResult,
    Revision,
    RunClaim,
    StoreWrite,
    stale,
    write_step,
)
from ._validate import (
    check_artifact_filter_ids,
    check_artifact_ids,
    check_fire_ids,
    check_ids,
    check_send_claim,
    checked,
    checked_append,
    checked_header,
    checked_int,
    checked_items,
    checked_meta_patch,
    checked_status,
    json_value,
    now_ms,
)

__all__ = ["MemoryStore", "create_memory_store", "open_memory_store"]

T = TypeVar("T")
P = ParamSpec("P")


def _copy(value: T, type_: type[T]) -> T:
    """A deep copy of a stored value (stored values are valid, so decoding cannot fail)."""
    key: Any = type_
    result: T = model.decoder(key).decode(encode_checked(value))
    return result


def _checked_optional_int(value: object, what: str) -> int | None:
    return None if value is None else checked_int(value, what)


def _entered(
    step: Callable[Concatenate[MemoryStore, P], T],
) -> Callable[Concatenate[MemoryStore, P], Coroutine[Any, Any, T]]:
    """The write method of ``step`` (``_name``, what ``apply_writes`` runs): one checkpoint,
    then the step, so each write is one atomic step between two checkpoints."""

    @functools.wraps(step)
    async def write(self: MemoryStore, /, *args: P.args, **kwargs: P.kwargs) -> T:
        await self._enter()
        return step(self, *args, **kwargs)

    write.__name__ = step.__name__.removeprefix("_")
    write.__qualname__ = f"MemoryStore.{write.__name__}"
    return write


class MemoryStore(TurnsEdits):
    """A :class:`~zidane_actors.stores.FullSessionStore` and ``BatchingStore`` kept in memory.

    Nothing survives the process. Every optional method is implemented, so
    it is the store the contract suite checks first and the default for
    tests and ephemeral sessions.
    """

    def __init__(self) -> None:
        self._closed = False
        self._sessions: dict[str, SessionData] = {}
        self._revs: dict[str, int] = {}
        # Per session: the turns tuple last indexed and its turns by id, so an append
        # checks ids in O(appended). Valid while the stored tuple is that very tuple
        # (every write that changes turns stores a new one).
        self._turn_index: dict[str, tuple[tuple[SessionTurn, ...], dict[str, SessionTurn]]] = {}
        self._rev_clock = itertools.count(1)
        self._artifacts: dict[str, dict[str, SessionArtifact]] = {}
        self._send_requests: dict[str, dict[str, SendRequestRecord]] = {}
        self._schedules: dict[str, Schedule] = {}
        self._fires: dict[str, builtins.list[ScheduleFire]] = {}

    # -- plumbing ---------------------------------------------------------------------------

    async def _enter(self) -> None:
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise StoreClosedError("the memory store is closed")

    def _write(self, data: SessionData) -> None:
        self._sessions[data.id] = data
        self._revs[data.id] = next(self._rev_clock)

    def _touch(self, session_id: str) -> None:
        self._revs[session_id] = next(self._rev_clock)

    def _rev(self, session_id: str) -> int:
        return self._revs.get(session_id, 0)

    def _expect(self, session_id: str, expected_rev: int | None) -> None:
        if expected_rev is not None and self._rev(session_id) != expected_rev:
            raise stale(session_id, expected_rev, self._rev(session_id))

    def _versioned(
        self, session_id: str, expected_rev: int | None, write: Callable[[], object]
    ) -> Revision:
        """``write()`` if the session is at ``expected_rev`` (when given); its revision."""
        before = self._rev(session_id)
        self._expect(session_id, expected_rev)
        write()
        return Revision(before, self._rev(session_id))

    # -- lifecycle --------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Drop every session; later calls raise :class:`StoreClosedError`. Idempotent."""
        await trio.lowlevel.checkpoint()
        self._closed = True
        self._sessions.clear()
        self._turn_index.clear()
        self._revs.clear()
        self._artifacts.clear()
        self._send_requests.clear()
        self._schedules.clear()
        self._fires.clear()

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` ran."""
        return self._closed

    async def apply_writes(
        self, writes: Sequence[StoreWrite]
    ) -> builtins.list[outcome.Outcome[Any]]:
        """Apply ``writes`` in order; one outcome per write, a failure touching only its own."""
        await self._enter()
        results: builtins.list[outcome.Outcome[Any]] = []
        for write in writes:
            results.append(outcome.capture(self._apply_write, write))
        return results

    def _apply_write(self, write: StoreWrite) -> Any:
        impl: Callable[..., Any] = write_step(write, lambda method: getattr(self, "_" + method))
        return impl(*write.args, **write.kwargs)

    # -- required methods -------------------------------------------------------------------

    async def load(self, session_id: str) -> SessionData | None:
        """The session, or ``None`` when the store has none with that id."""
        await self._enter()
        data = self._sessions.get(validate_id(session_id))
        return None if data is None else _copy(data, SessionData)

    async def load_versioned(self, session_id: str) -> tuple[SessionData, int] | None:
        """The session and its ``rev``, or ``None``."""
        await self._enter()
        data = self._sessions.get(validate_id(session_id))
        return None if data is None else (_copy(data, SessionData), self._revs[session_id])

    async def get_rev(self, session_id: str) -> int | None:
        """The session's ``rev``, or ``None`` when absent."""
        await self._enter()
        return self._revs.get(validate_id(session_id))

    def _save(self, data: SessionData, *, expected_rev: int | None = None) -> Revision:
        """Create or overwrite the whole document; ``running`` is never set by a snapshot."""
        data = checked_header(data)
        return self._versioned(data.id, expected_rev, lambda: self._save_checked(data))

    save = _entered(_save)

    def _save_checked(self, data: SessionData) -> None:
        stored = self._sessions.get(data.id)
        status, owner = model.snapshot_status(
            stored.status if stored else None, stored.run_owner if stored else None, data.status
        )
        metadata = model.merge_session_metadata(None, data.metadata, None)
        candidate = msgspec.structs.replace(data, metadata=metadata, status=status, run_owner=owner)
        valid = checked(candidate, SessionData, "session data")
        check_ids(valid.turns, valid.runs)
        self._write(valid)

    def _append_turns(
        self,
        session_id: str,
        turns: Sequence[SessionTurn],
        options: AppendTurnsOptions | None = None,
    ) -> Revision:
        """Append turns and upsert ``options.run`` in one write.

        Raises :class:`SessionNotFoundError` for a session never saved: an
        append must not create a header-less session. Empty ``turns`` with no
        run is a no-op.
        """
        before = self._rev(session_id)
        self._append_checked(session_id, turns, options)
        return Revision(before, self._rev(session_id))

    append_turns = _entered(_append_turns)

    def _append_checked(
        self,
        session_id: str,
        turns: Sequence[SessionTurn],
        options: AppendTurnsOptions | None = None,
    ) -> None:
        validate_id(session_id)
        new_turns, run = checked_append(turns, options)
        stored = self._sessions.get(session_id)
        if stored is None:
            raise SessionNotFoundError(
                f"cannot append turns to unknown session {preview(session_id)}"
            )
        index = self._turns_by_id(stored)
        if new_turns:
            new_turns = model.fresh_turns(session_id, new_turns, index)
        if not new_turns and run is None:
            return
        turns = stored.turns + new_turns
        self._write(
            msgspec.structs.replace(
                stored,
                turns=turns,
                runs=stored.runs if run is None else upsert_runs(stored.runs, (run,)),
                updated_at=now_ms(),
            )
        )
        index.update((t.id, t) for t in new_turns)
        self._turn_index[session_id] = (turns, index)

    def _turns_by_id(self, stored: SessionData) -> dict[str, SessionTurn]:
        """``stored``'s turns by id, rebuilt only when its turns were replaced."""
        entry = self._turn_index.get(stored.id)
        if entry is not None and entry[0] is stored.turns:
            return entry[1]
        index = {t.id: t for t in stored.turns}
        self._turn_index[stored.id] = (stored.turns, index)
        return index

    async def get_turns(
        self, session_id: str, from_: int = 0, limit: int | None = None
    ) -> builtins.list[SessionTurn]:
        """Turns ``from_`` up to ``from_ + limit``, oldest first; unknown sessions have none."""
        await self._enter()
        validate_id(session_id)
        start = checked_int(from_, "from_")
        count = _checked_optional_int(limit, "limit")
        stored = self._sessions.get(session_id)
        if stored is None:
            return []
        end = None if count is None else start + count
        return builtins.list(_copy(stored.turns[start:end], tuple[SessionTurn, ...]))

    async def load_model_view(self, session_id: str) -> builtins.list[SessionTurn] | None:
        """``model_view`` of the stored turns, or ``None`` when the store has no such session."""
        await self._enter()
        stored = self._sessions.get(validate_id(session_id))
        if stored is None:
            return None
        return builtins.list(_copy(tuple(model_view(stored.turns)), tuple[SessionTurn, ...]))

    def _update_run(
        self, session_id: str, run: SessionRun, options: UpdateRunOptions | None = None
    ) -> Revision:
        """Upsert one run record; an unknown session is a no-op (no ghost header)."""
        return self._versioned(
            session_id, None, lambda: self._update_run_checked(session_id, run, options)
        )

    update_run = _entered(_update_run)

    def _update_run_checked(
        self, session_id: str, run: SessionRun, options: UpdateRunOptions | None = None
    ) -> None:
        validate_id(session_id)
        valid = checked(run, SessionRun, "run")
        check_ids((), (valid,))
        if options is not None:
            checked(options, UpdateRunOptions, "update run options")
        stored = self._sessions.get(session_id)
        if stored is None:
            return
        self._write(
            msgspec.structs.replace(
                stored, runs=upsert_runs(stored.runs, (valid,)), updated_at=now_ms()
            )
        )

    def _update_status(
        self,
        session_id: str,
        status: model.SessionStatus,
        *,
        owner: RunOwner | None = None,
        preserve_updated_at: bool = False,
    ) -> Revision:
        """Set the status; ``running`` records ``owner`` (default: this process), others clear it.

        An unknown session is a no-op.
        """
        return self._versioned(
            session_id,
            None,
            lambda: self._update_status_checked(session_id, status, owner, preserve_updated_at),
        )

    update_status = _entered(_update_status)

    def _update_status_checked(
        self,
        session_id: str,
        status: model.SessionStatus,
        owner: RunOwner | None,
        preserve_updated_at: bool,
    ) -> None:
        validate_id(session_id)
        checked_status(status)
        if owner is not None:
            owner = checked(owner, RunOwner, "run owner")
        stored = self._sessions.get(session_id)
        if stored is None:
            return
        self._write(
            msgspec.structs.replace(
                stored,
                status=status,
                run_owner=(owner or model.current_run_owner()) if status == "running" else None,
                updated_at=stored.updated_at if preserve_updated_at else now_ms(),
            )
        )

    def _delete(self, session_id: str) -> None:
        """Delete a session with its artifacts and send-request ids; unknown ids are a no-op."""
        validate_id(session_id)
        self._sessions.pop(session_id, None)
        self._turn_index.pop(session_id, None)
        self._revs.pop(session_id, None)
        self._artifacts.pop(session_id, None)
        self._send_requests.pop(session_id, None)

    delete = _entered(_delete)

    async def fork_session(
        self,
        source_id: str,
        new_id: str,
        *,
        at: str | None,
        created_at: int,
        expected_rev: int | None = None,
    ) -> Revision:
        """Create ``new_id`` as the fork of ``source_id`` (``FullSessionStore.fork_session``)."""
        await self._enter()
        source = self._sessions.get(validate_id(source_id))
        check_fork_id(new_id)
        if source is None:
            raise SessionNotFoundError(f"no session {preview(source_id)} to fork")
        self._expect(source_id, expected_rev)
        checked_int(created_at, "createdAt")
        fork = fork_document(source, new_id=new_id, at=at, created_at=created_at)
        if new_id in self._sessions:
            raise ConflictError(f"the store already holds a session {preview(new_id)}")
        return self._versioned(new_id, None, lambda: self._write(fork))

    async def list_forks(self, source_id: str) -> builtins.list[str]:
        """The direct forks of ``source_id``, sorted."""
        await self._enter()
        validate_id(source_id)
        return sorted(
            session_id
            for session_id, data in self._sessions.items()
            if (origin := forked_from(data.metadata)) is not None and origin.session_id == source_id
        )

    def _ordered(self, filter: SessionFilter | None) -> builtins.list[SessionData]:
        if filter is not None:
            filter = checked(filter, SessionFilter, "session filter")
        rows = [
            d
            for d in self._sessions.values()
            if model.matches_session_filter(d.agent_id, d.project_root, filter)
        ]
        rows.sort(key=lambda d: d.id)
        rows.sort(key=lambda d: d.updated_at, reverse=True)
        if filter is not None and filter.limit is not None:
            del rows[filter.limit :]
        return rows

    async def list(self, filter: SessionFilter | None = None) -> builtins.list[str]:
        """Session ids, newest ``updatedAt`` first (ties by id), filtered, cut to ``limit``."""
        await self._enter()
        return [d.id for d in self._ordered(filter)]

    # -- headers ----------------------------------------------------------------------------

    def _save_meta(
        self,
        data: SessionData,
        options: SaveMetaOptions | None = None,
        *,
        expected_rev: int | None = None,
    ) -> Revision:
        """Write the header and upsert the snapshot's runs; turns are never written or deleted.

        A new session gets a header with no turns; ``options.metaKeys``
        merges only those keys into the stored metadata.
        """
        data = checked_header(data)
        return self._versioned(
            data.id, expected_rev, lambda: self._save_meta_checked(data, options)
        )

    save_meta = _entered(_save_meta)

    def _save_meta_checked(self, data: SessionData, options: SaveMetaOptions | None) -> None:
        keys = None
        if options is not None:
            keys = checked(options, SaveMetaOptions, "save_meta options").meta_keys
        stored = self._sessions.get(data.id)
        status, owner = model.snapshot_status(
            stored.status if stored else None, stored.run_owner if stored else None, data.status
        )
        metadata = model.merge_session_metadata(
            stored.metadata if stored else None, data.metadata, keys
        )
        candidate = msgspec.structs.replace(
            data,
            metadata=metadata,
            status=status,
            run_owner=owner,
            turns=(),
            runs=upsert_runs(stored.runs if stored else (), data.runs),
        )
        valid = checked(candidate, SessionData, "session data")
        check_ids((), valid.runs)
        if stored is not None:
            valid = msgspec.structs.replace(valid, turns=stored.turns)
        self._write(valid)

    def _meta_row(self, data: SessionData) -> SessionMetaRow:
        row = model.session_meta_row(
            data,
            artifact_count=len(self._artifacts.get(data.id, ())),
            rev=self._revs[data.id],
        )
        return _copy(row, SessionMetaRow)

    async def get_meta(self, session_id: str) -> SessionMetaRow | None:
        """One session's summary row (with ``artifactCount`` and ``rev``), or ``None``."""
        await self._enter()
        stored = self._sessions.get(validate_id(session_id))
        return None if stored is None else self._meta_row(stored)

    async def list_meta(self, filter: SessionFilter | None = None) -> builtins.list[SessionMetaRow]:
        """Summary rows in :meth:`list` order, filtered the same way."""
        await self._enter()
        return [self._meta_row(d) for d in self._ordered(filter)]

    async def search_meta(self, search: SessionSearch) -> SessionSearchPage:
        """Sessions matching ``search``, found by reading every one (``search_page``)."""
        await self._enter()
        search = checked(search, SessionSearch, "session search")
        return search_page(self._sessions.values(), search, self._meta_row)

    def _patch_meta(self, session_id: str, patch: Mapping[str, JsonValue]) -> Revision:
        """Merge ``patch`` into the metadata (``UNSET`` removes); status and ``updatedAt`` stay."""
        return self._versioned(
            session_id, None, lambda: self._patch_meta_checked(session_id, patch)
        )

    patch_meta = _entered(_patch_meta)

    def _patch_meta_checked(self, session_id: str, patch: Mapping[str, JsonValue]) -> None:
        validate_id(session_id)
        valid = checked_meta_patch(patch)
        stored = self._sessions.get(session_id)
        if stored is None:
            return
        self._write(
            msgspec.structs.replace(stored, metadata=model.patch_metadata(stored.metadata, valid))
        )

    # -- runs and history -------------------------------------------------------------------

    async def claim_run(
        self, session_id: str, *, stale_at: int, owner: RunOwner | None = None
    ) -> RunClaim:
        """Set ``running`` for ``owner`` unless a live owner holds it (``run_claim_blocked``).

        An unknown id is claimed without writing a row.
        """
        await self._enter()
        validate_id(session_id)
        checked_int(stale_at, "stale_at")
        if owner is not None:
            owner = checked(owner, RunOwner, "run owner")
        stored = self._sessions.get(session_id)
        if stored is None:
            return RunClaim(claimed=True)
        now = now_ms()
        if model.run_claim_blocked(
            stored.status, stored.run_owner, stored.updated_at, stale_at, now
        ):
            return RunClaim(claimed=False)
        self._write(
            msgspec.structs.replace(
                stored,
                status="running",
                run_owner=owner or model.current_run_owner(),
                updated_at=now,
            )
        )
        return RunClaim(claimed=True, previous=stored.status)

    async def demote_stale_run(self, session_id: str, *, stale_at: int, now: int) -> bool:
        """Write the load-time demotion unless the run marker still holds (``run_claim_blocked``).

        ``running`` becomes ``idle`` (owner cleared) and ``running`` run records
        ``aborted``; ``updatedAt`` is kept. ``True`` when something was written.
        """
        await self._enter()
        validate_id(session_id)
        checked_int(stale_at, "stale_at")
        checked_int(now, "now")
        stored = self._sessions.get(session_id)
        if stored is None or model.run_claim_blocked(
            stored.status, stored.run_owner, stored.updated_at, stale_at, now
        ):
            return False
        demoted = model.demote_stale_running_status(stored)
        if demoted is stored:
            return False
        self._write(demoted)
        return True

    async def _edit_history(
        self, session_id: str, mutate: HistoryMutation, runs_too: bool, expected_rev: int | None
    ) -> tuple[MutateResult, Revision]:
        # A turns-only edit answers the runs it was given: runs_too needs no check here.
        await self._enter()
        self._expect(session_id, expected_rev)
        before = self._rev(session_id)
        result = self._mutate_history(session_id, mutate)
        return result, Revision(before, self._rev(session_id))

    def _mutate_history(self, session_id: str, mutate: HistoryMutation) -> MutateResult:
        stored = self._sessions.get(session_id)
        if stored is None:
            return "no-session"
        current = _copy(SessionHistory(turns=stored.turns, runs=stored.runs), SessionHistory)
        result = mutate(current)
        if result is None:
            return "unchanged"
        turns = checked_items(result.turns, SessionTurn, "history turns")
        runs = stored.runs
        if result.runs != current.runs:
            runs = checked_items(result.runs, SessionRun, "history runs")
        check_ids(turns, runs)
        self._write(msgspec.structs.replace(stored, turns=turns, runs=runs, updated_at=now_ms()))
        return "ok"

    # -- send requests ----------------------------------------------------------------------

    async def claim_send_request(
        self, session_id: str, request_id: str, fingerprint: str
    ) -> SendRequestClaim:
        """Claim ``request_id`` for one send, or answer the record already holding it.

        Keeps the newest ``SEND_REQUEST_HISTORY`` ids per session. The session
        must exist (:class:`SessionNotFoundError`): a session created later
        under its id would inherit the claim.
        """
        await self._enter()
        check_send_claim(session_id, request_id, fingerprint)
        self._held_for_send(session_id)
        records = self._send_requests.setdefault(session_id, {})
        existing = records.get(request_id)
        if existing is not None:
            return SendRequestClaim(claimed=False, record=_copy(existing, SendRequestRecord))
        for evicted in model.send_request_evictions(builtins.list(records.values())):
            del records[evicted]
        records[request_id] = SendRequestRecord(
            request_id=request_id, fingerprint=fingerprint, created_at=now_ms()
        )
        return SendRequestClaim(claimed=True)

    def _held_for_send(self, session_id: str) -> None:
        if session_id not in self._sessions:
            raise SessionNotFoundError(
                f"cannot claim a send request of unknown session {preview(session_id)}"
                " (save the session first)"
            )

    async def find_send_request(self, session_id: str, request_id: str) -> SendRequestRecord | None:
        """The record holding ``request_id``, without claiming it."""
        await self._enter()
        validate_id(session_id)
        validate_request_id(request_id, what="request id")
        record = self._send_requests.get(session_id, {}).get(request_id)
        return None if record is None else _copy(record, SendRequestRecord)

    def _settle_send_request(self, session_id: str, request_id: str, result: JsonValue) -> None:
        """Store a claimed send's ``result``; ``None`` drops the claim; unknown ids are a no-op."""
        validate_id(session_id)
        validate_request_id(request_id, what="request id")
        value = json_value(result, "send result")
        records = self._send_requests.get(session_id, {})
        record = records.get(request_id)
        if record is None:
            return
        if value is None:
            del records[request_id]
        else:
            records[request_id] = msgspec.structs.replace(record, result=value)

    settle_send_request = _entered(_settle_send_request)

    async def list_send_requests(self, session_id: str) -> builtins.list[SendRequestRecord]:
        """Every request id the session holds, oldest claim first (for copies and exports)."""
        await self._enter()
        validate_id(session_id)
        records = self._send_requests.get(session_id, {}).values()
        ordered = sorted(records, key=lambda r: (r.created_at, r.request_id))
        return [_copy(r, SendRequestRecord) for r in ordered]

    async def put_send_request(self, session_id: str, record: SendRequestRecord) -> None:
        """Store ``record`` exactly as given (a copy or an import), replacing its id's record."""
        await self._enter()
        validate_id(session_id)
        record = checked(record, SendRequestRecord, "send request")
        validate_request_id(record.request_id, what="send request id")
        self._held_for_send(session_id)
        records = self._send_requests.setdefault(session_id, {})
        records.pop(record.request_id, None)
        for evicted in model.send_request_evictions(builtins.list(records.values())):
            del records[evicted]
        records[record.request_id] = record

    # -- artifacts --------------------------------------------------------------------------

    def _upsert_artifact(self, artifact: SessionArtifact) -> SessionArtifact | None:
        """Upsert on ``(sessionId, kind, uri)``, evicting past the per-session cap.

        Answers the stored row, or ``None`` for an unknown session.
        """
        valid = model.normalize_artifact(checked(artifact, SessionArtifact, "artifact"))
        check_artifact_ids(valid)
        if valid.session_id not in self._sessions:
            return None
        rows = self._artifacts.setdefault(valid.session_id, {})
        existing = next(
            (a for a in rows.values() if a.kind == valid.kind and a.uri == valid.uri), None
        )
        if existing is not None:
            stored = model.merge_artifact(existing, valid)
        else:
            model.check_artifact_id_free(valid, rows.get(valid.id))
            for evicted in model.select_artifact_evictions(builtins.list(rows.values())):
                del rows[evicted]
            stored = valid
        rows[stored.id] = stored
        self._touch(valid.session_id)
        return _copy(stored, SessionArtifact)

    upsert_artifact = _entered(_upsert_artifact)

    def _delete_artifact(self, session_id: str, artifact_id: str) -> None:
        """Remove one artifact; unknown ids are a no-op."""
        validate_id(session_id)
        validate_id(artifact_id, what="artifact id")
        rows = self._artifacts.get(session_id, {})
        if rows.pop(artifact_id, None) is not None:
            self._touch(session_id)

    delete_artifact = _entered(_delete_artifact)

    async def list_artifacts(
        self, filter: model.ArtifactFilter | None = None
    ) -> builtins.list[SessionArtifact]:
        """Artifacts, newest ``updatedAt`` first (ties by id), filtered, cut to ``limit``."""
        await self._enter()
        if filter is not None:
            filter = checked(filter, model.ArtifactFilter, "artifact filter")
        check_artifact_filter_ids(filter)
        every = (a for rows in self._artifacts.values() for a in rows.values())
        return [_copy(a, SessionArtifact) for a in model.filter_artifacts(every, filter)]

    # -- schedules --------------------------------------------------------------------------

    async def save_schedule(self, schedule: Schedule, *, keep_next_fire_at: bool = False) -> None:
        """Create or replace a schedule; ``keep_next_fire_at`` keeps a stored ``nextFireAt``."""
        await self._enter()
        valid = checked(schedule, Schedule, "schedule")
        validate_id(valid.id, what="schedule id")
        valid = msgspec.structs.replace(valid, last_fire=None)
        existing = self._schedules.get(valid.id)
        if keep_next_fire_at and existing is not None:
            valid = msgspec.structs.replace(valid, next_fire_at=existing.next_fire_at)
        self._schedules[valid.id] = valid

    async def list_schedules(self) -> builtins.list[Schedule]:
        """Every schedule, oldest ``createdAt`` first (ties by id), with its newest fire."""
        await self._enter()
        rows = sorted(self._schedules.values(), key=lambda s: (s.created_at, s.id))
        return [msgspec.structs.replace(s, last_fire=self._last_fire(s.id)) for s in rows]

    def _last_fire(self, schedule_id: str) -> ScheduleFire | None:
        fires = self._fires.get(schedule_id)
        return fires[-1] if fires else None

    async def claim_schedule_fire(self, id: str, due_at: int, next: int | None) -> bool:
        """Move ``nextFireAt`` from ``due_at`` to ``next`` if enabled and still due."""
        await self._enter()
        validate_id(id, what="schedule id")
        checked_int(due_at, "due_at")
        _checked_optional_int(next, "next")
        schedule = self._schedules.get(id)
        if schedule is None or not schedule.enabled or schedule.next_fire_at != due_at:
            return False
        self._schedules[id] = msgspec.structs.replace(schedule, next_fire_at=next)
        return True

    async def record_schedule_fire(self, fire: ScheduleFire) -> None:
        """Store a fire (replacing one with its id), keeping the newest ``FIRE_HISTORY``.

        A fire of an unknown schedule is dropped.
        """
        await self._enter()
        valid = checked(fire, ScheduleFire, "schedule fire")
        check_fire_ids(valid)
        if valid.schedule_id not in self._schedules:
            return
        fires = [f for f in self._fires.get(valid.schedule_id, []) if f.id != valid.id]
        fires.append(valid)
        fires.sort(key=lambda f: f.fired_at)
        self._fires[valid.schedule_id] = fires[-model.FIRE_HISTORY :]

    async def list_schedule_fires(
        self, schedule_id: str, limit: int
    ) -> builtins.list[ScheduleFire]:
        """A schedule's fires, newest ``firedAt`` first, at most ``limit``."""
        await self._enter()
        validate_id(schedule_id, what="schedule id")
        count = checked_int(limit, "limit")
        return builtins.list(reversed(self._fires.get(schedule_id, [])))[:count]

    async def delete_schedule(self, id: str) -> bool:
        """Remove a schedule and its fires; ``False`` when it was gone."""
        await self._enter()
        validate_id(id, what="schedule id")
        self._fires.pop(id, None)
        return self._schedules.pop(id, None) is not None

    # -- ids --------------------------------------------------------------------------------

    async def generate_session_id(self) -> str:
        """A new random session id (UUID4)."""
        await self._enter()
        return model.new_id()

    async def generate_turn_id(self) -> str:
        """A new random turn id (UUID4)."""
        await self._enter()
        return model.new_id()


def create_memory_store() -> MemoryStore:
    """A new empty in-memory store (the spec's ``createMemoryStore``)."""
    return MemoryStore()


@asynccontextmanager
async def open_memory_store() -> AsyncIterator[MemoryStore]:
    """A new in-memory store, closed on exit."""
    store = MemoryStore()
    try:
        yield store
    finally:
        await store.aclose()
