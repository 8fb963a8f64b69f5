"""Argument checks every store shares: untrusted input is validated the way a
persistent store decodes it (a JSON round trip, after ``check_model`` refused
what JSON cannot carry exactly), so all stores refuse the same values with the
same located errors.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Final, TypeVar, cast, get_args

import msgspec
from msgspec import UNSET

from .. import model
from ..errors import ValidationError
from ..model import (
    MAX_JSON_DEPTH,
    SessionHistory,
    SessionStatus,
    check_column_text,
    check_json,
    check_model,
    check_unique_turn_ids,
    decode,
    encode,
    parse_json,
    preview,
    validate_id,
)
from ..model._checked import CheckedTurns
from ..model._codec import decoder, encode_checked
from ._protocol import HistoryMutation, TurnsMutation

__all__ = [
    "check_artifact_filter_ids",
    "check_artifact_ids",
    "check_fire_ids",
    "check_ids",
    "checked",
    "checked_append",
    "checked_header",
    "checked_int",
    "checked_items",
    "checked_meta_patch",
    "checked_status",
    "encoded",
    "json_value",
    "now_ms",
    "warn_mutate_turns",
]

T = TypeVar("T")

_STATUSES: Final = frozenset(get_args(SessionStatus))
_TURN: Final = model.decoder(model.SessionTurn)


def turns_only(mutate: TurnsMutation) -> HistoryMutation:
    """A deprecated turns-only edit as a history edit: runs kept, the new turns checked."""

    def on_history(history: SessionHistory) -> SessionHistory | None:
        turns = mutate(history.turns)
        if turns is None:
            return None
        return SessionHistory(
            turns=checked_items(turns, model.SessionTurn, "turns"), runs=history.runs
        )

    return on_history


def warn_mutate_turns() -> None:
    """The ``DeprecationWarning`` of every store's ``mutate_turns`` (deprecated in the spec).

    Called first thing in a store's ``mutate_turns``: the warning points at its caller.
    """
    warnings.warn(
        "mutate_turns is deprecated, as in the spec: use mutate_history (it edits turns and"
        " runs together; return the runs unchanged for a turns-only edit)",
        DeprecationWarning,
        stacklevel=3,
    )


def now_ms() -> int:
    """The store clock: epoch milliseconds."""
    return time.time_ns() // 1_000_000


def encoded(value: object, what: str) -> bytes:
    """``value`` as exact JSON, or a :class:`ValidationError` naming ``what`` (and where)."""
    check_model(value, what=what)
    try:
        return encode_checked(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValidationError(f"{what} is not JSON-serializable: {exc}") from None


def checked(value: object, type_: type[T], what: str) -> T:
    """``value`` validated like a persistent store decodes it (constraints, tags, JSON-ness).

    A value whose JSON nests too little to be too deep and reads back equal to it holds
    nothing JSON would change (``NaN``, ``bytes``, a set, a non-string key, a model value
    in a free-form field all read back different): its copy is answered without the walk
    of every field, which any other value gets, with its located error.
    """
    if not isinstance(value, type_):
        raise ValidationError(f"{what} must be a {type_.__name__}, got {type(value).__name__}")
    try:
        body = encode_checked(value)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return decode(encoded(value, what), type_, what=what)  # refused, located
    if body.count(b"{") + body.count(b"[") <= MAX_JSON_DEPTH:
        try:
            copy: T = decoder(cast(Hashable, type_)).decode(body)
        except (ValueError, RecursionError, msgspec.MsgspecError):
            pass
        else:
            if copy == value:
                return copy
    check_model(value, what=what)
    return decode(body, type_, what=what)


def checked_int(value: object, what: str) -> int:
    """A non-negative integer (not a bool)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValidationError(f"{what} must be an integer >= 0, got {preview(value)}")
    return value


def check_turn_slice(session_id: str, from_: int, limit: int | None) -> None:
    """``get_turns``'s arguments: a safe session id, whole ``from_`` and ``limit`` (or none)."""
    validate_id(session_id)
    checked_int(from_, "from_")
    if limit is not None:
        checked_int(limit, "limit")


def check_send_claim(session_id: str, request_id: str, fingerprint: str) -> None:
    """``claim_send_request``'s arguments: safe session and request ids, a string fingerprint."""
    validate_id(session_id)
    model.validate_request_id(request_id, what="send request id")
    if not isinstance(fingerprint, str):
        raise ValidationError(f"fingerprint must be a string, got {type(fingerprint).__name__}")


def checked_status(status: object) -> SessionStatus:
    """``status`` if it is a session status, else a refusal located at ``$.status``."""
    if not isinstance(status, str) or status not in _STATUSES:
        raise ValidationError(
            f"status must be one of {sorted(_STATUSES)}, got {preview(status)}", path="$.status"
        )
    return cast(SessionStatus, status)


def checked_items(values: object, type_: type[T], what: str) -> tuple[T, ...]:
    """A sequence of ``type_`` values, validated as a whole (paths index into it)."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise ValidationError(
            f"{what} must be a sequence of {type_.__name__}, got {type(values).__name__}"
        )
    for i, value in enumerate(values):
        if not isinstance(value, type_):
            raise ValidationError(
                f"{what} must hold {type_.__name__} values, got {type(value).__name__}",
                path=f"$[{i}]",
            )
    items_type: Any = tuple[type_, ...]  # type: ignore[valid-type]
    result: tuple[T, ...] = decode(encoded(tuple(values), what), items_type, what=what)
    return result


def check_ids(turns: Sequence[model.SessionTurn], runs: Sequence[model.SessionRun]) -> None:
    """Every turn and run id is a safe id, and no turn id repeats."""
    for i, turn in enumerate(turns):
        validate_id(turn.id, what=f"turn id at $.turns[{i}]")
    check_unique_turn_ids(turns)
    for i, run in enumerate(runs):
        validate_id(run.id, what=f"run id at $.runs[{i}]")


def checked_append(
    turns: Sequence[model.SessionTurn], options: model.AppendTurnsOptions | None
) -> tuple[tuple[model.SessionTurn, ...], model.SessionRun | None]:
    """Validated copies of an append's turns (ids safe and distinct) and its run.

    A ``CheckedTurns`` was checked already: its copies are decoded from its bodies.
    """
    unchecked: tuple[model.SessionTurn, ...] = ()
    if type(turns) is CheckedTurns:
        valid = tuple(map(_TURN.decode, turns.bodies))
    else:
        valid = unchecked = checked_items(turns, model.SessionTurn, "turns")
    run = None
    if options is not None:
        run = checked(options, model.AppendTurnsOptions, "append options").run
    check_ids(unchecked, () if run is None else (run,))
    return valid, run


def check_artifact_ids(artifact: model.SessionArtifact) -> None:
    """The artifact's own id and its session id are safe ids."""
    validate_id(artifact.session_id)
    validate_id(artifact.id, what="artifact id")


def check_artifact_filter_ids(filter: model.ArtifactFilter | None) -> None:
    """A filter's ``sessionId``, when set, is a safe id (as on every other method)."""
    if filter is not None and filter.session_id is not None:
        validate_id(filter.session_id)


def check_fire_ids(fire: model.ScheduleFire) -> None:
    """A fire's id and its schedule's id are safe ids."""
    validate_id(fire.schedule_id, what="schedule id")
    validate_id(fire.id, what="fire id")


def checked_header(data: object) -> model.SessionData:
    """``data`` is a ``SessionData`` with a safe id and a dict of metadata."""
    if not isinstance(data, model.SessionData):
        raise ValidationError(f"session data must be a SessionData, got {type(data).__name__}")
    validate_id(data.id)
    if not isinstance(data.metadata, dict):
        raise ValidationError("session metadata must be a dict", path="$.metadata")
    check_column_text(data.agent_id, what="agent id", path="$.agentId")
    check_column_text(data.project_root, what="project root", path="$.projectRoot")
    return data


def checked_meta_patch(patch: object) -> dict[str, Any]:
    """A metadata patch with string keys and JSON values; ``UNSET`` values (removals) kept."""
    if not isinstance(patch, Mapping):
        raise ValidationError(f"metadata patch must be a mapping, got {type(patch).__name__}")
    for key in patch:
        if not isinstance(key, str):
            raise ValidationError(f"metadata patch keys must be strings, got {preview(key)}")
    kept = {k: v for k, v in patch.items() if v is not UNSET}
    valid = decode(encoded(kept, "metadata patch"), dict[str, Any], what="metadata patch")
    return {k: valid.get(k, UNSET) for k in patch}


def json_value(value: object, what: str) -> Any:
    """A copy of the free-form JSON ``value``, refused when JSON cannot carry it exactly."""
    check_json(value, what=what)
    return parse_json(encode(value))
