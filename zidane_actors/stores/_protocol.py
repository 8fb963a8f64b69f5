"""The ``SessionStore`` protocol: required methods, optional capabilities, batching.

This module imports only the model layer, so the runtime (``actors/``) can
depend on the interface without depending on any store implementation.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, Protocol, TypeAlias, TypeVar, runtime_checkable

import attrs
import outcome

from .. import model
from ..errors import StaleSessionError, UnsupportedOperationError
from ..model import SendRequestRecord, SessionArtifact, SessionData, SessionTurn, preview

__all__ = [
    "OPTIONAL_METHODS",
    "READ_METHODS",
    "VERSIONED_WRITES",
    "WRITE_METHODS",
    "BatchingStore",
    "FullSessionStore",
    "HistoryMutation",
    "MutateResult",
    "NowaitStore",
    "ReadBatchingStore",
    "Revision",
    "RevisionSink",
    "RunClaim",
    "SessionStore",
    "StoreWrite",
    "TurnsMutation",
    "VersionedStore",
    "store_capabilities",
]

T = TypeVar("T")

MutateResult: TypeAlias = Literal["ok", "no-session", "unchanged"]
HistoryMutation: TypeAlias = Callable[[model.SessionHistory], model.SessionHistory | None]
TurnsMutation: TypeAlias = Callable[[tuple[SessionTurn, ...]], Sequence[SessionTurn] | None]
RevisionSink: TypeAlias = Callable[["Revision"], None]
"""Told a versioned history edit's :class:`Revision` (``on_revision=``), once it committed."""


@attrs.frozen
class RunClaim:
    """What ``claim_run`` answers: whether the claim took, and the status it replaced."""

    claimed: bool
    previous: model.SessionStatus | None = None


@attrs.frozen
class Revision:
    """A versioned store's answer to a session write: the session's ``rev`` around it.

    ``before`` is the ``rev`` the write found (``0`` when the session did not
    exist) and ``after`` the one it left. A writer whose memory reflects
    ``before`` knows nobody else wrote in between; any other ``before`` means
    another writer did, and its memory must fold in the store's state.
    """

    before: int
    after: int


@runtime_checkable
class SessionStore(Protocol):
    """Storage backend for sessions: the spec's required methods, in snake_case.

    Writes answer ``None``, or a :class:`Revision` on a :class:`VersionedStore`.

    Optional methods (see :data:`OPTIONAL_METHODS`) are detected with
    :func:`store_capabilities`; callers fall back as the spec says when a
    store lacks one.
    """

    async def load(self, session_id: str) -> SessionData | None:
        """The session, or ``None`` when the store has none with that id."""
        ...

    async def save(self, data: SessionData) -> Revision | None:
        """Create or overwrite the whole document (turns and runs replaced)."""
        ...

    async def append_turns(
        self,
        session_id: str,
        turns: Sequence[SessionTurn],
        options: model.AppendTurnsOptions | None = None,
    ) -> Revision | None:
        """Append turns (incremental); ``options.run`` is upserted in the same write."""
        ...

    async def get_turns(
        self, session_id: str, from_: int = 0, limit: int | None = None
    ) -> builtins.list[SessionTurn]:
        """A slice of a session's turns, oldest first."""
        ...

    async def update_run(
        self, session_id: str, run: model.SessionRun, options: model.UpdateRunOptions | None = None
    ) -> Revision | None:
        """Upsert one run record (insert when its id is new)."""
        ...

    async def update_status(
        self,
        session_id: str,
        status: model.SessionStatus,
        *,
        owner: model.RunOwner | None = None,
        preserve_updated_at: bool = False,
    ) -> Revision | None:
        """Set the top-level status; ``running`` records ``owner`` (default: this process)."""
        ...

    async def delete(self, session_id: str) -> None:
        """Delete a session (and its artifacts and send-request ids)."""
        ...

    async def list(self, filter: model.SessionFilter | None = None) -> builtins.list[str]:
        """Session ids, most recently updated first, filtered."""
        ...


@attrs.frozen
class StoreWrite:
    """One queued write: a :data:`WRITE_METHODS` name and its arguments."""

    method: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = attrs.field(factory=dict)


@runtime_checkable
class BatchingStore(Protocol):
    """A store that commits many queued writes in one transaction (group commit).

    ``apply_writes`` applies ``writes`` in the order given (never reordering
    one session's writes) and answers one outcome per write: a write that
    fails alone is rolled back alone (a savepoint) and its error returned; if
    the commit itself fails every outcome is that error.
    """

    async def apply_writes(
        self, writes: Sequence[StoreWrite]
    ) -> builtins.list[outcome.Outcome[Any]]:
        """Apply ``writes`` in one transaction; one outcome per write, in order."""
        ...


@runtime_checkable
class NowaitStore(Protocol):
    """A store that can make a small call at once, in the trio thread, when nothing waits.

    ``apply_nowait`` makes ``call`` (a :class:`StoreWrite` naming a write or a
    read) exactly as awaiting it would, and answers its result or raises its
    error; or it raises ``trio.WouldBlock`` with nothing done, when the call
    would have to wait (or keep another waiting). It never checkpoints.
    """

    def apply_nowait(self, call: StoreWrite) -> Any:
        """Make ``call`` now, or raise ``trio.WouldBlock`` (nothing done)."""
        ...


@runtime_checkable
class ReadBatchingStore(Protocol):
    """A store that makes many queued reads together (one trip to its database).

    ``apply_reads`` takes calls of :data:`READ_METHODS` and answers one
    outcome per read, in order: each read's own answer or error.
    """

    async def apply_reads(self, reads: Sequence[StoreWrite]) -> builtins.list[outcome.Outcome[Any]]:
        """Make ``reads``; one outcome per read, in order."""
        ...


OPTIONAL_METHODS: Final = frozenset(
    {
        "aclose",
        "claim_run",
        "claim_schedule_fire",
        "claim_send_request",
        "delete_artifact",
        "delete_schedule",
        "demote_stale_run",
        "find_send_request",
        "fork_session",
        "generate_session_id",
        "generate_turn_id",
        "get_meta",
        "get_rev",
        "list_artifacts",
        "list_forks",
        "list_meta",
        "list_schedule_fires",
        "list_schedules",
        "list_send_requests",
        "load_model_view",
        "load_versioned",
        "mutate_history",
        "mutate_turns",
        "patch_meta",
        "put_send_request",
        "record_schedule_fire",
        "save_meta",
        "save_schedule",
        "search_meta",
        "settle_send_request",
        "upsert_artifact",
    }
)
"""Names of the optional ``SessionStore`` methods (signatures in :class:`FullSessionStore`)."""

WRITE_METHODS: Final = frozenset(
    {
        "append_turns",
        "delete",
        "delete_artifact",
        "patch_meta",
        "save",
        "save_meta",
        "settle_send_request",
        "update_run",
        "update_status",
        "upsert_artifact",
    }
)
"""Writes a :class:`BatchingStore` may group into one transaction."""

READ_METHODS: Final = frozenset(
    {
        "find_send_request",
        "get_meta",
        "get_rev",
        "get_turns",
        "list",
        "list_artifacts",
        "list_forks",
        "list_meta",
        "list_schedule_fires",
        "list_schedules",
        "list_send_requests",
        "load",
        "load_model_view",
        "load_versioned",
        "search_meta",
    }
)
"""Reads: they change nothing a caller can see, so reads queued together may run at once."""


VERSIONED_WRITES: Final = frozenset(
    {"append_turns", "patch_meta", "save", "save_meta", "update_run", "update_status"}
)
"""The writes a :class:`VersionedStore` answers with a :class:`Revision`."""


@runtime_checkable
class VersionedStore(Protocol):
    """The optimistic-concurrency capability (``load_versioned`` and ``get_rev``).

    A store with it also answers each :data:`VERSIONED_WRITES` call with the
    :class:`Revision` of the session it wrote (``before == after`` when it
    wrote nothing), takes ``on_revision=`` (a :data:`RevisionSink`) on
    ``mutate_history`` and ``mutate_turns``, and takes ``expected_rev=`` on
    ``save``, ``save_meta``, ``mutate_history`` and ``mutate_turns``: when
    the stored ``rev`` (``0`` for no session) differs, the write raises
    :class:`~zidane_actors.errors.StaleSessionError` and writes nothing,
    the check and the write being one atomic step. ``rev`` only grows per id,
    across delete and re-create. Stores without it keep their plain
    behaviour; sessions then cannot detect other writers.
    """

    async def load_versioned(self, session_id: str) -> tuple[SessionData, int] | None:
        """The session and its ``rev``, read in one snapshot; ``None`` when absent."""
        ...

    async def get_rev(self, session_id: str) -> int | None:
        """The session's ``rev`` (one indexed read); ``None`` when absent."""
        ...


def is_versioned(capabilities: frozenset[str]) -> bool:
    """Whether a store with these capabilities is a :class:`VersionedStore`."""
    return "load_versioned" in capabilities and "get_rev" in capabilities


def stale(session_id: str, expected: int, actual: int | None) -> StaleSessionError:
    """The error of a conditional write that found ``actual`` instead of ``expected``."""
    found = "no session" if actual is None or actual == 0 else f"rev {actual}"
    return StaleSessionError(
        f"session {preview(session_id)} changed since it was read: expected rev {expected}, "
        f"the store holds {found}",
        expected=expected,
        actual=actual,
    )


def store_capabilities(store: object) -> frozenset[str]:
    """The optional methods ``store`` implements (callable attributes by name)."""
    return frozenset(name for name in OPTIONAL_METHODS if callable(getattr(store, name, None)))


def write_step(write: object, step: Callable[[str], T]) -> T:
    """``step(write.method)`` for a batchable write (a :class:`StoreWrite` of a
    :data:`WRITE_METHODS` name): how every store finds what applies a queued write.

    Anything else is refused with :class:`UnsupportedOperationError` naming it.
    """
    if not isinstance(write, StoreWrite) or write.method not in WRITE_METHODS:
        name = getattr(write, "method", type(write).__name__)
        raise UnsupportedOperationError(f"{preview(name)} is not a batchable store write")
    return step(write.method)


class FullSessionStore(SessionStore, Protocol):
    """A store with every optional method: the signatures each optional method must have."""

    async def aclose(self) -> None:
        """Release backend resources (close the database handle)."""
        ...

    async def claim_run(
        self, session_id: str, *, stale_at: int, owner: model.RunOwner | None = None
    ) -> RunClaim:
        """Atomically set ``running`` unless a live owner still holds it.

        An unknown id is claimed without writing a row. Stores with a lease
        epoch bump it on every claim.
        """
        ...

    async def claim_schedule_fire(self, id: str, due_at: int, next: int | None) -> bool:
        """Take the fire due at ``due_at`` once across every host; ``False`` when lost."""
        ...

    async def claim_send_request(
        self, session_id: str, request_id: str, fingerprint: str
    ) -> model.SendRequestClaim:
        """Claim a request id atomically, or answer the record already holding it."""
        ...

    async def delete_artifact(self, session_id: str, artifact_id: str) -> None:
        """Remove one artifact; unknown ids are a no-op."""
        ...

    async def delete_schedule(self, id: str) -> bool:
        """Remove a schedule and its fires; ``False`` when it was gone."""
        ...

    async def demote_stale_run(self, session_id: str, *, stale_at: int, now: int) -> bool:
        """Persist a load's stale-running demotion, atomically and only if still stale.

        In one atomic step: unless ``run_claim_blocked(status, owner, updatedAt,
        stale_at, now)``, a ``running`` status becomes ``idle`` (owner cleared)
        and ``running`` run records ``aborted``, ``updatedAt`` kept, ``rev``
        bumped. A marker claimed or refreshed since the caller read it holds,
        so it is never overwritten. ``True`` when something was written.
        """
        ...

    async def find_send_request(self, session_id: str, request_id: str) -> SendRequestRecord | None:
        """The record of a claimed request id, without claiming it."""
        ...

    async def fork_session(
        self,
        source_id: str,
        new_id: str,
        *,
        at: str | None,
        created_at: int,
        expected_rev: int | None = None,
    ) -> Revision | None:
        """Create ``new_id`` as :func:`~zidane_actors.model.fork_document` of ``source_id``.

        Atomic: the source as of one snapshot. Refusals, nothing written, the
        first that applies in this order: an unsafe id (the new one
        :class:`InvalidNameError` at ``$.id``, ``check_fork_id``), no source
        :class:`SessionNotFoundError`, ``expected_rev`` (the source's) not its
        rev :class:`StaleSessionError`, ``at`` naming no turn
        :class:`ValidationError` at ``$.at``, ``new_id`` held
        :class:`ConflictError`. Answers the fork's
        :class:`Revision` on a versioned store. Later writes to either never
        show in the other; deleting the source leaves the fork whole.
        """
        ...

    async def generate_session_id(self) -> str:
        """A new session id issued by the backend."""
        ...

    async def generate_turn_id(self) -> str:
        """A new turn id issued by the backend."""
        ...

    async def get_meta(self, session_id: str) -> model.SessionMetaRow | None:
        """One session's header row without materializing its turns."""
        ...

    async def list_artifacts(
        self, filter: model.ArtifactFilter | None = None
    ) -> builtins.list[SessionArtifact]:
        """Artifacts, newest ``updatedAt`` first, filtered."""
        ...

    async def list_forks(self, source_id: str) -> builtins.list[str]:
        """The ids of the direct forks of ``source_id`` (its ``forkedFrom`` names it), sorted."""
        ...

    async def list_meta(
        self, filter: model.SessionFilter | None = None
    ) -> builtins.list[model.SessionMetaRow]:
        """Session summaries, most recently updated first, filtered like ``list``."""
        ...

    async def list_schedule_fires(
        self, schedule_id: str, limit: int
    ) -> builtins.list[model.ScheduleFire]:
        """A schedule's fires, newest first."""
        ...

    async def list_schedules(self) -> builtins.list[model.Schedule]:
        """Every schedule with its last fire, oldest first."""
        ...

    async def list_send_requests(self, session_id: str) -> builtins.list[SendRequestRecord]:
        """Every request id the session holds, oldest claim first (copies, exports)."""
        ...

    async def put_send_request(self, session_id: str, record: SendRequestRecord) -> None:
        """Store ``record`` exactly as given, replacing its id's record, keeping the newest
        ``SEND_REQUEST_HISTORY`` (copies and imports; a claim is ``claim_send_request``)."""
        ...

    async def load_model_view(self, session_id: str) -> builtins.list[SessionTurn] | None:
        """``model_view`` of the stored turns, read from the latest compaction; ``None``: absent."""
        ...

    async def mutate_history(self, session_id: str, mutate: HistoryMutation) -> MutateResult:
        """Rewrite turns and runs as one atomic read-modify-write.

        ``mutate`` (synchronous, pure) returns the next history or ``None``;
        an exception inside it aborts without writing and propagates.
        """
        ...

    async def mutate_turns(self, session_id: str, mutate: TurnsMutation) -> MutateResult:
        """Deprecated turns-only form of :meth:`mutate_history`."""
        ...

    async def patch_meta(
        self, session_id: str, patch: Mapping[str, model.JsonValue]
    ) -> Revision | None:
        """Merge ``patch`` into stored metadata (``msgspec.UNSET`` removes a key); nothing else."""
        ...

    async def record_schedule_fire(self, fire: model.ScheduleFire) -> None:
        """Store a fire, keeping the newest ``FIRE_HISTORY`` per schedule."""
        ...

    async def save_meta(
        self, data: SessionData, options: model.SaveMetaOptions | None = None
    ) -> Revision | None:
        """Persist the header and upsert the snapshot's runs; never deletes turns or runs."""
        ...

    async def save_schedule(
        self, schedule: model.Schedule, *, keep_next_fire_at: bool = False
    ) -> None:
        """Create or replace a schedule (its ``lastFire`` is not stored)."""
        ...

    async def search_meta(self, search: model.SessionSearch) -> model.SessionSearchPage:
        """One page of the sessions matching ``search``'s words and filters, and their count.

        Every store answers as :func:`~zidane_actors.model.search_page` would
        over its sessions; an indexed store finds the words without reading them.
        """
        ...

    async def settle_send_request(
        self, session_id: str, request_id: str, result: model.JsonValue
    ) -> None:
        """Store a claimed send's result; ``None`` drops the claim; unknown ids are a no-op."""
        ...

    async def upsert_artifact(self, artifact: SessionArtifact) -> SessionArtifact | None:
        """Upsert on ``(sessionId, kind, uri)`` with ``merge_artifact``, enforcing the cap.

        Unknown session ids are a no-op answering ``None``.
        """
        ...
