"""The REST session API's request and response bodies (msgspec Structs).

The server (``zidane_actors.server``) and the remote store's client
(:mod:`._client`) share these definitions; this module needs no HTTP client.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Final, Literal, TypeAlias, get_args

import msgspec
from msgspec import UNSET

from ... import model
from ...model import (
    JsonValue,
    RunOwner,
    SessionArtifact,
    SessionData,
    SessionHistory,
    SessionStatus,
    encode,
)
from ...model._types import EpochMs
from .._protocol import WRITE_METHODS

__all__ = [
    "IF_MATCH_HEADER",
    "MAX_BATCH_WRITES",
    "REV_AFTER_HEADER",
    "REV_BEFORE_HEADER",
    "REV_HEADER",
    "WRITE_BODIES",
    "AnyWrite",
    "AppendTurnsBody",
    "AppendTurnsWrite",
    "ClaimFireBody",
    "ClaimRunBody",
    "ClaimRunResult",
    "ClaimSendRequestBody",
    "ClaimedResult",
    "DeleteArtifactWrite",
    "DeleteWrite",
    "DeletedResult",
    "DemoteStaleRunBody",
    "DemotedResult",
    "ErrorBody",
    "ErrorDetail",
    "ForkBody",
    "HistoryBody",
    "HistoryResult",
    "HistoryState",
    "IdResult",
    "IdsResult",
    "PatchMetaBody",
    "PatchMetaWrite",
    "RevResult",
    "RevisionBody",
    "SaveMetaBody",
    "SaveMetaWrite",
    "SaveWrite",
    "SettleSendRequestBody",
    "SettleSendRequestWrite",
    "UpdateRunBody",
    "UpdateRunWrite",
    "UpdateStatusBody",
    "UpdateStatusWrite",
    "UpsertArtifactResult",
    "UpsertArtifactWrite",
    "WriteOutcome",
    "WritesBody",
    "WritesResult",
    "encoded_history_rev",
    "history_rev",
]


class _Body(
    msgspec.Struct, frozen=True, omit_defaults=True, rename="camel", forbid_unknown_fields=True
):
    """Base of the API's request and response bodies."""


class ErrorDetail(_Body, frozen=True):
    """What went wrong: a stable ``code``, a readable ``message``, the bad field's ``path``."""

    code: str
    message: str
    path: str | None = None


class ErrorBody(_Body, frozen=True):
    """Every error answer of the API."""

    error: ErrorDetail


REV_HEADER: Final = "zidane-rev"
"""``GET /sessions/{id}``: the ``rev`` the answered session is at (a versioned store)."""
REV_BEFORE_HEADER: Final = "zidane-rev-before"
REV_AFTER_HEADER: Final = "zidane-rev-after"
"""A session write's :class:`~zidane_actors.stores.Revision` (a versioned store)."""
IF_MATCH_HEADER: Final = "if-match"
"""A conditional write's expected ``rev`` (``"7"``); a stale one answers 409 ``stale_session``."""


class RevResult(_Body, frozen=True):
    """``GET /sessions/{id}/rev``: the session's ``rev``."""

    rev: int


class RevisionBody(_Body, frozen=True):
    """A write's revision in a ``POST /writes`` outcome."""

    before: int
    after: int


class AppendTurnsBody(_Body, frozen=True):
    """``POST /sessions/{id}/turns``."""

    turns: tuple[model.SessionTurn, ...]
    options: model.AppendTurnsOptions | None = None


class UpdateRunBody(_Body, frozen=True):
    """``PUT /sessions/{id}/runs/{runId}``."""

    run: model.SessionRun
    options: model.UpdateRunOptions | None = None


class UpdateStatusBody(_Body, frozen=True):
    """``PUT /sessions/{id}/status``."""

    status: SessionStatus
    owner: RunOwner | None = None
    preserve_updated_at: bool = False


class SaveMetaBody(_Body, frozen=True):
    """``PUT /sessions/{id}/meta``."""

    session: SessionData
    options: model.SaveMetaOptions | None = None


class PatchMetaBody(_Body, frozen=True):
    """``PATCH /sessions/{id}/meta``: keys to set, and keys to remove."""

    set: dict[str, JsonValue] = msgspec.field(default_factory=dict)
    remove: tuple[str, ...] = ()


class ClaimRunBody(_Body, frozen=True):
    """``POST /sessions/{id}/claim-run``."""

    stale_at: EpochMs
    owner: RunOwner | None = None


class DemoteStaleRunBody(_Body, frozen=True):
    """``POST /sessions/{id}/demote-stale-run``: the loader's staleness horizon and clock."""

    stale_at: EpochMs
    now: EpochMs


class DemotedResult(_Body, frozen=True):
    """Whether a stale-running demotion was written."""

    demoted: bool


class ClaimRunResult(_Body, frozen=True):
    """The answer of a run claim."""

    claimed: bool
    previous: SessionStatus | None = None


class HistoryState(_Body, frozen=True):
    """``GET /sessions/{id}/history``: the history and its revision."""

    history: SessionHistory
    rev: str


class HistoryBody(_Body, frozen=True):
    """``PUT /sessions/{id}/history``: write ``history`` if the stored one is at ``expectedRev``."""

    history: SessionHistory
    expected_rev: str


class HistoryResult(_Body, frozen=True):
    """The answer of a history write; ``rev`` is the stored revision afterwards."""

    result: Literal["ok", "no-session", "unchanged"]
    rev: str | None = None


class ClaimSendRequestBody(_Body, frozen=True):
    """``POST /sessions/{id}/send-requests/{requestId}/claim``."""

    fingerprint: str


class SettleSendRequestBody(_Body, frozen=True):
    """``PUT /sessions/{id}/send-requests/{requestId}/result``; ``null`` drops the claim."""

    result: JsonValue


class UpsertArtifactResult(_Body, frozen=True):
    """The stored artifact, or ``null`` for an unknown session."""

    artifact: SessionArtifact | None


MAX_BATCH_WRITES: Final = 1000
"""Most writes one ``POST /writes`` carries (422 beyond)."""


class _Write(_Body, frozen=True, tag_field="op"):
    """Base of the writes of ``POST /writes``: one store write each, tagged by ``op``."""

    method: ClassVar[str]
    """The store write it makes (a ``WRITE_METHODS`` name)."""

    def store_call(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The positional and keyword arguments of that store write."""
        raise NotImplementedError


class AppendTurnsWrite(_Write, frozen=True, tag="appendTurns"):
    """``append_turns`` in a batch."""

    method: ClassVar[str] = "append_turns"

    session_id: str
    turns: tuple[model.SessionTurn, ...]
    options: model.AppendTurnsOptions | None = None

    def store_call(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.session_id, self.turns, self.options), {}


class SaveWrite(_Write, frozen=True, tag="save"):
    """``save`` in a batch (only while the session is at ``expectedRev``, when given)."""

    method: ClassVar[str] = "save"

    session: SessionData
    expected_rev: int | None = None

    def store_call(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.session,), _expected(self.expected_rev)


class DeleteWrite(_Write, frozen=True, tag="delete"):
    """``delete`` in a batch."""

    method: ClassVar[str] = "delete"

    session_id: str

    def store_call(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.session_id,), {}


class UpdateRunWrite(_Write, frozen=True, tag="updateRun"):
    """``update_run`` in a batch."""

    method: ClassVar[str] = "update_run"

    session_id: str
    run: model.SessionRun
    options: model.UpdateRunOptions | None = None

    def store_call(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.session_id, self.run, self.options), {}


class UpdateStatusWrite(_Write, frozen=True, tag="updateStatus"):
    """``update_status`` in a batch."""

    method: ClassVar[str] = "update_status"

    session_id: str
    status: SessionStatus
    owner: RunOwner | None = None
    preserve_updated_at: bool = False

    def store_call(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.session_id, self.status), {
            "owner": self.owner,
            "preserve_updated_at": self.preserve_updated_at,
        }


class SaveMetaWrite(_Write, frozen=True, tag="saveMeta"):
    """``save_meta`` in a batch (only while the session is at ``expectedRev``, when given)."""

    method: ClassVar[str] = "save_meta"

    session: SessionData
    options: model.SaveMetaOptions | None = None
    expected_rev: int | None = None

    def store_call(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.session, self.options), _expected(self.expected_rev)


class PatchMetaWrite(_Write, frozen=True, tag="patchMeta"):
    """``patch_meta`` in a batch: keys to set, and keys to remove."""

    method: ClassVar[str] = "patch_meta"

    session_id: str
    set: dict[str, JsonValue] = msgspec.field(default_factory=dict)
    remove: tuple[str, ...] = ()

    def store_call(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        patch: dict[str, Any] = dict(self.set)
        patch.update(dict.fromkeys(self.remove, UNSET))
        return (self.session_id, patch), {}


class SettleSendRequestWrite(_Write, frozen=True, tag="settleSendRequest"):
    """``settle_send_request`` in a batch."""

    method: ClassVar[str] = "settle_send_request"

    session_id: str
    request_id: str
    result: JsonValue

    def store_call(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.session_id, self.request_id, self.result), {}


class UpsertArtifactWrite(_Write, frozen=True, tag="upsertArtifact"):
    """``upsert_artifact`` in a batch."""

    method: ClassVar[str] = "upsert_artifact"

    artifact: SessionArtifact

    def store_call(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.artifact,), {}


class DeleteArtifactWrite(_Write, frozen=True, tag="deleteArtifact"):
    """``delete_artifact`` in a batch."""

    method: ClassVar[str] = "delete_artifact"

    session_id: str
    artifact_id: str

    def store_call(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.session_id, self.artifact_id), {}


AnyWrite: TypeAlias = (
    AppendTurnsWrite
    | SaveWrite
    | DeleteWrite
    | UpdateRunWrite
    | UpdateStatusWrite
    | SaveMetaWrite
    | PatchMetaWrite
    | SettleSendRequestWrite
    | UpsertArtifactWrite
    | DeleteArtifactWrite
)
"""One write of ``POST /writes``."""

WRITE_BODIES: Final[Mapping[str, type[AnyWrite]]] = {w.method: w for w in get_args(AnyWrite)}
"""The body of each batchable store write, by method: one for each ``WRITE_METHODS`` name."""
if WRITE_BODIES.keys() != WRITE_METHODS:  # the one table of batchable writes is WRITE_METHODS
    raise ImportError(f"POST /writes bodies {sorted(WRITE_BODIES)} differ from WRITE_METHODS")


def _expected(expected_rev: int | None) -> dict[str, Any]:
    return {} if expected_rev is None else {"expected_rev": expected_rev}


class WritesBody(_Body, frozen=True):
    """``POST /writes``: store writes applied in order, in one transaction where the store can."""

    writes: Annotated[tuple[AnyWrite, ...], msgspec.Meta(max_length=MAX_BATCH_WRITES)]


class WriteOutcome(_Body, frozen=True):
    """What became of one write: the status its own route would answer, and its error.

    ``artifact`` is the stored artifact of an ``upsertArtifact`` (absent for an
    unknown session); ``revision`` a session write's revision on a versioned store.
    """

    status: int
    error: ErrorDetail | None = None
    artifact: SessionArtifact | None = None
    revision: RevisionBody | None = None


class WritesResult(_Body, frozen=True):
    """The answer of ``POST /writes``: one outcome per write, in order."""

    outcomes: tuple[WriteOutcome, ...]


class ClaimFireBody(_Body, frozen=True):
    """``POST /schedules/{id}/claim-fire``."""

    due_at: EpochMs
    next: EpochMs | None


class ClaimedResult(_Body, frozen=True):
    """Whether a claim took."""

    claimed: bool


class DeletedResult(_Body, frozen=True):
    """Whether a delete removed something."""

    deleted: bool


class ForkBody(_Body, frozen=True):
    """``POST /sessions/{id}/forks``: fork through turn ``at`` (all when absent) as ``id``
    (generated when absent), only while the source is at ``expectedRev`` (when given), made
    at ``createdAt`` (the server's clock when absent)."""

    at: str | None = None
    id: str | None = None
    expected_rev: Annotated[int, msgspec.Meta(ge=0)] | None = None
    created_at: EpochMs | None = None


class IdResult(_Body, frozen=True):
    """A generated id."""

    id: str


class IdsResult(_Body, frozen=True):
    """Session ids, most recently updated first."""

    ids: tuple[str, ...]


def history_rev(history: SessionHistory) -> str:
    """The revision of a history: SHA-256 of its canonical JSON.

    A content hash works over every backing store (none has to keep a
    counter), and a client can compute the revision of the history it is
    about to write, which tells it whether a write whose answer was lost
    has landed.
    """
    return encoded_history_rev(encode(history))


def encoded_history_rev(encoded: bytes) -> str:
    """:func:`history_rev` of a history already encoded (``encode(history)``)."""
    return hashlib.sha256(encoded).hexdigest()
