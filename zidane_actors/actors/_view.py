"""A session's memory: what it shows of the store, the caller's unsaved intents over it, and
the one rule that reconciles the two.

Memory is the store's state as last read (with the rev it was read at),
plus the caller's intents: metadata keys set or removed, header fields set,
and a history replacement together with the epoch of the view it was
computed from. A fold replaces the first and keeps the second; a fold that
finds another writer's change starts a new epoch, and the turns and runs a
caller may still hold from the old one are retired with it, by identity.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeAlias, cast

import msgspec

from ..model import (
    RUN_OWNER_HOLD_MS,
    AppendTurnsOptions,
    SessionData,
    SessionRun,
    SessionTurn,
    demote_stale_running_status,
    fresh_turns,
    upsert_runs,
)
from ..model._frozen import FrozenView
from ..stores._protocol import (
    FullSessionStore,
    Revision,
    SessionStore,
    VersionedStore,
    is_versioned,
    store_capabilities,
)
from ._repairs import _HeldMarker

Clock = Callable[[], int]
"""A time source answering epoch milliseconds."""


def _wall_clock() -> int:
    return time.time_ns() // 1_000_000


def session_caps(store: SessionStore | None, caps: frozenset[str] | None) -> frozenset[str]:
    """The capabilities a session works with: ``caps`` when the caller knows them already
    (a host), else ``store``'s; none without a store."""
    if caps is not None:
        return caps
    return store_capabilities(store) if store is not None else frozenset()


_History: TypeAlias = tuple[tuple[SessionTurn, ...], tuple[SessionRun, ...]]
"""Turns and runs: what a pending history replacement replaces in the store."""

_NO_INDEX: Final[dict[str, SessionTurn]] = {}
"""Placeholder of a session's turn index before its first append (never mutated)."""
_NO_RETIRED: Final[dict[int, tuple[weakref.ref[Any], int]]] = {}
"""Placeholder of a session's retired values before its first retirement (never mutated)."""


class _View:
    """One session's memory and its reconciliation with the store (the actor's side).

    :class:`~zidane_actors.actors.Session` is built on it; only the session's
    actor (or a write's verdict, which runs with nothing else in flight)
    changes it.
    """

    __slots__ = (
        "_bulk",
        "_caps",
        "_changed",
        "_data",
        "_edit_epoch",
        "_epoch",
        "_fields",
        "_held",
        "_indexed",
        "_known_runs",
        "_now",
        "_own_step",
        "_pre",
        "_read_epoch",
        "_retired",
        "_rev",
        "_stale",
        "_store",
        "_turn_index",
        "_view",
    )

    def __init__(
        self,
        data: SessionData,
        *,
        store: SessionStore | None,
        clock: Clock,
        pre: _History | None,
        caps: frozenset[str] | None,
        rev: int | None,
        held: _HeldMarker | None,
    ) -> None:
        self._data = data
        self._held = held
        # What the session hands out: its memory frozen, so no caller can change it.
        self._view = FrozenView()
        self._store = store
        self._caps = caps = session_caps(store, caps)
        # The store's rev memory reflects (``None``: the store keeps no versions), and
        # whether a write showed that another writer moved it since.
        self._rev = rev if is_versioned(caps) else None
        self._stale = False
        # The runs the store holds at that rev, as memory last read or had acknowledged
        # (``None``: not known): a header save sends only the runs that differ.
        self._known_runs: tuple[SessionRun, ...] | None = None
        if self._rev is not None and pre is None:
            self._known_runs = data.runs if held is None else held.restore(data).runs
        self._now = clock
        # The caller's unsaved changes, as intents a fold keeps: metadata keys set or
        # removed, header fields set, and a history replacement (``_bulk``) with the
        # epoch of the view it was computed from and the stored history it replaces.
        self._changed: tuple[str, ...] = ()
        self._fields: tuple[str, ...] = ()
        self._bulk = pre is not None
        self._pre = pre
        # Views of the history by epoch: a fold that finds another writer's change
        # starts a new one, and the turns and runs memory held until then are
        # retired with the epoch they belonged to (by identity, while a caller can
        # still hold them), so a replacement built from them is judged against it.
        self._epoch = 0
        self._edit_epoch = 0
        self._read_epoch = 0  # the epoch of the last view handed out
        self._retired = _NO_RETIRED
        # An own write moved the rev by a step its answer does not say (an artifact).
        self._own_step = False
        # Built on the first append (an idle session holds no index of its own).
        self._turn_index: dict[str, SessionTurn] = _NO_INDEX
        self._indexed: tuple[SessionTurn, ...] | None = None

    @property
    def id(self) -> str:
        """Session id."""
        return self._data.id

    def _commit(self, data: SessionData) -> None:
        self._data = data

    def _observe(self, result: object) -> None:
        """Track the store's rev through a write's :class:`Revision`.

        A write that found the rev memory reflects moves it on; any other one
        means another writer wrote in between, so memory is stale until folded.
        """
        if self._rev is None:
            return
        if type(result) is Revision and result.before == self._rev and not self._stale:
            self._rev = result.after
        else:
            self._stale = True

    async def _fold(self, *, reset: bool = False, persist_demotion: bool = False) -> None:
        """Make memory the store's state, read with its rev, under the caller's intents.

        The unsaved intents stay on top of it (metadata keys, header fields, a
        pending history replacement with its epoch); ``reset`` drops them (a
        refused save). When the store's document differs from what memory
        took it to be, another writer changed it: a new epoch starts, and the
        view's turns and runs are retired with the old one. Another process's
        ``running`` marker shows demoted, as a load shows it
        (``persist_demotion``: written too where the claim rule says it is
        stale, as a load writes it).
        """
        if self._store is None:
            return
        if self._rev is None:
            if reset:  # no versions: the store's state is all there is to go back to
                stored = await self._store.load(self.id)
                self._drop_intents()
                if stored is not None:
                    self._commit(stored)
            return
        loaded = await cast(VersionedStore, self._store).load_versioned(self.id)
        if loaded is None:  # deleted elsewhere: conditional writes keep failing
            self._stale = True
            return
        stored, rev = loaded
        # Another writer's change ends the view: any move of the rev past what memory
        # reflects, unless an own write moved it by a step its answer did not say;
        # then the document tells (unchanged: only that own step).
        same = self._holds(stored) if self._own_step else rev == self._rev
        self._own_step = False
        if not same:
            if not self._bulk:
                self._retire(self._epoch)
            self._epoch += 1
        if reset:
            self._drop_intents()
        memory = self._data
        own_runs = {r.id for r in memory.runs if r.status == "running"}
        own_owner = memory.run_owner if memory.status == "running" else None
        data = demote_stale_running_status(stored, own_runs=own_runs, own_owner=own_owner)
        held = _HeldMarker.of(stored, data) if data is not stored else None
        if self._bulk:  # the pending replacement stays; it replaces what is stored now
            self._pre = (stored.turns, stored.runs)
            data = msgspec.structs.replace(data, turns=memory.turns, runs=memory.runs)
        elif same and not reset:  # the view's turns are still the stored ones: keep them
            data = msgspec.structs.replace(data, turns=memory.turns)
        if self._changed:
            metadata = dict(data.metadata)
            for key in self._changed:
                if key in memory.metadata:
                    metadata[key] = memory.metadata[key]
                else:
                    metadata.pop(key, None)
            data = msgspec.structs.replace(data, metadata=metadata)
        if self._fields:
            data = msgspec.structs.replace(
                data, **{name: getattr(memory, name) for name in self._fields}
            )
        self._commit(data)
        self._held = held
        self._rev = rev
        self._known_runs = stored.runs
        self._stale = False
        if persist_demotion and held is not None and "demote_stale_run" in self._caps:
            now = self._now()
            if await self._full().demote_stale_run(
                self.id, stale_at=now - RUN_OWNER_HOLD_MS, now=now
            ):
                await self._fold()  # read the demoted state back with its rev

    def _holds(self, stored: SessionData) -> bool:
        """Whether ``stored`` is the document memory takes the store to hold (``updatedAt`` aside).

        Memory's unsaved intents are left out of the comparison: those fields
        are the caller's, whatever the store holds.
        """
        mine = self._snapshot()
        turns, runs = self._pre if self._bulk and self._pre is not None else (mine.turns, mine.runs)
        if (
            stored.turns != turns
            or stored.runs != runs
            or stored.status != mine.status
            or stored.run_owner != mine.run_owner
            or stored.created_at != mine.created_at
            or stored.project_root != mine.project_root
            or stored.extra_fields != mine.extra_fields
        ):
            return False
        if "agent_id" not in self._fields and stored.agent_id != mine.agent_id:
            return False
        theirs, ours = stored.metadata, mine.metadata
        changed = self._changed
        if not changed:
            return theirs == ours
        return {k: v for k, v in theirs.items() if k not in changed} == {
            k: v for k, v in ours.items() if k not in changed
        }

    def _unsent_runs(self, runs: tuple[SessionRun, ...]) -> tuple[SessionRun, ...]:
        """Those of ``runs`` the store is not known to hold as they are (all when not known).

        A run unchanged since the store last showed or acknowledged it is the
        very value memory holds (runs are frozen); one rebuilt equal counts as
        held too. A header save upserts and never deletes, so sending only
        these leaves the store as sending all would, at the rev it expects.
        """
        known = self._known_runs
        if known is None:
            return runs
        if len(known) == len(runs) and all(a is b for a, b in zip(known, runs, strict=True)):
            return ()
        held = {r.id: r for r in known}
        return tuple(r for r in runs if (k := held.get(r.id)) is not r and k != r)

    def _acknowledge_runs(
        self,
        before: tuple[SessionRun, ...],
        after: tuple[SessionRun, ...],
        written: tuple[SessionRun, ...],
    ) -> None:
        """An own write upserted ``written``, taking memory's runs from ``before`` to ``after``."""
        known = self._known_runs
        if known is not None:
            self._known_runs = after if known is before else upsert_runs(known, written)

    def _drop_intents(self) -> None:
        """Forget every unsaved change (the store's state is about to be memory)."""
        if self._bulk:
            self._retire(self._edit_epoch)
        self._changed = ()
        self._fields = ()
        self._bulk = False
        self._pre = None

    def _view_epoch(self) -> int:
        """The epoch of the history memory shows (a pending replacement's own, if any)."""
        return self._edit_epoch if self._bulk else self._epoch

    def _retire(self, epoch: int) -> None:
        """Mark the turns and runs a caller may hold from this view as of ``epoch``."""
        retired = self._retired
        if retired is _NO_RETIRED:
            retired = self._retired = {}
        shown = self._view.shown()
        for value in (
            *self._data.turns,
            *self._data.runs,
            *(() if shown is None else (*shown.turns, *shown.runs)),
        ):
            entry = retired.get(id(value))
            if entry is None or entry[0]() is not value or entry[1] > epoch:
                retired[id(value)] = (weakref.ref(value), epoch)
        if len(retired) > 1024 and len(retired) > 4 * (len(self._data.turns) + 1):
            for key in [k for k, (ref, _) in retired.items() if ref() is None]:
                del retired[key]

    def _epoch_of(self, values: Sequence[SessionTurn | SessionRun]) -> int:
        """The epoch of the oldest view any of ``values`` came from.

        A value memory shows belongs to the view now; a retired one to its own;
        any other value (built by hand, or none at all: an empty list) to the
        last view this session handed out, which is what its caller could see.
        """
        epoch = self._view_epoch()
        retired = self._retired
        data, shown = self._data, self._view.shown()
        current = {id(v) for v in (*data.turns, *data.runs)}
        if shown is not None:
            current.update(id(v) for v in (*shown.turns, *shown.runs))
        by_hand = not values
        for value in values:
            entry = retired.get(id(value))
            if entry is not None and entry[0]() is value:
                epoch = min(epoch, entry[1])
            elif id(value) not in current:
                by_hand = True
        return min(epoch, self._read_epoch) if by_hand else epoch

    def _do_set_history(self, changes: Mapping[str, Any], epoch: int) -> None:
        if self._bulk:
            epoch = min(epoch, self._edit_epoch)
        else:
            data = self._snapshot()
            self._pre = (data.turns, data.runs)
        self._retire(self._view_epoch())
        self._commit(msgspec.structs.replace(self._data, **changes))
        self._bulk = True
        self._edit_epoch = epoch

    def _do_set_field(self, name: str, value: Any) -> None:
        self._commit(msgspec.structs.replace(self._data, **{name: value}))
        if name not in self._fields:
            self._fields = (*self._fields, name)

    def _snapshot(self) -> SessionData:
        """Memory as a save writes it: a load-time demotion the store did not take stays unwritten.

        The load shows another writer's live ``running`` marker as ``idle`` and
        its running runs as ``aborted`` (the spec's stale-running demotion), but
        that view is not this session's to persist: while memory still shows
        exactly that, the save sends the stored values back (a snapshot's
        ``running`` keeps the stored status and owner), so it never settles a
        run going on elsewhere.
        """
        held, data = self._held, self._data
        return data if held is None else held.restore(data)

    def _full(self) -> FullSessionStore:
        return cast(FullSessionStore, self._store)

    def _turns_by_id(self) -> dict[str, SessionTurn]:
        """The in-memory turns by id, rebuilt only when the turns were replaced."""
        turns = self._data.turns
        if self._indexed is not turns:
            self._turn_index = {t.id: t for t in turns}
            self._indexed = turns
        return self._turn_index

    def _apply_append(
        self, turns: tuple[SessionTurn, ...], options: AppendTurnsOptions | None
    ) -> None:
        """Apply a direct append the store acknowledged: only the turns memory lacks."""
        fresh = fresh_turns(self._data.id, turns, self._turns_by_id())
        if fresh or (options is not None and options.run is not None):
            self._apply_fresh(fresh, options)

    def _apply_fresh(
        self, fresh: tuple[SessionTurn, ...], options: AppendTurnsOptions | None
    ) -> None:
        index = self._turns_by_id()  # before the commit: extended, not rebuilt
        data = self._data
        runs = data.runs
        if options is not None and options.run is not None:
            runs = upsert_runs(runs, (options.run,))
            self._acknowledge_runs(data.runs, runs, (options.run,))
        new = msgspec.structs.replace(
            data, turns=data.turns + fresh, runs=runs, updated_at=self._now()
        )
        if self._pre is not None:  # the store holds them under a pending replacement too
            pre_turns, pre_runs = self._pre
            if options is not None and options.run is not None:
                pre_runs = upsert_runs(pre_runs, (options.run,))
            self._pre = (pre_turns + fresh, pre_runs)
        self._commit(new)
        for turn in fresh:
            index[turn.id] = turn
        self._indexed = new.turns
