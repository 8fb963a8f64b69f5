"""Moving everything a store holds to another store or a JSONL file (the CLI's copy,
export and import), and checking that what arrived is what left.

A session travels as a :class:`Bundle`: its document (turns, runs, metadata, a
stored ``running`` with its owner), its artifacts and its send-request
records, each written back exactly (``put_send_request`` keeps a record's
``createdAt`` and result; the status and its owner are set last, after the
snapshot save, which never writes ``running``). Schedules and their fire
history travel beside the sessions.

A :class:`Writer` refuses up front what the target cannot take (a method the
data needs, a second session for a file map, an id the target already holds
without ``replace``), naming the kind and the count that would be lost; then
writes each session and each schedule all-or-nothing, verified byte for byte.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, Final

import attrs
import msgspec
import trio

from . import model
from .errors import (
    ConflictError,
    StaleSessionError,
    StoreError,
    UnsupportedOperationError,
    ValidationError,
)
from .model import (
    Schedule,
    ScheduleFire,
    SendRequestRecord,
    SessionArtifact,
    SessionData,
    encode,
    encode_str,
)
from .stores import FileMapStore, SessionStore, store_capabilities
from .stores._protocol import is_versioned

__all__ = [
    "KINDS",
    "Bundle",
    "Counts",
    "JsonlReader",
    "PartialWriteError",
    "Writer",
    "bundle_lines",
    "read_bundle",
]

KINDS: Final = ("sessions", "turns", "runs", "artifacts", "sendRequests", "schedules", "fires")
"""What a transfer counts, in the order the summary prints it."""


@attrs.frozen
class Bundle:
    """Everything a store holds for one session."""

    data: SessionData
    artifacts: tuple[SessionArtifact, ...] = ()
    send_requests: tuple[SendRequestRecord, ...] = ()

    def encoded(self) -> bytes:
        """The exact bytes of the bundle (what a verification compares)."""
        return encode([self.data, list(self.artifacts), list(self.send_requests)])


@attrs.define
class Counts:
    """How many of each kind a transfer read or found."""

    values: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(KINDS, 0))

    def add_bundle(self, bundle: Bundle) -> None:
        self.values["sessions"] += 1
        self.values["turns"] += len(bundle.data.turns)
        self.values["runs"] += len(bundle.data.runs)
        self.values["artifacts"] += len(bundle.artifacts)
        self.values["sendRequests"] += len(bundle.send_requests)

    def add_schedule(self, fires: int) -> None:
        self.values["schedules"] += 1
        self.values["fires"] += fires


def _capable(caps: frozenset[str], method: str, kind: str, count: int, where: str) -> None:
    """Refuse, saying what would be lost, when ``caps`` lacks ``method``."""
    if count and method not in caps:
        raise UnsupportedOperationError(
            f"the {where} store cannot hold {kind} ({method} is missing): {count} would be lost"
        )


async def capabilities(store: object) -> frozenset[str]:
    """The optional methods ``store`` has; a remote store asks its server (its backing store)."""
    caps = store_capabilities(store)
    ask = getattr(store, "capabilities", None)
    if callable(ask) and inspect.iscoroutinefunction(ask):
        caps &= frozenset(await ask())
    return caps


def holds_one_session(store: object) -> bool:
    """Whether ``store`` holds at most one session (a file map: its directory is the session)."""
    return isinstance(store, FileMapStore)


async def read_bundle(
    store: SessionStore, session_id: str, caps: frozenset[str] | None = None
) -> Bundle | None:
    """One session's bundle, or ``None`` when the store has no such session."""
    data = await store.load(session_id)
    if data is None:
        return None
    if caps is None:
        caps = store_capabilities(store)
    artifacts: tuple[SessionArtifact, ...] = ()
    if "list_artifacts" in caps:
        found = await store.list_artifacts(  # type: ignore[attr-defined]
            model.ArtifactFilter(session_id=session_id)
        )
        artifacts = tuple(sorted(found, key=lambda a: (a.created_at, a.id)))
    requests: tuple[SendRequestRecord, ...] = ()
    if "list_send_requests" in caps:
        requests = tuple(await store.list_send_requests(session_id))  # type: ignore[attr-defined]
    return Bundle(data=data, artifacts=artifacts, send_requests=requests)


async def schedules_of(
    store: SessionStore, caps: frozenset[str] | None = None
) -> list[tuple[Schedule, list[ScheduleFire]]]:
    """Every schedule with its fire history, oldest fire first."""
    if caps is None:
        caps = store_capabilities(store)
    if "list_schedules" not in caps:
        return []
    out = []
    for schedule in await store.list_schedules():  # type: ignore[attr-defined]
        out.append(await _with_fires(store, caps, schedule))
    return out


async def _with_fires(
    store: SessionStore, caps: frozenset[str], schedule: Schedule
) -> tuple[Schedule, list[ScheduleFire]]:
    fires: list[ScheduleFire] = []
    if "list_schedule_fires" in caps:
        fires = await store.list_schedule_fires(  # type: ignore[attr-defined]
            schedule.id, model.FIRE_HISTORY
        )
    return msgspec.structs.replace(schedule, last_fire=None), fires[::-1]


class PartialWriteError(StoreError):
    """A failed write could not be undone: the target may hold part of it (stop there)."""


def _ids(ids: Iterable[str], more_than: int = 1) -> str:
    """``'a'``, or ``'a' (and 2 more)``: the first id and how many others."""
    listed = list(ids)
    more = f" (and {len(listed) - 1} more)" if len(listed) > more_than else ""
    return f"{listed[0]!r}{more}"


@attrs.define
class Writer:
    """Writes sessions and schedules into a target store, exactly or not at all.

    What the target cannot take is refused up front (:meth:`check`), before
    anything is written. Each session (:meth:`put`) and each schedule
    (:meth:`put_schedule`) is then all-or-nothing: it is written, read back
    and compared byte for byte; on any failure what was written of it is
    removed again (and, under ``replace``, the target's previous version is
    written back), so the target holds the whole of it or nothing of it. An
    existing id is refused unless ``replace``; with it, the target's version
    is replaced whole (its artifacts and send-request ids too, so what reads
    back is exactly what was written). A failure that cannot be undone raises
    :class:`PartialWriteError`.

    A session's header is written first (a snapshot save, which never writes
    ``running``), then its artifacts and send-request records; a stored
    ``running`` and its owner are set last, in one status write naming that
    owner, so nothing after it can move them.
    """

    store: SessionStore
    caps: frozenset[str]
    replace: bool
    where: str = "target store"

    @classmethod
    async def open(cls, store: SessionStore, *, replace: bool, where: str) -> Writer:
        """A writer into ``store``, with the capabilities it really has."""
        return cls(store=store, caps=await capabilities(store), replace=replace, where=where)

    # -- refusals up front -----------------------------------------------------------------

    async def check(
        self,
        ids: Sequence[str],
        *,
        artifacts: int,
        send_requests: int,
        schedules: Sequence[Schedule],
        fires: int,
    ) -> None:
        """Refuse what this target cannot take; nothing is written either way."""
        for kind, given in (("session", ids), ("schedule", [s.id for s in schedules])):
            twice = sorted({i for i in given if given.count(i) > 1})
            if twice:
                raise ValidationError(f"{kind} {_ids(twice)} is given more than once")
        _capable(self.caps, "upsert_artifact", "artifacts", artifacts, "target")
        _capable(self.caps, "put_send_request", "send requests", send_requests, "target")
        _capable(self.caps, "save_schedule", "schedules", len(schedules), "target")
        _capable(self.caps, "record_schedule_fire", "fires", fires, "target")
        if holds_one_session(self.store):
            if len(ids) > 1:
                raise UnsupportedOperationError(
                    f"the target store is a file map, which holds one session: of the"
                    f" {len(ids)} sessions given, {len(ids) - 1} would be lost (one session"
                    f" per store; export each, sessions export ID, and import it into its"
                    f" own file map)"
                )
            held = [sid for sid in await self.store.list() if sid not in ids]
            if held and ids:
                raise ConflictError(
                    f"this file-map store holds session {held[0]!r}; it cannot store"
                    f" {ids[0]!r} (one session per store)"
                )
        if not self.replace:
            taken = [sid for sid in ids if await self._exists(sid)]
            if taken:
                raise ValidationError(
                    f"session {_ids(taken)} already exists in the {self.where} (pass --replace)"
                )
            if schedules and "list_schedules" in self.caps:
                held_ids = {s.id for s in await self.store.list_schedules()}  # type: ignore[attr-defined]
                clash = [s.id for s in schedules if s.id in held_ids]
                if clash:
                    raise ValidationError(
                        f"schedule {_ids(clash)} already exists in the {self.where}"
                        " (pass --replace)"
                    )

    async def _exists(self, session_id: str) -> bool:
        if "get_rev" in self.caps:
            return await self.store.get_rev(session_id) is not None  # type: ignore[attr-defined]
        return await self.store.load(session_id) is not None

    # -- sessions ----------------------------------------------------------------------------

    async def put(self, bundle: Bundle) -> None:
        """Write ``bundle`` so the target reads back exactly it, or leave the target as it was."""
        sid = bundle.data.id
        _capable(self.caps, "upsert_artifact", "artifacts", len(bundle.artifacts), "target")
        count = len(bundle.send_requests)
        _capable(self.caps, "put_send_request", "send requests", count, "target")
        previous = await read_bundle(self.store, sid, self.caps)
        if previous is not None:
            if not self.replace:
                raise ValidationError(
                    f"session {sid!r} already exists in the {self.where} (pass --replace)"
                )
            await self.store.delete(sid)
        written = False
        try:
            await self._create(bundle.data)
            written = True
            await self._fill(bundle)
            await self._verify(bundle)
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                await self._undo(sid, written, previous, exc)
            raise

    async def _create(self, data: SessionData) -> None:
        """Save ``data`` as a new session: refused, writing nothing, if one appeared meanwhile."""
        if not is_versioned(self.caps):
            await self.store.save(data)
            return
        try:
            await self.store.save(data, expected_rev=0)  # type: ignore[call-arg]
        except StaleSessionError:
            raise ValidationError(
                f"session {data.id!r} already exists in the {self.where} (pass --replace):"
                " another writer created it during this write"
            ) from None

    async def _fill(self, bundle: Bundle) -> None:
        """A saved session's artifacts, send-request records, then its ``running`` marker."""
        data = bundle.data
        for artifact in bundle.artifacts:
            await self.store.upsert_artifact(artifact)  # type: ignore[attr-defined]
        for record in bundle.send_requests:
            await self.store.put_send_request(data.id, record)  # type: ignore[attr-defined]
        if data.status == "running":  # a snapshot save never writes running: the owner, exactly
            await self.store.update_status(
                data.id, "running", owner=data.run_owner, preserve_updated_at=True
            )

    async def _verify(self, bundle: Bundle) -> None:
        back = await read_bundle(self.store, bundle.data.id, self.caps)
        if back is None or back.encoded() != bundle.encoded():
            raise StoreError(f"session {bundle.data.id!r} reads back different in the {self.where}")

    async def _undo(
        self, sid: str, written: bool, previous: Bundle | None, cause: BaseException
    ) -> None:
        """Remove what was written of session ``sid``; put the target's previous version back."""
        try:
            if written:
                await self.store.delete(sid)
            if previous is not None:
                await self._create(previous.data)
                await self._fill(previous)
                await self._verify(previous)
        except Exception as exc:
            lost = (
                "its previous version in the target is gone or incomplete"
                if previous is not None
                else "the target may hold part of it"
            )
            raise PartialWriteError(
                f"session {sid!r}: {cause}; undoing the write failed too ({exc}): {lost}"
            ) from exc

    # -- schedules ---------------------------------------------------------------------------

    async def put_schedule(self, schedule: Schedule, fires: Sequence[ScheduleFire]) -> None:
        """Write a schedule and its fires (oldest first) exactly, or leave the target as it was."""
        _capable(self.caps, "save_schedule", "schedules", 1, "target")
        _capable(self.caps, "record_schedule_fire", "fires", len(fires), "target")
        previous = await self._schedule(schedule.id)
        if previous is not None:
            if not self.replace:
                raise ValidationError(
                    f"schedule {schedule.id!r} already exists in the {self.where} (pass --replace)"
                )
            _capable(self.caps, "delete_schedule", "a replaced schedule", 1, "target")
            await self.store.delete_schedule(schedule.id)  # type: ignore[attr-defined]
        written = False
        try:
            await self.store.save_schedule(schedule)  # type: ignore[attr-defined]
            written = True
            await self._fill_schedule(schedule, fires)
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                await self._undo_schedule(schedule.id, written, previous, exc)
            raise

    async def _schedule(self, schedule_id: str) -> tuple[Schedule, list[ScheduleFire]] | None:
        if "list_schedules" not in self.caps:
            return None
        for held in await self.store.list_schedules():  # type: ignore[attr-defined]
            if held.id == schedule_id:
                return await _with_fires(self.store, self.caps, held)
        return None

    async def _fill_schedule(self, schedule: Schedule, fires: Sequence[ScheduleFire]) -> None:
        """A saved schedule's fires, then the schedule read back and compared."""
        for fire in fires:
            await self.store.record_schedule_fire(fire)  # type: ignore[attr-defined]
        if "list_schedules" in self.caps:
            back = await self._schedule(schedule.id)
            wrote = (msgspec.structs.replace(schedule, last_fire=None), list(fires))
            if back is None or encode(back) != encode(wrote):
                raise StoreError(
                    f"schedule {schedule.id!r} reads back different in the {self.where}"
                )

    async def _undo_schedule(
        self,
        schedule_id: str,
        written: bool,
        previous: tuple[Schedule, list[ScheduleFire]] | None,
        cause: BaseException,
    ) -> None:
        try:
            if written and "delete_schedule" in self.caps:
                await self.store.delete_schedule(schedule_id)  # type: ignore[attr-defined]
            elif written:
                raise UnsupportedOperationError("the target store has no delete_schedule")
            if previous is not None:
                await self.store.save_schedule(previous[0])  # type: ignore[attr-defined]
                await self._fill_schedule(*previous)
        except Exception as exc:
            raise PartialWriteError(
                f"schedule {schedule_id!r}: {cause}; undoing the write failed too ({exc})"
            ) from exc


async def stored_counts(
    store: SessionStore, caps: frozenset[str] | None = None
) -> tuple[Counts, dict[str, bytes]]:
    """What ``store`` holds, counted, and each session's bundle bytes (for a verification)."""
    counts = Counts()
    encoded: dict[str, bytes] = {}
    for sid in await store.list():
        bundle = await read_bundle(store, sid, caps)
        if bundle is not None:
            counts.add_bundle(bundle)
            encoded[sid] = bundle.encoded()
    for _, fires in await schedules_of(store, caps):
        counts.add_schedule(len(fires))
    return counts, encoded


def bundle_lines(bundle: Bundle) -> Iterable[str]:
    """A bundle as JSONL export lines (the session header first, then what it holds)."""
    yield encode_str({"session": msgspec.structs.replace(bundle.data, turns=())})
    for turn in bundle.data.turns:
        yield encode_str({"turn": turn})
    for artifact in bundle.artifacts:
        yield encode_str({"artifact": artifact})
    for record in bundle.send_requests:
        yield encode_str({"sendRequest": record})


def schedule_lines(schedule: Schedule, fires: Iterable[ScheduleFire]) -> Iterable[str]:
    """A schedule and its fires as JSONL export lines."""
    yield encode_str({"schedule": schedule})
    for fire in fires:
        yield encode_str({"fire": fire})


_LINE_TYPES: Final[Mapping[str, type[Any]]] = {
    "session": SessionData,
    "turn": model.SessionTurn,
    "artifact": SessionArtifact,
    "sendRequest": SendRequestRecord,
    "schedule": Schedule,
    "fire": ScheduleFire,
}


@attrs.define
class JsonlReader:
    """Bundles and schedules of a JSONL export; every bad line is reported with its number."""

    path: str
    bundles: list[Bundle] = attrs.field(factory=list)
    schedules: list[tuple[Schedule, list[ScheduleFire]]] = attrs.field(factory=list)
    errors: list[str] = attrs.field(factory=list)

    def read(self) -> None:
        current: dict[str, Any] | None = None
        try:
            with open(self.path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        current = self._line(line, n, current)
                    except ValidationError as exc:
                        self.errors.append(f"{self.path}:{n}: {exc}")
        except UnicodeDecodeError as exc:
            raise ValidationError(
                f"{self.path}: not UTF-8 text ({exc.reason}): a JSONL export is UTF-8"
            ) from None
        self._flush(current)
        if self.errors:
            more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
            raise ValidationError(self.errors[0] + more)

    def _line(self, line: str, n: int, current: dict[str, Any] | None) -> dict[str, Any] | None:
        envelope = model.decode(line, dict[str, Any], what=f"line {n}")
        if len(envelope) != 1 or not envelope.keys() <= _LINE_TYPES.keys():
            kinds = ", ".join(f'{{"{k}": …}}' for k in _LINE_TYPES)
            raise ValidationError(f"each line must be one of {kinds}")
        ((kind, raw),) = envelope.items()
        value = model.convert(raw, _LINE_TYPES[kind], what=kind)
        if kind == "session":
            model.validate_id(value.id)
            self._flush(current)
            return {"data": value, "turns": [], "artifacts": [], "sendRequests": []}
        if kind == "schedule":
            self._flush(current)
            self.schedules.append((value, []))
            return None
        if kind == "fire":
            if not self.schedules or current is not None:
                raise ValidationError("a fire line comes right after its schedule's lines")
            self.schedules[-1][1].append(value)
            return None
        if current is None:
            raise ValidationError(f"a {kind} line comes before any session line")
        current[
            {"turn": "turns", "artifact": "artifacts", "sendRequest": "sendRequests"}[kind]
        ].append(value)
        return current

    def _flush(self, current: dict[str, Any] | None) -> None:
        if current is None:
            return
        data: SessionData = current["data"]
        self.bundles.append(
            Bundle(
                data=msgspec.structs.replace(data, turns=data.turns + tuple(current["turns"])),
                artifacts=tuple(current["artifacts"]),
                send_requests=tuple(current["sendRequests"]),
            )
        )


async def iterate_bundles(store: SessionStore) -> AsyncIterator[tuple[int, int, Bundle]]:
    """``(n, total, bundle)`` for every session of ``store``, most recently updated first."""
    ids = await store.list()
    for n, sid in enumerate(ids, 1):
        bundle = await read_bundle(store, sid)
        if bundle is not None:
            yield n, len(ids), bundle
