"""Moving everything a store holds to another store or a JSONL file (the CLI's copy,
export and import), and checking that what arrived is what left.

A session travels as a :class:`Bundle`: its document (turns, runs, metadata, a
stored ``running`` with its owner), its artifacts and its send-request
records, each written back exactly (``put_send_request`` keeps a record's
``createdAt`` and result; the status is restored after the snapshot save,
which never writes ``running``). Schedules and their fire history travel
beside the sessions. A target that lacks a method the data needs is refused
with the kind and the count that would be lost, before that session is written.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Final

import attrs
import msgspec

from .errors import UnsupportedOperationError, ValidationError
from .model import (
    FIRE_HISTORY,
    ArtifactFilter,
    Schedule,
    ScheduleFire,
    SendRequestRecord,
    SessionArtifact,
    SessionData,
    SessionTurn,
    convert,
    decode,
    encode,
    encode_str,
    validate_id,
)
from .stores import SessionStore, store_capabilities

__all__ = ["KINDS", "Bundle", "Counts", "JsonlReader", "bundle_lines", "read_bundle"]

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


def _capable(store: object, method: str, kind: str, count: int, where: str) -> Any:
    """``store``'s optional ``method``, or a refusal saying what would be lost."""
    if method in store_capabilities(store):
        return getattr(store, method)
    raise UnsupportedOperationError(
        f"the {where} store cannot hold {kind} ({method} is missing): {count} would be lost"
    )


async def read_bundle(store: SessionStore, session_id: str) -> Bundle | None:
    """One session's bundle, or ``None`` when the store has no such session."""
    data = await store.load(session_id)
    if data is None:
        return None
    caps = store_capabilities(store)
    artifacts: tuple[SessionArtifact, ...] = ()
    if "list_artifacts" in caps:
        found = await store.list_artifacts(  # type: ignore[attr-defined]
            ArtifactFilter(session_id=session_id)
        )
        artifacts = tuple(sorted(found, key=lambda a: (a.created_at, a.id)))
    requests: tuple[SendRequestRecord, ...] = ()
    if "list_send_requests" in caps:
        requests = tuple(await store.list_send_requests(session_id))  # type: ignore[attr-defined]
    return Bundle(data=data, artifacts=artifacts, send_requests=requests)


async def write_bundle(store: SessionStore, bundle: Bundle) -> None:
    """Write ``bundle`` into ``store`` exactly; a missing capability refuses before writing."""
    sid = bundle.data.id
    upsert = put = None
    if bundle.artifacts:
        upsert = _capable(store, "upsert_artifact", "artifacts", len(bundle.artifacts), "target")
    if bundle.send_requests:
        count = len(bundle.send_requests)
        put = _capable(store, "put_send_request", "send requests", count, "target")
    await store.save(bundle.data)
    for artifact in bundle.artifacts:
        assert upsert is not None
        await upsert(artifact)
    for record in bundle.send_requests:
        assert put is not None
        await put(sid, record)
    if bundle.data.status == "running":  # a snapshot save never writes running: restore it
        await store.update_status(
            sid, "running", owner=bundle.data.run_owner, preserve_updated_at=True
        )
    if bundle.artifacts:  # an artifact write may touch the header: put its time back
        await store.update_status(sid, bundle.data.status, preserve_updated_at=True)


async def schedules_of(store: SessionStore) -> list[tuple[Schedule, list[ScheduleFire]]]:
    """Every schedule with its fire history, oldest fire first."""
    caps = store_capabilities(store)
    if "list_schedules" not in caps:
        return []
    out = []
    for schedule in await store.list_schedules():  # type: ignore[attr-defined]
        fires: list[ScheduleFire] = []
        if "list_schedule_fires" in caps:
            fires = await store.list_schedule_fires(  # type: ignore[attr-defined]
                schedule.id, FIRE_HISTORY
            )
        out.append((msgspec.structs.replace(schedule, last_fire=None), fires[::-1]))
    return out


async def write_schedules(
    store: SessionStore, schedules: Iterable[tuple[Schedule, list[ScheduleFire]]]
) -> None:
    """Write schedules and their fires (oldest first) into ``store``."""
    schedules = list(schedules)
    if not schedules:
        return
    save = _capable(store, "save_schedule", "schedules", len(schedules), "target")
    fires = sum(len(f) for _, f in schedules)
    record = _capable(store, "record_schedule_fire", "fires", fires, "target") if fires else None
    for schedule, history in schedules:
        await save(schedule)
        for fire in history:
            assert record is not None
            await record(fire)


async def stored_counts(store: SessionStore) -> tuple[Counts, dict[str, bytes]]:
    """What ``store`` holds, counted, and each session's bundle bytes (for a verification)."""
    counts = Counts()
    encoded: dict[str, bytes] = {}
    for sid in await store.list():
        bundle = await read_bundle(store, sid)
        if bundle is not None:
            counts.add_bundle(bundle)
            encoded[sid] = bundle.encoded()
    for _, fires in await schedules_of(store):
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
    "turn": SessionTurn,
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
        envelope = decode(line, dict[str, Any], what=f"line {n}")
        if len(envelope) != 1 or not envelope.keys() <= _LINE_TYPES.keys():
            kinds = ", ".join(f'{{"{k}": …}}' for k in _LINE_TYPES)
            raise ValidationError(f"each line must be one of {kinds}")
        ((kind, raw),) = envelope.items()
        value = convert(raw, _LINE_TYPES[kind], what=kind)
        if kind == "session":
            validate_id(value.id)
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
