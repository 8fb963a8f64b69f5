"""The file-map store: one session kept as a few text files behind a host adapter.

The adapter exchanges whole ``{file name: text}`` maps (``get`` / ``save`` /
``delete``), so the store works over any blob storage a host has. The map
holds ``meta.json`` (the header and runs), ``turns.jsonl`` (one turn per
line) and ``send-requests.json`` (claimed send ids). One store holds one
session: writing a second session id is refused.
"""

from __future__ import annotations

import builtins
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import msgspec
import trio

from ... import model
from ...errors import (
    ConflictError,
    CorruptDataError,
    CorruptDataWarning,
    SessionNotFoundError,
    StoreClosedError,
    ValidationError,
)
from ...model import (
    SaveMetaOptions,
    SendRequestClaim,
    SendRequestRecord,
    SessionData,
    SessionFilter,
    SessionMetaRow,
    SessionSearch,
    SessionSearchPage,
    SessionTurn,
    decode,
    preview,
    search_page,
    session_meta_row,
    upsert_runs,
    validate_id,
    validate_request_id,
)
from .._edits import HistoryEdits
from .._protocol import HistoryMutation, MutateResult, Revision, stale
from .._validate import (
    check_send_claim,
    check_turn_slice,
    checked,
    checked_int,
    checked_status,
    json_value,
)
from ..sqlite._rows import (
    _metadata_json,
    _now,
    _run_body,
    _turn_rows_of,
    _valid_body,
    _valid_header,
)
from ._directory import DirectoryFileMapAdapter
from ._names import FileMapStoreOptions

__all__ = [
    "FileMapAdapter",
    "FileMapStore",
    "FileMapStoreOptions",
    "create_file_map_store",
]

T = TypeVar("T")


@runtime_checkable
class FileMapAdapter(Protocol):
    """Host storage of one file map: load, replace and delete it as a whole."""

    async def get(self) -> Mapping[str, Any]:
        """The current file map (empty when nothing is persisted).

        Either the spec's shape ``{"files": {name: text}}`` or the plain
        ``{name: text}`` map; the store accepts both.
        """
        ...

    async def save(self, files: dict[str, str]) -> None:
        """Replace the persisted map with ``files`` (full-rewrite semantics)."""
        ...

    async def delete(self) -> None:
        """Delete all persisted state."""
        ...


class _Meta(SessionData, frozen=True):
    """``meta.json``: the session without turns, plus the store's change counter."""

    rev: int = 0


class _SendRequests(msgspec.Struct, frozen=True, rename="camel"):
    """``send-requests.json``: the claimed ids, and the session they belong to."""

    session_id: str
    records: tuple[SendRequestRecord, ...] = ()


def _file_map(got: object) -> dict[str, str]:
    """What ``FileMapAdapter.get`` answered, as a plain ``{name: text}`` map.

    The spec's adapters answer ``{"files": {...}}``; a plain map is accepted
    too (a file named ``files`` holds text, never a map, so the two cannot
    be confused).
    """
    if isinstance(got, Mapping) and isinstance(got.get("files"), Mapping):
        got = got["files"]
    if not isinstance(got, Mapping):
        raise CorruptDataError(
            f"the file-map adapter's get() answered a {type(got).__name__}, "
            'not {"files": {name: text}}'
        )
    files = dict(got)
    for name, text in files.items():
        if not isinstance(name, str) or not isinstance(text, str):
            raise CorruptDataError(
                f"the file-map adapter's get() answered {preview(name)}: {type(text).__name__}; "
                "file names and contents must be strings"
            )
    return files


def _last_turn(tail: str, file: str, number: int) -> SessionTurn | None:
    """The last line when it lacks only its newline; a torn write is skipped with a warning."""
    if not tail.strip():
        return None
    try:
        return decode(tail, SessionTurn, what="turn")
    except ValidationError as exc:
        warnings.warn(
            CorruptDataWarning(
                f"{file} line {number} is truncated (a write was cut short); skipped: {exc}"
            ),
            stacklevel=4,
        )
        return None


def _parse_turns(text: str, file: str, first_line: int = 1) -> builtins.list[SessionTurn]:
    """Turns of JSONL text starting at line ``first_line``; a damaged middle line is located."""
    lines = text.split("\n")
    tail = lines.pop()  # "" when the file ends with a newline
    turns = []
    for number, line in enumerate(lines, first_line):
        if not line.strip():
            continue
        try:
            turns.append(decode(line, SessionTurn, what="turn"))
        except ValidationError as exc:
            raise CorruptDataError(f"{file} line {number} does not decode: {exc}") from None
    last = _last_turn(tail, file, first_line + len(lines))
    if last is not None:
        turns.append(last)
    return turns


def _append_point(text: str, file: str) -> str:
    """``text`` ready to take more lines: a complete last turn gets its newline, a torn one goes."""
    if not text or text.endswith("\n"):
        return text
    start = text.rfind("\n") + 1
    if _last_turn(text[start:], file, text.count("\n") + 1) is not None:
        return text + "\n"
    return text[:start]


def _decoded_file(files: Mapping[str, str], name: str, type_: type[T], what: str) -> T | None:
    """File ``name`` of the map decoded as ``type_`` (``None`` when absent); damage is located."""
    raw = files.get(name)
    if raw is None:
        return None
    try:
        return decode(raw, type_, what=what)
    except ValidationError as exc:
        raise CorruptDataError(f"{name} does not decode: {exc}") from None


def _valid_snapshot(data: SessionData) -> SessionData:
    """``data`` with a valid header and run bodies (its turns are checked as written)."""
    data = _valid_header(data)
    for run in data.runs:
        _run_body(run)
    return data


def _turn_lines(turns: Sequence[SessionTurn], where: str = "$") -> str:
    rows = _turn_rows_of(turns, 0, where)
    return "".join(body.decode() + "\n" for *_, body in rows)


class FileMapStore(HistoryEdits):
    """A single-session ``SessionStore`` over a :class:`FileMapAdapter`.

    Writes are serialized in this process (one read-modify-write of the map
    at a time); the adapter decides what is atomic on disk. It has no
    cross-process claims, artifacts or schedules.
    """

    def __init__(self, adapter: FileMapAdapter, options: FileMapStoreOptions | None = None):
        self._adapter = adapter
        self._options = options or FileMapStoreOptions()
        if isinstance(adapter, DirectoryFileMapAdapter):
            adapter._logs.add(self._options.turns_file)  # appended to, never rewritten by peers
        self._lock = trio.Lock()
        self._closed = False
        self._deleted_rev = 0
        self._written_rev = 0  # the rev the last ``_put_meta`` wrote (under the lock)
        # The turns text last indexed (whole lines only), its line count and its turns
        # by id: an append whose text extends it parses only the lines added since.
        self._indexed: tuple[str, int, dict[str, SessionTurn]] = ("", 0, {})

    @property
    def options(self) -> FileMapStoreOptions:
        """The file names in use."""
        return self._options

    # -- plumbing -------------------------------------------------------------------------

    async def _files(self) -> dict[str, str]:
        if self._closed:
            raise StoreClosedError("the file-map store is closed")
        return _file_map(await self._adapter.get())

    def _meta(self, files: Mapping[str, str]) -> _Meta | None:
        return _decoded_file(files, self._options.meta_file, _Meta, "session meta")

    def _turns(self, files: Mapping[str, str]) -> builtins.list[SessionTurn]:
        return _parse_turns(files.get(self._options.turns_file, ""), self._options.turns_file)

    def _turns_by_id(self, files: Mapping[str, str]) -> dict[str, SessionTurn]:
        """The stored turns by id, exact for whatever text the map holds now.

        Text that extends the text last indexed (this store's appends, or
        another writer's) costs a parse of the added lines only; any other
        text (a save, a history rewrite) is parsed whole.
        """
        name = self._options.turns_file
        text = files.get(name, "")
        old, count, index = self._indexed
        if text is not old:
            if text.startswith(old):
                added = _parse_turns(text[len(old) :], name, count + 1)
                index.update((t.id, t) for t in added)  # the cache is replaced below
            else:
                index = {t.id: t for t in _parse_turns(text, name)}
                count = 0
                old = ""
            if text.endswith("\n"):  # only whole lines are kept for the next extension
                count += text.count("\n", len(old))
                self._indexed = (text, count, index)
            else:
                self._indexed = ("", 0, {})
        return index

    def _requests(self, files: Mapping[str, str]) -> _SendRequests | None:
        name = self._options.send_requests_file
        return _decoded_file(files, name, _SendRequests, "send requests")

    def _snapshot_header(
        self, files: Mapping[str, str], data: SessionData, expected_rev: int | None
    ) -> tuple[_Meta | None, int, dict[str, Any]]:
        """For a snapshot write (``save``, ``save_meta``) of ``data``: the stored header, its
        ``rev`` (checked against ``expected_rev``) and the new header's fields, the status
        and owner as ``snapshot_status`` rules (turns, metadata and runs the writer's)."""
        self._check_owner(files, data.id)
        stored = self._meta(files)
        before = self._expect(data.id, stored, expected_rev)
        status, owner = model.snapshot_status(
            stored.status if stored else None, stored.run_owner if stored else None, data.status
        )
        fields = {f: getattr(data, f) for f in SessionData.__struct_fields__}
        fields.update(status=status, run_owner=owner, turns=())
        return stored, before, fields

    def _held(self, files: Mapping[str, str], session_id: str) -> _Meta | None:
        """The stored header when it is ``session_id``'s, else ``None``."""
        meta = self._meta(files)
        return meta if meta is not None and meta.id == session_id else None

    def _held_for_send(self, files: Mapping[str, str], session_id: str) -> None:
        """Refuse a send request of a session the store does not hold (yet): a session
        created later under that id would inherit the claim."""
        if self._held(files, session_id) is None:
            raise SessionNotFoundError(
                f"cannot claim a send request of unknown session {preview(session_id)}"
                " (file-map store; save the session first)"
            )

    def _check_owner(self, files: Mapping[str, str], session_id: str) -> None:
        meta = self._meta(files)
        requests = self._requests(files)
        held = meta.id if meta is not None else requests.session_id if requests else None
        if held is not None and held != session_id:
            raise ConflictError(
                f"this file-map store holds session {preview(held)};"
                f" it cannot store {preview(session_id)} "
                "(one session per store)"
            )

    def _put_meta(self, files: dict[str, str], meta: _Meta) -> None:
        self._written_rev = meta.rev + 1
        files[self._options.meta_file] = model.encode(
            msgspec.structs.replace(meta, turns=(), rev=self._written_rev)
        ).decode()

    @staticmethod
    def _expect(session_id: str, stored: _Meta | None, expected_rev: int | None) -> int:
        """The stored rev (``0`` for none), checked against ``expected_rev`` when given."""
        before = 0 if stored is None else stored.rev
        if expected_rev is not None and before != expected_rev:
            raise stale(session_id, expected_rev, before)
        return before

    @staticmethod
    def _data(meta: _Meta, turns: Sequence[SessionTurn]) -> SessionData:
        fields = {f: getattr(meta, f) for f in SessionData.__struct_fields__}
        fields["turns"] = tuple(turns)
        return SessionData(**fields)

    async def _update(
        self, session_id: str, fn: Callable[[dict[str, str], _Meta], bool]
    ) -> Revision:
        """Apply ``fn`` to the map when it holds ``session_id`` (no-op otherwise); save if True."""
        validate_id(session_id)
        async with self._lock:
            files = await self._files()
            meta = self._held(files, session_id)
            if meta is None:
                return Revision(0, 0)
            if not fn(files, meta):
                return Revision(meta.rev, meta.rev)
            await self._adapter.save(files)
            return Revision(meta.rev, self._written_rev)

    async def aclose(self) -> None:
        """Refuse further calls; a directory adapter is closed too (its lock released).

        Idempotent.
        """
        self._closed = True
        if isinstance(self._adapter, DirectoryFileMapAdapter):
            await self._adapter.aclose()
        else:
            await trio.lowlevel.checkpoint()

    # -- required methods -------------------------------------------------------------------

    async def load(self, session_id: str) -> SessionData | None:
        """The session, or ``None`` when the map holds no session with that id."""
        validate_id(session_id)
        files = await self._files()
        meta = self._held(files, session_id)
        return None if meta is None else self._data(meta, self._turns(files))

    async def load_versioned(self, session_id: str) -> tuple[SessionData, int] | None:
        """The session and its ``rev`` (one read of the map), or ``None``."""
        validate_id(session_id)
        files = await self._files()
        meta = self._held(files, session_id)
        return None if meta is None else (self._data(meta, self._turns(files)), meta.rev)

    async def get_rev(self, session_id: str) -> int | None:
        """The session's ``rev``, or ``None`` when the map holds no such session."""
        validate_id(session_id)
        meta = self._held(await self._files(), session_id)
        return None if meta is None else meta.rev

    async def save(self, data: SessionData, *, expected_rev: int | None = None) -> Revision:
        """Write the whole session (turns and runs replaced).

        With ``expected_rev``, only while the stored ``rev`` is that one.
        """
        data = _valid_snapshot(data)
        lines = _turn_lines(data.turns, "$.turns")
        async with self._lock:
            files = await self._files()
            stored, before, fields = self._snapshot_header(files, data, expected_rev)
            fields.update(metadata=model.merge_session_metadata(None, data.metadata, None))
            self._put_meta(files, _Meta(**fields, rev=stored.rev if stored else self._deleted_rev))
            files[self._options.turns_file] = lines
            await self._adapter.save(files)
            return Revision(before, self._written_rev)

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[SessionTurn],
        options: model.AppendTurnsOptions | None = None,
    ) -> Revision:
        """Append lines to the turns file; ``options.run`` is upserted in the same save."""
        validate_id(session_id)
        lines = _turn_lines(turns)
        run = None
        if options is not None:
            _valid_body(options, model.AppendTurnsOptions, "append options")
            run = options.run
            if run is not None:
                _run_body(run)
        async with self._lock:
            files = await self._files()
            meta = self._held(files, session_id)
            if meta is None:
                raise SessionNotFoundError(
                    f"cannot append turns to unknown session {preview(session_id)} (file-map store)"
                )
            if lines:
                fresh = model.fresh_turns(session_id, turns, self._turns_by_id(files))
                if len(fresh) != len(turns):
                    lines = _turn_lines(fresh)
            if not lines and run is None:
                return Revision(meta.rev, meta.rev)
            name = self._options.turns_file
            files[name] = _append_point(files.get(name, ""), name) + lines
            runs = meta.runs if run is None else upsert_runs(meta.runs, (run,))
            self._put_meta(files, msgspec.structs.replace(meta, runs=runs, updated_at=_now()))
            await self._adapter.save(files)
            return Revision(meta.rev, self._written_rev)

    async def get_turns(
        self, session_id: str, from_: int = 0, limit: int | None = None
    ) -> builtins.list[SessionTurn]:
        """Turns ``from_`` up to ``from_ + limit``, oldest first."""
        check_turn_slice(session_id, from_, limit)
        files = await self._files()
        if self._held(files, session_id) is None:
            return []
        turns = self._turns(files)
        return turns[from_ : None if limit is None else from_ + limit]

    async def update_run(
        self, session_id: str, run: model.SessionRun, options: model.UpdateRunOptions | None = None
    ) -> Revision:
        """Upsert one run record; an unknown session is a no-op."""
        _run_body(run)
        if options is not None:
            _valid_body(options, model.UpdateRunOptions, "update run options")

        def edit(files: dict[str, str], meta: _Meta) -> bool:
            runs = upsert_runs(meta.runs, (run,))
            self._put_meta(files, msgspec.structs.replace(meta, runs=runs, updated_at=_now()))
            return True

        return await self._update(session_id, edit)

    async def update_status(
        self,
        session_id: str,
        status: model.SessionStatus,
        *,
        owner: model.RunOwner | None = None,
        preserve_updated_at: bool = False,
    ) -> Revision:
        """Set the status; ``running`` records ``owner`` (default: this process)."""
        checked_status(status)
        if owner is not None:
            _valid_body(owner, model.RunOwner, "run owner")

        def edit(files: dict[str, str], meta: _Meta) -> bool:
            marker = (owner or model.current_run_owner()) if status == "running" else None
            updated_at = meta.updated_at if preserve_updated_at else _now()
            changed = msgspec.structs.replace(
                meta, status=status, run_owner=marker, updated_at=updated_at
            )
            self._put_meta(files, changed)
            return True

        return await self._update(session_id, edit)

    async def delete(self, session_id: str) -> None:
        """Delete every file of the session (its send-request ids too)."""
        validate_id(session_id)
        async with self._lock:
            files = await self._files()
            requests = self._requests(files)
            held = self._held(files, session_id)
            if held is not None or (requests is not None and requests.session_id == session_id):
                await self._adapter.delete()
            if held is not None:
                # The files are gone: this store object remembers the rev a re-created
                # session continues from (another store object on the files cannot).
                self._deleted_rev = max(self._deleted_rev, held.rev)

    async def list(self, filter: SessionFilter | None = None) -> builtins.list[str]:
        """The one session's id when it passes ``filter``."""
        return [row.id for row in await self.list_meta(filter)]

    # -- optional methods -------------------------------------------------------------------

    async def save_meta(
        self,
        data: SessionData,
        options: SaveMetaOptions | None = None,
        *,
        expected_rev: int | None = None,
    ) -> Revision:
        """Write the header (``metaKeys`` merge) and upsert the snapshot's runs; turns untouched."""
        data = _valid_snapshot(data)
        keys = None
        if options is not None:
            keys = decode(
                _valid_body(options, SaveMetaOptions, "save_meta options"), SaveMetaOptions
            ).meta_keys
        async with self._lock:
            files = await self._files()
            stored, before, fields = self._snapshot_header(files, data, expected_rev)
            fields.update(
                metadata=model.merge_session_metadata(
                    stored.metadata if stored else None, data.metadata, keys
                ),
                runs=upsert_runs(stored.runs if stored else (), data.runs),
            )
            self._put_meta(files, _Meta(**fields, rev=stored.rev if stored else self._deleted_rev))
            files.setdefault(self._options.turns_file, "")
            await self._adapter.save(files)
            return Revision(before, self._written_rev)

    def _row(self, files: Mapping[str, str], meta: _Meta) -> SessionMetaRow:
        return session_meta_row(self._data(meta, self._turns(files)), rev=meta.rev)

    async def get_meta(self, session_id: str) -> SessionMetaRow | None:
        """The session's summary row, or ``None``."""
        validate_id(session_id)
        files = await self._files()
        meta = self._held(files, session_id)
        return None if meta is None else self._row(files, meta)

    async def list_meta(self, filter: SessionFilter | None = None) -> builtins.list[SessionMetaRow]:
        """The one session's summary row when it passes ``filter``."""
        if filter is not None:
            _valid_body(filter, SessionFilter, "session filter")
        files = await self._files()
        meta = self._meta(files)
        if meta is None or not model.matches_session_filter(
            meta.agent_id, meta.project_root, filter
        ):
            return []
        if filter is not None and filter.limit == 0:
            return []
        return [self._row(files, meta)]

    async def search_meta(self, search: SessionSearch) -> SessionSearchPage:
        """The one session when it matches ``search`` (read and matched like ``search_page``)."""
        _valid_body(search, SessionSearch, "session search")
        files = await self._files()
        meta = self._meta(files)
        found = [] if meta is None else [self._data(meta, self._turns(files))]
        rev = 0 if meta is None else meta.rev
        return search_page(found, search, lambda d: session_meta_row(d, rev=rev))

    async def patch_meta(self, session_id: str, patch: Mapping[str, model.JsonValue]) -> Revision:
        """Merge ``patch`` into the metadata; status and ``updatedAt`` stay; unknown ids no-op."""
        if not isinstance(patch, Mapping):
            raise ValidationError(f"metadata patch must be a mapping, got {type(patch).__name__}")
        _metadata_json(patch)

        def edit(files: dict[str, str], meta: _Meta) -> bool:
            merged = model.patch_metadata(meta.metadata, patch)
            self._put_meta(files, msgspec.structs.replace(meta, metadata=merged))
            return True

        return await self._update(session_id, edit)

    async def demote_stale_run(self, session_id: str, *, stale_at: int, now: int) -> bool:
        """Write a load's stale-running demotion unless the marker still holds.

        Judged by ``run_claim_blocked`` on the header re-read under the store's
        lock (``updatedAt`` kept); ``True`` when something was written.
        """
        checked_int(stale_at, "stale_at")
        checked_int(now, "now")
        demoted = False

        def edit(files: dict[str, str], meta: _Meta) -> bool:
            nonlocal demoted
            if model.run_claim_blocked(meta.status, meta.run_owner, meta.updated_at, stale_at, now):
                return False
            data = self._data(meta, ())
            after = model.demote_stale_running_status(data)
            if after is data:
                return False
            changed = msgspec.structs.replace(
                meta, status=after.status, run_owner=after.run_owner, runs=after.runs
            )
            self._put_meta(files, changed)
            demoted = True
            return True

        await self._update(session_id, edit)
        return demoted

    async def _edit_history(
        self, session_id: str, mutate: HistoryMutation, runs_too: bool, expected_rev: int | None
    ) -> tuple[MutateResult, Revision | None]:
        # Under the store's lock. A turns-only edit answers the runs it was given.
        async with self._lock:
            files = await self._files()
            meta = self._held(files, session_id)
            self._expect(session_id, meta, expected_rev)
            if meta is None:
                return "no-session", None
            turns = tuple(self._turns(files))
            result = mutate(model.SessionHistory(turns=turns, runs=meta.runs))
            if result is None:
                return "unchanged", None
            lines = _turn_lines(result.turns, "$.turns")
            runs = meta.runs
            if result.runs is not runs and result.runs != runs:
                for run in result.runs:
                    _run_body(run)
                runs = tuple(result.runs)
            files[self._options.turns_file] = lines
            self._put_meta(files, msgspec.structs.replace(meta, runs=runs, updated_at=_now()))
            await self._adapter.save(files)
            return "ok", Revision(meta.rev, self._written_rev)

    async def claim_send_request(
        self, session_id: str, request_id: str, fingerprint: str
    ) -> SendRequestClaim:
        """Claim ``request_id`` (or answer its record), keeping the newest ids.

        The session must exist (:class:`SessionNotFoundError`).
        """
        check_send_claim(session_id, request_id, fingerprint)
        async with self._lock:
            files = await self._files()
            self._check_owner(files, session_id)
            self._held_for_send(files, session_id)
            held = self._requests(files) or _SendRequests(session_id=session_id)
            for record in held.records:
                if record.request_id == request_id:
                    return SendRequestClaim(claimed=False, record=record)
            evicted = set(model.send_request_evictions(held.records, model.SEND_REQUEST_HISTORY))
            claim = SendRequestRecord(
                request_id=request_id, fingerprint=fingerprint, created_at=_now()
            )
            records = (*(r for r in held.records if r.request_id not in evicted), claim)
            self._put_requests(files, session_id, records)
            await self._adapter.save(files)
            return SendRequestClaim(claimed=True)

    def _put_requests(
        self, files: dict[str, str], session_id: str, records: tuple[SendRequestRecord, ...]
    ) -> None:
        value = _SendRequests(session_id=session_id, records=records)
        files[self._options.send_requests_file] = model.encode(value).decode()

    async def find_send_request(self, session_id: str, request_id: str) -> SendRequestRecord | None:
        """The record holding ``request_id``, without claiming it."""
        validate_id(session_id)
        validate_request_id(request_id, what="send request id")
        held = self._requests(await self._files())
        if held is None or held.session_id != session_id:
            return None
        return next((r for r in held.records if r.request_id == request_id), None)

    async def list_send_requests(self, session_id: str) -> builtins.list[SendRequestRecord]:
        """Every request id the session holds, oldest claim first (for copies and exports)."""
        validate_id(session_id)
        held = self._requests(await self._files())
        if held is None or held.session_id != session_id:
            return []
        return sorted(held.records, key=lambda r: (r.created_at, r.request_id))

    async def put_send_request(self, session_id: str, record: SendRequestRecord) -> None:
        """Store ``record`` exactly as given (a copy or an import), replacing its id's record."""
        validate_id(session_id)
        record = checked(record, SendRequestRecord, "send request")
        validate_request_id(record.request_id, what="send request id")
        async with self._lock:
            files = await self._files()
            self._check_owner(files, session_id)
            self._held_for_send(files, session_id)
            held = self._requests(files) or _SendRequests(session_id=session_id)
            kept = tuple(r for r in held.records if r.request_id != record.request_id)
            evicted = set(model.send_request_evictions(kept, model.SEND_REQUEST_HISTORY))
            records = (*(r for r in kept if r.request_id not in evicted), record)
            self._put_requests(files, session_id, records)
            await self._adapter.save(files)

    async def settle_send_request(
        self, session_id: str, request_id: str, result: model.JsonValue
    ) -> None:
        """Store the send's result; ``None`` drops the claim; unknown ids are a no-op."""
        validate_id(session_id)
        validate_request_id(request_id, what="send request id")
        value: Any = json_value(result, "send result")
        async with self._lock:
            files = await self._files()
            held = self._requests(files)
            if held is None or held.session_id != session_id:
                return
            if not any(r.request_id == request_id for r in held.records):
                return
            records = tuple(
                r if r.request_id != request_id else msgspec.structs.replace(r, result=value)
                for r in held.records
                if value is not None or r.request_id != request_id
            )
            self._put_requests(files, session_id, records)
            await self._adapter.save(files)

    async def generate_session_id(self) -> str:
        """A new random session id."""
        await trio.lowlevel.checkpoint()
        return model.new_id()

    async def generate_turn_id(self) -> str:
        """A new random turn id."""
        await trio.lowlevel.checkpoint()
        return model.new_id()


def create_file_map_store(
    adapter: FileMapAdapter, options: FileMapStoreOptions | None = None
) -> FileMapStore:
    """A single-session store over ``adapter`` (the spec's ``createFileMapStore``)."""
    if not isinstance(adapter, FileMapAdapter):
        raise ValidationError(
            f"adapter must have async get/save/delete methods, got {type(adapter).__name__}"
        )
    return FileMapStore(adapter, options)
