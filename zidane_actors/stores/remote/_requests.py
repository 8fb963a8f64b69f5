"""The remote store's requests: paths and queries, checked arguments, batch writes.

Each store write is checked here as its own method checks it, and built into
the body (:mod:`._bodies`) it sends; ``POST /writes`` entries are encoded here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final, TypeVar
from urllib.parse import quote, urlencode

import msgspec
from msgspec import UNSET, UnsetType

from ... import model
from ...errors import (
    CorruptDataError,
    StoreError,
    ValidationError,
)
from ...model import (
    ArtifactFilter,
    SessionData,
    check_model,
    current_run_owner,
    encode,
    normalize_artifact,
    preview,
    validate_id,
    validate_request_id,
)
from ...model._checked import CheckedTurns
from .._protocol import WRITE_METHODS, StoreWrite, write_step
from .._validate import (
    check_artifact_filter_ids,
    check_artifact_ids,
    checked_status,
)
from ._bodies import (
    AnyWrite,
    AppendTurnsBody,
    AppendTurnsWrite,
    DeleteArtifactWrite,
    DeleteWrite,
    PatchMetaWrite,
    SaveMetaWrite,
    SaveWrite,
    SettleSendRequestWrite,
    UpdateRunWrite,
    UpdateStatusWrite,
    UpsertArtifactWrite,
)

__all__ = [
    "BATCH_BYTES",
    "DEFAULT_MAX_ANSWER_BYTES",
    "WRITE_BUILDERS",
    "append_turns_write",
    "artifact_params",
    "checked_filter",
    "delete_artifact_write",
    "delete_write",
    "encode_write",
    "encoded_body",
    "filter_params",
    "patch_meta_write",
    "request_seg",
    "same_id",
    "save_meta_write",
    "save_write",
    "seg",
    "settle_send_request_write",
    "too_big",
    "typed",
    "typed_or_none",
    "update_run_write",
    "update_status_write",
    "upsert_artifact_write",
    "with_query",
    "without_unset",
]

T = TypeVar("T")


def with_query(path: str, params: Mapping[str, str] | None) -> str:
    """``path`` with its query; a lone surrogate as its UTF-8 bytes, as the server reads it."""
    return f"{path}?{urlencode(params, errors='surrogatepass')}" if params else path


def filter_params(filter: model.SessionFilter | None) -> dict[str, str]:
    if filter is None:
        return {}
    return _query(filter.project_root, agentId=filter.agent_id, limit=filter.limit)


def artifact_params(filter: ArtifactFilter | None) -> dict[str, str]:
    if filter is None:
        return {}
    return _query(
        filter.project_root,
        kind=filter.kind,
        sessionId=filter.session_id,
        uri=filter.uri,
        limit=filter.limit,
        since=filter.since,
    )


def _query(project_root: str | UnsetType | None, **values: str | int | None) -> dict[str, str]:
    """A filter's query parameters: each value given, as text; ``projectRoot`` as the
    server reads it (``None`` asks for untagged sessions only; unset, no filter)."""
    params = {key: str(value) for key, value in values.items() if value is not None}
    if isinstance(project_root, str):
        params["projectRoot"] = project_root
    elif project_root is None:
        params["untaggedOnly"] = "true"
    return params


def seg(value: str, what: str) -> str:
    """An id checked safe for a URL path segment (no escaping needed)."""
    return validate_id(value, what=what)


DEFAULT_MAX_ANSWER_BYTES: Final = 256 * 1024 * 1024
"""Largest answer body the remote client reads (``max_answer_bytes``)."""


def too_big(url: str, what: str, limit: int) -> StoreError:
    return StoreError(f"the answer of {what} from {url} is over {limit} bytes (max_answer_bytes)")


def same_id(got: str, asked: str, what: str) -> None:
    """Refuse an answer about another record than the one asked for."""
    if got != asked:
        raise CorruptDataError(
            f"the answer of {what} is about {preview(got)}, not {preview(asked)}"
        )


def request_seg(value: str) -> str:
    """A send request id as one URL path segment: any text, percent-encoded."""
    return quote(validate_request_id(value), safe="")


def typed(value: object, type_: type[T], what: str) -> T:
    """``value`` if it is a ``type_``, else a :class:`ValidationError` naming ``what``."""
    if not isinstance(value, type_):
        raise ValidationError(f"{what} must be a {type_.__name__}, got {type(value).__name__}")
    return value


def typed_or_none(value: object, type_: type[T], what: str) -> T | None:
    return None if value is None else typed(value, type_, what)


def checked_filter(filter: object) -> ArtifactFilter | None:
    checked = typed_or_none(filter, ArtifactFilter, "filter")
    check_artifact_filter_ids(checked)
    return checked


def without_unset(data: SessionData) -> SessionData:
    """``data`` without ``UNSET`` metadata values: absent keys mean the same, and JSON
    has no ``undefined``."""
    if not any(v is UNSET for v in data.metadata.values()):
        return data
    metadata = {k: v for k, v in data.metadata.items() if v is not UNSET}
    return msgspec.structs.replace(data, metadata=metadata)


def encoded_body(body: object, where: str) -> bytes | None:
    """``body`` as JSON, checked first (``ValidationError`` naming ``where``); ``None`` stays.

    Appended turns checked once already (a ``CheckedTurns``) are sent as their bodies.
    """
    if body is None:
        return None
    if isinstance(body, AppendTurnsBody | AppendTurnsWrite) and type(body.turns) is CheckedTurns:
        turns = msgspec.Raw(b"[" + b",".join(body.turns.bodies) + b"]")
        rest = msgspec.structs.replace(body, turns=())
        check_model(rest, what=f"{where} body")
        body = msgspec.structs.replace(rest, turns=turns)
    else:
        check_model(body, what=f"{where} body")
    try:
        return encode(body)
    except (TypeError, OverflowError) as exc:
        raise ValidationError(f"{where}: body cannot be encoded as JSON: {exc}") from None


# The checks of each write method, shared by its own route and by POST /writes.


def save_write(data: object, *, expected_rev: int | None = None) -> SaveWrite:
    data = typed(data, SessionData, "session")
    seg(data.id, "session id")
    return SaveWrite(session=without_unset(data), expected_rev=expected_rev)


def append_turns_write(
    session_id: str,
    turns: Sequence[model.SessionTurn],
    options: model.AppendTurnsOptions | None = None,
) -> AppendTurnsWrite:
    if isinstance(turns, (str, bytes)) or not isinstance(turns, Sequence):
        raise ValidationError(f"turns must be a sequence, got {type(turns).__name__}")
    checked = (
        turns
        if type(turns) is CheckedTurns
        else tuple(typed(t, model.SessionTurn, f"turns[{i}]") for i, t in enumerate(turns))
    )
    return AppendTurnsWrite(
        session_id=seg(session_id, "session id"),
        turns=checked,
        options=typed_or_none(options, model.AppendTurnsOptions, "options"),
    )


def delete_write(session_id: str) -> DeleteWrite:
    return DeleteWrite(session_id=seg(session_id, "session id"))


def update_run_write(
    session_id: str, run: model.SessionRun, options: model.UpdateRunOptions | None = None
) -> UpdateRunWrite:
    run = typed(run, model.SessionRun, "run")
    options = typed_or_none(options, model.UpdateRunOptions, "options")
    seg(run.id, "run id")
    return UpdateRunWrite(session_id=seg(session_id, "session id"), run=run, options=options)


def update_status_write(
    session_id: str,
    status: model.SessionStatus,
    *,
    owner: model.RunOwner | None = None,
    preserve_updated_at: bool = False,
) -> UpdateStatusWrite:
    owner = typed_or_none(owner, model.RunOwner, "owner")
    if status == "running" and owner is None:
        owner = current_run_owner()
    return UpdateStatusWrite(
        session_id=seg(session_id, "session id"),
        status=checked_status(status),
        owner=owner,
        preserve_updated_at=preserve_updated_at,
    )


def save_meta_write(
    data: SessionData,
    options: model.SaveMetaOptions | None = None,
    *,
    expected_rev: int | None = None,
) -> SaveMetaWrite:
    data = typed(data, SessionData, "session")
    options = typed_or_none(options, model.SaveMetaOptions, "options")
    seg(data.id, "session id")
    return SaveMetaWrite(session=without_unset(data), options=options, expected_rev=expected_rev)


def patch_meta_write(session_id: str, patch: Mapping[str, model.JsonValue]) -> PatchMetaWrite:
    if not isinstance(patch, Mapping):
        raise ValidationError(f"patch must be a mapping, got {type(patch).__name__}")
    return PatchMetaWrite(
        session_id=seg(session_id, "session id"),
        set={k: v for k, v in patch.items() if v is not UNSET},
        remove=tuple(k for k, v in patch.items() if v is UNSET),
    )


def settle_send_request_write(
    session_id: str, request_id: str, result: model.JsonValue
) -> SettleSendRequestWrite:
    return SettleSendRequestWrite(
        session_id=seg(session_id, "session id"),
        request_id=validate_request_id(request_id),
        result=result,
    )


def upsert_artifact_write(artifact: model.SessionArtifact) -> UpsertArtifactWrite:
    artifact = normalize_artifact(typed(artifact, model.SessionArtifact, "artifact"))
    check_artifact_ids(artifact)
    seg(artifact.session_id, "session id")
    return UpsertArtifactWrite(artifact=artifact)


def delete_artifact_write(session_id: str, artifact_id: str) -> DeleteArtifactWrite:
    return DeleteArtifactWrite(
        session_id=seg(session_id, "session id"), artifact_id=seg(artifact_id, "artifact id")
    )


WRITE_BUILDERS: Final[Mapping[str, Callable[..., AnyWrite]]] = {
    AppendTurnsWrite.method: append_turns_write,
    DeleteWrite.method: delete_write,
    DeleteArtifactWrite.method: delete_artifact_write,
    PatchMetaWrite.method: patch_meta_write,
    SaveWrite.method: save_write,
    SaveMetaWrite.method: save_meta_write,
    SettleSendRequestWrite.method: settle_send_request_write,
    UpdateRunWrite.method: update_run_write,
    UpdateStatusWrite.method: update_status_write,
    UpsertArtifactWrite.method: upsert_artifact_write,
}
"""How each batchable write (``WRITE_METHODS``) is checked and built into its body."""
if WRITE_BUILDERS.keys() != WRITE_METHODS:  # the one table of batchable writes is WRITE_METHODS
    raise ImportError(f"POST /writes builders {sorted(WRITE_BUILDERS)} differ from WRITE_METHODS")

# A POST /writes body stays well under the server's default body limit (32 MiB).
BATCH_BYTES: Final = 8 * 1024 * 1024


def encode_write(write: StoreWrite) -> bytes:
    """``write`` as the JSON of one ``POST /writes`` entry, checked as its own method checks."""
    build = write_step(write, WRITE_BUILDERS.__getitem__)
    encoded = encoded_body(build(*write.args, **write.kwargs), f"{write.method} write")
    assert encoded is not None
    return encoded
