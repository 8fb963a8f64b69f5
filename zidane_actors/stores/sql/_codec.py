"""Row codecs both SQL stores share."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, TypeVar, cast

import msgspec

from ...errors import CorruptDataError
from ...model import (
    MAX_STORED_JSON_DEPTH,
    RunOwner,
    SessionMetaRow,
    SessionTurn,
    decoder,
    stored_too_deep,
)

__all__ = ["TOO_DEEP", "decode_row", "meta_row"]

TOO_DEEP = (
    f"nested deeper than {MAX_STORED_JSON_DEPTH} arrays/objects (MAX_STORED_JSON_DEPTH):"
    " not written by this version"
)
"""Why a stored row nested past what a write stores (or a parser recurses through) is corrupt."""

T = TypeVar("T")


def decode_row(raw: bytes | str | None, type_: type[T], table: str, key: str) -> T:
    """A JSON column's value as ``type_``; a row that does not decode is ``CorruptDataError``."""
    if raw is None:
        raise CorruptDataError(f"{table} row {key} has no value where JSON was expected")
    try:
        value: T = decoder(cast(Hashable, type_)).decode(raw)
        if stored_too_deep(raw):
            raise RecursionError
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
        reason = TOO_DEEP if isinstance(exc, RecursionError) else exc
        raise CorruptDataError(f"{table} row {key} does not decode: {reason}") from None
    return value


def meta_row(
    head: Sequence[Any],
    counts: Sequence[int],
    metadata: dict[str, Any],
    owner: RunOwner | None,
    first: SessionTurn | None,
) -> SessionMetaRow:
    """A ``list_meta`` row from its decoded parts.

    ``head`` is ``(id, agent_id, project_root, status, created_at, updated_at, rev)``;
    ``counts`` is ``(turns, user turns, runs, artifacts)``.
    """
    session_id, agent_id, project_root, status, created_at, updated_at, rev = head
    turns, users, runs, artifacts = counts
    return SessionMetaRow(
        id=session_id,
        metadata=metadata,
        run_count=runs,
        turn_count=turns,
        updated_at=updated_at,
        user_message_count=users,
        agent_id=agent_id,
        artifact_count=artifacts,
        created_at=created_at,
        first_user_turn=first,
        project_root=project_root,
        rev=rev,
        run_owner=owner,
        status=status,
    )
