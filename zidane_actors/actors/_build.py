"""Building sessions: a new one, one restored from its data, one loaded with its heals, and the
standalone runner of sessions made outside a host.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import attrs
import msgspec
import trio

from ..errors import (
    ConflictError,
    StaleSessionError,
    ValidationError,
)
from ..model import (
    RUN_OWNER_HOLD_MS,
    JsonValue,
    SessionData,
    check_model,
    demote_stale_running_status,
    validate_id,
)
from ..stores._protocol import (
    FullSessionStore,
    Revision,
    SessionStore,
    VersionedStore,
    is_versioned,
)
from ..wire import (
    PairingDrop,
    drop_invalid_tool_pairings,
)
from ._actor import Actor
from ._args import _checked_agent, _json_copy
from ._branches import generated_session_id
from ._commands import _SessionCommand
from ._repairs import _HeldMarker, _lane_for_run
from ._session import Session
from ._store_actor import StoreActor
from ._view import Clock, _History, _wall_clock, session_caps

__all__ = ["create_session", "load_session"]

# -- building sessions ----------------------------------------------------------------------


async def _new_session_data(
    store: SessionStore | None,
    *,
    id: str | None,
    agent_id: str | None,
    metadata: Mapping[str, JsonValue] | None,
    project_root: str | None,
    clock: Clock,
    caps: frozenset[str] | None = None,
) -> tuple[SessionData, int | None]:
    """A fresh session's data, persisted (header only) when there is a store, and its rev.

    ``caps`` are the store's capabilities when the caller knows them already (a host).
    """
    caps = session_caps(store, caps)
    if id is None:
        id = await generated_session_id(store, caps)
    validate_id(id)
    if agent_id is not None:
        _checked_agent(agent_id)
    meta = _json_copy(dict(metadata or {}), "metadata", "$.metadata", 0)
    now = clock()
    data = SessionData(
        id=id,
        created_at=now,
        updated_at=now,
        metadata=meta,
        agent_id=agent_id,
        project_root=project_root,
    )
    if store is None:
        return data, None
    held = ConflictError(f"the store already holds a session {id!r}")
    if is_versioned(caps):  # created only while absent: one conditional write decides
        try:
            revision = await store.save(data, expected_rev=0)  # type: ignore[call-arg]
        except StaleSessionError:
            raise held from None
        return data, revision.after if type(revision) is Revision else None
    if "get_meta" in caps:
        exists = await cast(FullSessionStore, store).get_meta(id) is not None
    else:
        exists = await store.load(id) is not None
    if exists:
        raise held
    await store.save(data)
    return data, None


async def _restored_session_data(
    store: SessionStore | None,
    data: SessionData,
    *,
    on_pairing_drop: Callable[[PairingDrop], None] | None,
    caps: frozenset[str] | None = None,
) -> tuple[SessionData, _History | None, int | None]:
    """``create_session(_data=...)``: a session restored from its data, nothing written.

    Its tool pairings are healed in memory (``on_pairing_drop`` told each
    deletion), and its next save writes the whole document (a bulk save),
    conditional on the store's rev read now (``0``: the store holds no such
    session, so the save creates it only while it is still absent).
    """
    if not isinstance(data, SessionData):
        raise ValidationError(
            f"_data must be a SessionData, got {type(data).__name__}", path="$._data"
        )
    validate_id(data.id)
    check_model(data, what="session data", path="$._data")
    healed = drop_invalid_tool_pairings(
        data.turns, lane_for_run=_lane_for_run(data.runs), on_drop=on_pairing_drop
    )
    pre = (data.turns, data.runs)
    if healed is not data.turns:
        data = msgspec.structs.replace(data, turns=tuple(healed))
    caps = session_caps(store, caps)
    rev = None
    if store is not None and is_versioned(caps):
        rev = await cast(VersionedStore, store).get_rev(data.id) or 0
    return data, (pre if store is not None else None), rev


async def _loaded_session_data(
    store: SessionStore,
    session_id: str,
    *,
    persist_heal: bool,
    on_pairing_drop: Callable[[PairingDrop], None] | None,
    clock: Clock,
    caps: frozenset[str] | None = None,
) -> tuple[SessionData, _History | None, int | None, _HeldMarker | None] | None:
    """The stored data with load-time heals applied, the stored history a bulk save armed by
    an unsaved heal replaces, its rev, and the run marker memory shows demoted while the
    store keeps it.

    Memory always shows the stale-running demotion; the store gets it only
    through ``demote_stale_run``, which writes when the marker is stale by the
    claim rule at ``clock()`` (horizon ``RUN_OWNER_HOLD_MS`` back) and still
    unchanged. A store without it keeps its marker (the next claim judges it).
    On a versioned store the heal is saved only over the rev it was computed
    from (a write in between makes the load start over), and a written
    demotion is read back, so the rev answered is the one memory reflects.
    """
    validate_id(session_id)
    caps = session_caps(store, caps)
    versioned = is_versioned(caps)
    for _ in range(8):
        rev: int | None = None
        if versioned:
            loaded = await cast(VersionedStore, store).load_versioned(session_id)
            if loaded is None:
                return None
            raw, rev = loaded
        else:
            found = await store.load(session_id)
            if found is None:
                return None
            raw = found
        data = demote_stale_running_status(raw)
        demotion = data is not raw
        pre: _History | None = None
        healed = drop_invalid_tool_pairings(
            data.turns, lane_for_run=_lane_for_run(data.runs), on_drop=on_pairing_drop
        )
        if healed is not data.turns:
            data = msgspec.structs.replace(data, turns=tuple(healed))
            if persist_heal:
                # The stored status and runs, so the heal never writes over a live run marker.
                stored = msgspec.structs.replace(raw, turns=data.turns)
                if rev is None:
                    await store.save(stored)
                else:
                    try:
                        revision = await store.save(stored, expected_rev=rev)  # type: ignore[call-arg]
                    except StaleSessionError:
                        continue  # another writer moved it: heal what it holds now
                    rev = revision.after if type(revision) is Revision else None
            else:
                pre = (raw.turns, raw.runs)
        if demotion and persist_heal and "demote_stale_run" in caps:
            now = clock()
            demoted = await cast(FullSessionStore, store).demote_stale_run(
                session_id, stale_at=now - RUN_OWNER_HOLD_MS, now=now
            )
            if demoted:
                if versioned:
                    continue  # read the demoted state back with its rev
                demotion = False  # the store holds what memory shows
        return data, pre, rev, (_HeldMarker.of(raw, data) if demotion else None)
    raise StaleSessionError(
        f"session {session_id!r} kept changing while it was loaded", expected=None, actual=None
    )


async def _run_after(previous: Actor[Any] | None, actor: Actor[Any]) -> None:
    """Run ``actor`` once ``previous`` (a closed actor finishing its last command) stopped.

    Commands sent meanwhile wait in the new mailbox, so one session never has
    two actors applying commands at once.
    """
    if previous is not None:
        await previous.wait_stopped()
    await actor.run()


def _close_actor(session: Session) -> None:
    if session._actor is not None:
        session._actor.close()


@attrs.define
class _StandaloneRunner:
    """Sessions made outside a host: an actor per burst of commands, as a trio system task.

    The actor stops whenever its mailbox runs empty, so a dropped session
    leaves no task behind; the next mutation starts a new one.
    """

    mailbox_size: int = 64

    def actor_for(self, session: Session) -> Actor[_SessionCommand[Any]]:
        actor = session._live_actor()
        if actor is None:
            previous = session._actor
            actor = session._new_actor(mailbox_size=self.mailbox_size, on_idle=_close_actor)
            trio.lowlevel.spawn_system_task(_run_after, previous, actor)
        return actor

    def direct_store(self, session: Session) -> StoreActor | None:
        # Standalone sessions write through their actor (their store is no store actor).
        return None

    def crashed(self, session: Session, exc: BaseException) -> None:
        pass

    def check_open(self) -> None:
        pass


async def create_session(
    store: SessionStore | None = None,
    *,
    id: str | None = None,
    agent_id: str | None = None,
    metadata: Mapping[str, JsonValue] | None = None,
    project_root: str | None = None,
    clock: Clock | None = None,
    _data: SessionData | None = None,
    on_pairing_drop: Callable[[PairingDrop], None] | None = None,
) -> Session:
    """A new session outside any host (its actor is a trio system task).

    Uses ``store.generate_session_id`` when the store has it and no ``id`` is
    given; with a store the new header is saved at once, and an id the store
    already holds raises :class:`ConflictError`. ``_data`` restores a
    session from its data instead (``id``, ``agent_id``, ``metadata`` and
    ``project_root`` are then ignored, as the spec says): its tool pairings
    are healed in memory (``on_pairing_drop`` is told each deletion; fresh
    sessions never heal), nothing is written, and its next save writes it
    whole, conditional on the store's rev at the restore.
    """
    now = clock or _wall_clock
    if _data is not None:
        data, pre, rev = await _restored_session_data(store, _data, on_pairing_drop=on_pairing_drop)
        return Session(data, store=store, runner=_StandaloneRunner(), clock=now, pre=pre, rev=rev)
    data, rev = await _new_session_data(
        store, id=id, agent_id=agent_id, metadata=metadata, project_root=project_root, clock=now
    )
    return Session(data, store=store, runner=_StandaloneRunner(), clock=now, rev=rev)


async def load_session(
    store: SessionStore,
    session_id: str,
    *,
    persist_heal: bool = True,
    on_pairing_drop: Callable[[PairingDrop], None] | None = None,
    clock: Clock | None = None,
) -> Session | None:
    """Load a session outside any host; ``None`` when the store has none with that id.

    A stored ``running`` status is demoted in memory (``idle``, running runs
    ``aborted``); unless ``persist_heal=False`` the store gets the demotion
    through ``demote_stale_run`` only when the marker is stale by the claim
    rule at ``clock()`` (so a live owner keeps it). Invalid tool pairings are
    dropped (persisted with a bulk save, or armed for the next
    :meth:`Session.save` when ``persist_heal=False``).
    """
    now = clock or _wall_clock
    loaded = await _loaded_session_data(
        store, session_id, persist_heal=persist_heal, on_pairing_drop=on_pairing_drop, clock=now
    )
    if loaded is None:
        return None
    data, pre, rev, held = loaded
    return Session(
        data, store=store, runner=_StandaloneRunner(), clock=now, pre=pre, rev=rev, held=held
    )
