"""The file-map store: one session kept as a few text files behind a host adapter.

The adapter exchanges whole ``{file name: text}`` maps (``get`` / ``save`` /
``delete``), so the store works over any blob storage a host has. The map
holds ``meta.json`` (the header and runs), ``turns.jsonl`` (one turn per
line) and ``send-requests.json`` (claimed send ids). One store holds one
session: writing a second session id is refused.

:class:`DirectoryFileMapAdapter` keeps the map as files in a directory, each
replaced atomically (temporary file in the same directory, ``fsync``,
``os.replace``, ``fsync`` of the directory).
"""

from __future__ import annotations

import builtins
import os
import secrets
import warnings
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol, runtime_checkable

import attrs
import msgspec
import trio

from ..errors import (
    ConflictError,
    CorruptDataError,
    CorruptDataWarning,
    InvalidNameError,
    SessionNotFoundError,
    StoreClosedError,
    ValidationError,
)
from ..model import (
    SEND_REQUEST_HISTORY,
    AppendTurnsOptions,
    JsonValue,
    RunOwner,
    SaveMetaOptions,
    SendRequestClaim,
    SendRequestRecord,
    SessionData,
    SessionFilter,
    SessionHistory,
    SessionMetaRow,
    SessionRun,
    SessionStatus,
    SessionTurn,
    UpdateRunOptions,
    current_run_owner,
    decode,
    encode,
    matches_session_filter,
    merge_session_metadata,
    new_id,
    patch_metadata,
    send_request_evictions,
    session_meta_row,
    snapshot_status,
    upsert_runs,
    validate_id,
)
from ._protocol import HistoryMutation, MutateResult
from ._sqlite import _metadata_json, _now, _run_body, _turn_rows_of, _valid_body, _valid_header
from ._validate import json_value

__all__ = [
    "DirectoryFileMapAdapter",
    "FileMapAdapter",
    "FileMapStore",
    "FileMapStoreOptions",
    "create_file_map_store",
    "open_directory_adapter",
]


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


def _check_file_name(value: object, what: str) -> str:
    """A plain file name: no directory part, no ``..``, no hidden or control characters."""
    if not isinstance(value, str) or not value:
        raise InvalidNameError(f"{what} must be a non-empty string, got {value!r}")
    if (
        value in (".", "..")
        or value.startswith(".")
        or any(c in value for c in "/\\\0")
        or any(ord(c) < 32 for c in value)
        or len(value) > 255
    ):
        raise InvalidNameError(f"{what} {value!r} is not a plain file name")
    return value


def _validate_name(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    _check_file_name(value, attribute.name)


@attrs.frozen
class FileMapStoreOptions:
    """File names of the map (plain, distinct names)."""

    meta_file: str = attrs.field(default="meta.json", validator=_validate_name)
    turns_file: str = attrs.field(default="turns.jsonl", validator=_validate_name)
    send_requests_file: str = attrs.field(default="send-requests.json", validator=_validate_name)

    def __attrs_post_init__(self) -> None:
        names = (self.meta_file, self.turns_file, self.send_requests_file)
        if len(set(names)) != len(names):
            raise InvalidNameError(f"file-map file names must be distinct, got {names}")


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
                f"the file-map adapter's get() answered {name!r}: {type(text).__name__}; "
                "file names and contents must be strings"
            )
    return files


def _parse_turns(text: str, file: str) -> builtins.list[SessionTurn]:
    """Turns of a JSONL file; a truncated last line is skipped with a warning."""
    lines = text.split("\n")
    tail = lines.pop()  # "" when the file ends with a newline
    turns = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            turns.append(decode(line, SessionTurn, what="turn"))
        except ValidationError as exc:
            raise CorruptDataError(f"{file} line {number} does not decode: {exc}") from None
    if tail.strip():
        try:
            turns.append(decode(tail, SessionTurn, what="turn"))
        except ValidationError as exc:
            warnings.warn(
                CorruptDataWarning(
                    f"{file} line {len(lines) + 1} is truncated (a write was cut short); "
                    f"skipped: {exc}"
                ),
                stacklevel=3,
            )
    return turns


def _turn_lines(turns: Sequence[SessionTurn], where: str = "$") -> str:
    rows = _turn_rows_of(turns, 0, where)
    return "".join(body.decode() + "\n" for *_, body in rows)


class FileMapStore:
    """A single-session ``SessionStore`` over a :class:`FileMapAdapter`.

    Writes are serialized in this process (one read-modify-write of the map
    at a time); the adapter decides what is atomic on disk. It has no
    cross-process claims, artifacts or schedules.
    """

    def __init__(self, adapter: FileMapAdapter, options: FileMapStoreOptions | None = None):
        self._adapter = adapter
        self._options = options or FileMapStoreOptions()
        self._lock = trio.Lock()
        self._closed = False

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
        raw = files.get(self._options.meta_file)
        if raw is None:
            return None
        try:
            return decode(raw, _Meta, what="session meta")
        except ValidationError as exc:
            raise CorruptDataError(f"{self._options.meta_file} does not decode: {exc}") from None

    def _turns(self, files: Mapping[str, str]) -> builtins.list[SessionTurn]:
        return _parse_turns(files.get(self._options.turns_file, ""), self._options.turns_file)

    def _requests(self, files: Mapping[str, str]) -> _SendRequests | None:
        raw = files.get(self._options.send_requests_file)
        if raw is None:
            return None
        try:
            return decode(raw, _SendRequests, what="send requests")
        except ValidationError as exc:
            name = self._options.send_requests_file
            raise CorruptDataError(f"{name} does not decode: {exc}") from None

    def _held(self, files: Mapping[str, str], session_id: str) -> _Meta | None:
        """The stored header when it is ``session_id``'s, else ``None``."""
        meta = self._meta(files)
        return meta if meta is not None and meta.id == session_id else None

    def _check_owner(self, files: Mapping[str, str], session_id: str) -> None:
        meta = self._meta(files)
        requests = self._requests(files)
        held = meta.id if meta is not None else requests.session_id if requests else None
        if held is not None and held != session_id:
            raise ConflictError(
                f"this file-map store holds session {held!r}; it cannot store {session_id!r} "
                "(one session per store)"
            )

    def _put_meta(self, files: dict[str, str], meta: _Meta) -> None:
        files[self._options.meta_file] = encode(
            msgspec.structs.replace(meta, turns=(), rev=meta.rev + 1)
        ).decode()

    @staticmethod
    def _data(meta: _Meta, turns: Sequence[SessionTurn]) -> SessionData:
        fields = {f: getattr(meta, f) for f in SessionData.__struct_fields__}
        fields["turns"] = tuple(turns)
        return SessionData(**fields)

    async def _update(self, session_id: str, fn: Callable[[dict[str, str], _Meta], bool]) -> None:
        """Apply ``fn`` to the map when it holds ``session_id`` (no-op otherwise); save if True."""
        validate_id(session_id)
        async with self._lock:
            files = await self._files()
            meta = self._held(files, session_id)
            if meta is not None and fn(files, meta):
                await self._adapter.save(files)

    async def aclose(self) -> None:
        """Refuse further calls (the adapter holds no handle to release). Idempotent."""
        await trio.lowlevel.checkpoint()
        self._closed = True

    # -- required methods -------------------------------------------------------------------

    async def load(self, session_id: str) -> SessionData | None:
        """The session, or ``None`` when the map holds no session with that id."""
        validate_id(session_id)
        files = await self._files()
        meta = self._held(files, session_id)
        return None if meta is None else self._data(meta, self._turns(files))

    async def save(self, data: SessionData) -> None:
        """Write the whole session (turns and runs replaced)."""
        data = _valid_header(data)
        for run in data.runs:
            _run_body(run)
        lines = _turn_lines(data.turns, "$.turns")
        async with self._lock:
            files = await self._files()
            self._check_owner(files, data.id)
            stored = self._meta(files)
            status, owner = snapshot_status(
                stored.status if stored else None, stored.run_owner if stored else None, data.status
            )
            metadata = merge_session_metadata(None, data.metadata, None)
            fields = {f: getattr(data, f) for f in SessionData.__struct_fields__}
            fields.update(metadata=metadata, status=status, run_owner=owner, turns=())
            self._put_meta(files, _Meta(**fields, rev=stored.rev if stored else 0))
            files[self._options.turns_file] = lines
            await self._adapter.save(files)

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[SessionTurn],
        options: AppendTurnsOptions | None = None,
    ) -> None:
        """Append lines to the turns file; ``options.run`` is upserted in the same save."""
        validate_id(session_id)
        lines = _turn_lines(turns)
        run = None
        if options is not None:
            _valid_body(options, AppendTurnsOptions, "append options")
            run = options.run
            if run is not None:
                _run_body(run)
        async with self._lock:
            files = await self._files()
            meta = self._held(files, session_id)
            if meta is None:
                raise SessionNotFoundError(
                    f"cannot append turns to unknown session {session_id!r} (file-map store)"
                )
            if not lines and run is None:
                return
            existing = files.get(self._options.turns_file, "")
            if existing and not existing.endswith("\n"):
                self._turns(files)  # warns about the truncated tail it drops
                existing = existing[: existing.rfind("\n") + 1]
            files[self._options.turns_file] = existing + lines
            runs = meta.runs if run is None else upsert_runs(meta.runs, (run,))
            self._put_meta(files, msgspec.structs.replace(meta, runs=runs, updated_at=_now()))
            await self._adapter.save(files)

    async def get_turns(
        self, session_id: str, from_: int = 0, limit: int | None = None
    ) -> builtins.list[SessionTurn]:
        """Turns ``from_`` up to ``from_ + limit``, oldest first."""
        validate_id(session_id)
        if (
            not isinstance(from_, int)
            or from_ < 0
            or (limit is not None and (not isinstance(limit, int) or limit < 0))
        ):
            raise ValidationError(
                f"get_turns needs from_ >= 0 and limit >= 0, got {from_}, {limit}"
            )
        files = await self._files()
        if self._held(files, session_id) is None:
            return []
        turns = self._turns(files)
        return turns[from_ : None if limit is None else from_ + limit]

    async def update_run(
        self, session_id: str, run: SessionRun, options: UpdateRunOptions | None = None
    ) -> None:
        """Upsert one run record; an unknown session is a no-op."""
        _run_body(run)
        if options is not None:
            _valid_body(options, UpdateRunOptions, "update run options")

        def edit(files: dict[str, str], meta: _Meta) -> bool:
            runs = upsert_runs(meta.runs, (run,))
            self._put_meta(files, msgspec.structs.replace(meta, runs=runs, updated_at=_now()))
            return True

        await self._update(session_id, edit)

    async def update_status(
        self,
        session_id: str,
        status: SessionStatus,
        *,
        owner: RunOwner | None = None,
        preserve_updated_at: bool = False,
    ) -> None:
        """Set the status; ``running`` records ``owner`` (default: this process)."""
        if status not in ("error", "running", "completed", "idle"):
            raise ValidationError(f"unknown session status {status!r}")
        if owner is not None:
            _valid_body(owner, RunOwner, "run owner")

        def edit(files: dict[str, str], meta: _Meta) -> bool:
            marker = (owner or current_run_owner()) if status == "running" else None
            updated_at = meta.updated_at if preserve_updated_at else _now()
            changed = msgspec.structs.replace(
                meta, status=status, run_owner=marker, updated_at=updated_at
            )
            self._put_meta(files, changed)
            return True

        await self._update(session_id, edit)

    async def delete(self, session_id: str) -> None:
        """Delete every file of the session (its send-request ids too)."""
        validate_id(session_id)
        async with self._lock:
            files = await self._files()
            requests = self._requests(files)
            if self._held(files, session_id) is not None or (
                requests is not None and requests.session_id == session_id
            ):
                await self._adapter.delete()

    async def list(self, filter: SessionFilter | None = None) -> builtins.list[str]:
        """The one session's id when it passes ``filter``."""
        return [row.id for row in await self.list_meta(filter)]

    # -- optional methods -------------------------------------------------------------------

    async def save_meta(self, data: SessionData, options: SaveMetaOptions | None = None) -> None:
        """Write the header (``metaKeys`` merge) and upsert the snapshot's runs; turns untouched."""
        data = _valid_header(data)
        for run in data.runs:
            _run_body(run)
        keys = None
        if options is not None:
            keys = decode(
                _valid_body(options, SaveMetaOptions, "save_meta options"), SaveMetaOptions
            ).meta_keys
        async with self._lock:
            files = await self._files()
            self._check_owner(files, data.id)
            stored = self._meta(files)
            status, owner = snapshot_status(
                stored.status if stored else None, stored.run_owner if stored else None, data.status
            )
            metadata = merge_session_metadata(
                stored.metadata if stored else None, data.metadata, keys
            )
            fields = {f: getattr(data, f) for f in SessionData.__struct_fields__}
            fields.update(
                metadata=metadata,
                status=status,
                run_owner=owner,
                turns=(),
                runs=upsert_runs(stored.runs if stored else (), data.runs),
            )
            self._put_meta(files, _Meta(**fields, rev=stored.rev if stored else 0))
            files.setdefault(self._options.turns_file, "")
            await self._adapter.save(files)

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
        if meta is None or not matches_session_filter(meta.agent_id, meta.project_root, filter):
            return []
        if filter is not None and filter.limit == 0:
            return []
        return [self._row(files, meta)]

    async def patch_meta(self, session_id: str, patch: Mapping[str, JsonValue]) -> None:
        """Merge ``patch`` into the metadata; status and ``updatedAt`` stay; unknown ids no-op."""
        if not isinstance(patch, Mapping):
            raise ValidationError(f"metadata patch must be a mapping, got {type(patch).__name__}")
        _metadata_json(patch)

        def edit(files: dict[str, str], meta: _Meta) -> bool:
            merged = patch_metadata(meta.metadata, patch)
            self._put_meta(files, msgspec.structs.replace(meta, metadata=merged))
            return True

        await self._update(session_id, edit)

    async def mutate_history(self, session_id: str, mutate: HistoryMutation) -> MutateResult:
        """Read, edit and write back turns and runs under the store's lock."""
        validate_id(session_id)
        async with self._lock:
            files = await self._files()
            meta = self._held(files, session_id)
            if meta is None:
                return "no-session"
            turns = tuple(self._turns(files))
            result = mutate(SessionHistory(turns=turns, runs=meta.runs))
            if result is None:
                return "unchanged"
            if not isinstance(result, SessionHistory):
                raise ValidationError(
                    "a history mutation must return a SessionHistory or None, "
                    f"got {type(result).__name__}"
                )
            lines = _turn_lines(result.turns, "$.turns")
            runs = meta.runs
            if result.runs is not runs and result.runs != runs:
                for run in result.runs:
                    _run_body(run)
                runs = tuple(result.runs)
            files[self._options.turns_file] = lines
            self._put_meta(files, msgspec.structs.replace(meta, runs=runs, updated_at=_now()))
            await self._adapter.save(files)
            return "ok"

    async def claim_send_request(
        self, session_id: str, request_id: str, fingerprint: str
    ) -> SendRequestClaim:
        """Claim ``request_id`` (or answer its record), keeping the newest ids."""
        validate_id(session_id)
        validate_id(request_id, what="send request id")
        if not isinstance(fingerprint, str):
            raise ValidationError(f"fingerprint must be a string, got {type(fingerprint).__name__}")
        async with self._lock:
            files = await self._files()
            self._check_owner(files, session_id)
            held = self._requests(files) or _SendRequests(session_id=session_id)
            for record in held.records:
                if record.request_id == request_id:
                    return SendRequestClaim(claimed=False, record=record)
            evicted = set(send_request_evictions(held.records, SEND_REQUEST_HISTORY))
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
        files[self._options.send_requests_file] = encode(value).decode()

    async def find_send_request(self, session_id: str, request_id: str) -> SendRequestRecord | None:
        """The record holding ``request_id``, without claiming it."""
        validate_id(session_id)
        validate_id(request_id, what="send request id")
        held = self._requests(await self._files())
        if held is None or held.session_id != session_id:
            return None
        return next((r for r in held.records if r.request_id == request_id), None)

    async def settle_send_request(
        self, session_id: str, request_id: str, result: JsonValue
    ) -> None:
        """Store the send's result; ``None`` drops the claim; unknown ids are a no-op."""
        validate_id(session_id)
        validate_id(request_id, what="send request id")
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
        return new_id()

    async def generate_turn_id(self) -> str:
        """A new random turn id."""
        await trio.lowlevel.checkpoint()
        return new_id()


def create_file_map_store(
    adapter: FileMapAdapter, options: FileMapStoreOptions | None = None
) -> FileMapStore:
    """A single-session store over ``adapter`` (the spec's ``createFileMapStore``)."""
    if not isinstance(adapter, FileMapAdapter):
        raise ValidationError(
            f"adapter must have async get/save/delete methods, got {type(adapter).__name__}"
        )
    return FileMapStore(adapter, options)


# -- the directory adapter ---------------------------------------------------------------------


def _is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(directory: str, name: str, text: str) -> None:
    temp = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.tmp")
    try:
        with open(temp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, os.path.join(directory, name))
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


class DirectoryFileMapAdapter:
    """A :class:`FileMapAdapter` keeping each file of the map in one directory.

    ``save`` replaces every file atomically and removes files the map no
    longer has; blocking file I/O runs in a worker thread, one call at a time.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = os.fspath(path)
        self._limiter = trio.CapacityLimiter(1)

    @property
    def path(self) -> str:
        """The directory."""
        return self._path

    def _names(self) -> builtins.list[str]:
        try:
            entries = os.listdir(self._path)
        except FileNotFoundError:
            return []
        return [
            n for n in entries if not _is_temp(n) and os.path.isfile(os.path.join(self._path, n))
        ]

    def _get(self) -> dict[str, str]:
        files = {}
        for name in self._names():
            path = os.path.join(self._path, name)
            try:
                with open(path, encoding="utf-8") as f:
                    files[name] = f.read()
            except UnicodeDecodeError as exc:
                raise CorruptDataError(f"{path} is not UTF-8 text: {exc}") from None
        return files

    def _save(self, files: dict[str, str]) -> None:
        for name in files:
            _check_file_name(name, "file name")
        os.makedirs(self._path, exist_ok=True)
        stale = set(self._names()) - set(files)
        for name, text in files.items():
            _write_atomic(self._path, name, text)
        for name in stale:
            os.unlink(os.path.join(self._path, name))
        _fsync_dir(self._path)

    def _delete(self) -> None:
        names = self._names()
        for name in names:
            os.unlink(os.path.join(self._path, name))
        if names:
            _fsync_dir(self._path)

    async def get(self) -> dict[str, str]:
        """Every file of the directory (an absent directory is an empty map)."""
        return await trio.to_thread.run_sync(self._get, limiter=self._limiter)

    async def save(self, files: dict[str, str]) -> None:
        """Replace the directory's files with ``files``, each atomically and durably."""
        await trio.to_thread.run_sync(self._save, dict(files), limiter=self._limiter)

    async def delete(self) -> None:
        """Remove every file of the map."""
        await trio.to_thread.run_sync(self._delete, limiter=self._limiter)


@asynccontextmanager
async def open_directory_adapter(
    path: str | os.PathLike[str],
) -> AsyncIterator[DirectoryFileMapAdapter]:
    """A :class:`DirectoryFileMapAdapter` on ``path``, created if missing."""
    fspath = os.fspath(path)
    await trio.to_thread.run_sync(lambda: os.makedirs(fspath, exist_ok=True))
    yield DirectoryFileMapAdapter(fspath)
