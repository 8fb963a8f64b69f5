"""Checks of the session API's arguments: what a caller hands in is refused, located, before
anything changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final, cast

import msgspec

from ..errors import (
    InvalidNameError,
    ValidationError,
)
from ..model import (
    AppendTurnsOptions,
    SessionRun,
    SessionStatus,
    SessionTurn,
    check_json,
    check_model,
    encode,
    key_segment,
    parse_json,
    preview,
    validate_id,
)
from ..model._checked import check_values

_STATUSES: Final = frozenset({"error", "running", "completed", "idle"})


def _json_copy(value: Any, what: str, path: str, depth: int) -> Any:
    """A deep copy of a JSON value (``UNSET`` kept), refusing what JSON cannot carry exactly.

    ``path`` and ``depth`` say where the value is stored (see ``check_json``).
    """
    if value is msgspec.UNSET:
        return value
    check_json(value, what=what, path=path, depth=depth)
    try:
        return parse_json(encode(value))
    except (TypeError, msgspec.EncodeError) as exc:
        raise ValidationError(f"{what} is not JSON-encodable: {exc}") from None


def _checked_runs(runs: Iterable[SessionRun]) -> tuple[SessionRun, ...]:
    return check_values(runs, SessionRun, "runs")


def _checked_append_options(options: AppendTurnsOptions | None) -> AppendTurnsOptions | None:
    if options is not None:
        check_model(options, what="append options", path="$.options")
    return options


def _meta_value(key: str, value: Any) -> Any:
    """A copy of ``metadata[key]``'s new value, located at ``$.metadata.<key>`` when refused."""
    return _json_copy(value, f"metadata[{preview(key)}]", "$.metadata" + key_segment(key), 1)


def _check_ids(values: Sequence[SessionTurn | SessionRun], field: str) -> None:
    """Every id is one a store can hold, and none repeats: refused before memory changes."""
    seen: set[str] = set()
    for i, value in enumerate(values):
        try:
            validate_id(value.id, what=f"{field[:-1]} id")
        except InvalidNameError as exc:
            raise InvalidNameError(str(exc), path=f"$.{field}[{i}].id") from None
        if value.id in seen:
            raise ValidationError(
                f"{field[:-1]} id {value.id!r} repeats", path=f"$.{field}[{i}].id"
            )
        seen.add(value.id)


def _checked_key(key: object) -> str:
    if not isinstance(key, str):
        raise ValidationError(f"metadata key must be a string, got {type(key).__name__}")
    return key


def _checked_status(status: object) -> SessionStatus:
    if not isinstance(status, str) or status not in _STATUSES:
        raise ValidationError(f"status must be one of {sorted(_STATUSES)}, got {preview(status)}")
    return cast(SessionStatus, status)


def _checked_agent(agent_id: object) -> str:
    if not isinstance(agent_id, str) or not agent_id:
        raise ValidationError(f"agent id must be a non-empty string, got {preview(agent_id)}")
    return agent_id
