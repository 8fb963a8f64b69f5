"""The OpenAPI 3.1 document of the session API, generated from the msgspec types."""

from __future__ import annotations

from typing import Any, Final

import attrs
import msgspec

from ..model import (
    ID_MAX_LENGTH,
    Schedule,
    ScheduleFire,
    SendRequestClaim,
    SendRequestRecord,
    SessionArtifact,
    SessionData,
    SessionMetaRow,
    SessionTurn,
)
from ..stores._remote import (
    AppendTurnsBody,
    AppendTurnsResult,
    ClaimedResult,
    ClaimFireBody,
    ClaimRunBody,
    ClaimRunResult,
    ClaimSendRequestBody,
    DeletedResult,
    DemotedResult,
    DemoteStaleRunBody,
    ErrorBody,
    HistoryBody,
    HistoryResult,
    HistoryState,
    IdResult,
    IdsResult,
    PatchMetaBody,
    SaveMetaBody,
    SettleSendRequestBody,
    UpdateRunBody,
    UpdateStatusBody,
    UpsertArtifactResult,
)

__all__ = ["openapi_document"]

_REF: Final = "#/components/schemas/{name}"
_ID_PATTERN: Final = r"^[A-Za-z0-9_][A-Za-z0-9_.:@+=-]*$"


@attrs.frozen
class _Op:
    path: str
    method: str
    summary: str
    capability: str | None = None
    body: Any = None
    ok: Any = None
    ok_status: int = 200
    query: tuple[tuple[str, str], ...] = ()
    not_found: bool = False


_FILTER: Final = (
    ("agentId", "string"),
    ("limit", "integer"),
    ("projectRoot", "string"),
    ("untaggedOnly", "boolean"),
)

_OPS: Final = (
    _Op("/capabilities", "get", "Optional methods the backing store serves", ok=list[str]),
    _Op("/sessions", "get", "List session ids", ok=IdsResult, query=_FILTER),
    _Op(
        "/session-meta",
        "get",
        "List session summaries",
        "list_meta",
        ok=list[SessionMetaRow],
        query=_FILTER,
    ),
    _Op("/session-ids", "post", "Generate a session id", ok=IdResult),
    _Op("/turn-ids", "post", "Generate a turn id", ok=IdResult),
    _Op("/sessions/{sessionId}", "get", "Load a session", ok=SessionData, not_found=True),
    _Op("/sessions/{sessionId}", "put", "Save a whole session", body=SessionData, ok_status=204),
    _Op("/sessions/{sessionId}", "delete", "Delete a session", ok_status=204),
    _Op(
        "/sessions/{sessionId}/turns",
        "get",
        "A slice of turns",
        ok=list[SessionTurn],
        query=(("from", "integer"), ("limit", "integer")),
    ),
    _Op(
        "/sessions/{sessionId}/turns",
        "post",
        "Append turns, skipping ids already stored",
        body=AppendTurnsBody,
        ok=AppendTurnsResult,
    ),
    _Op(
        "/sessions/{sessionId}/runs/{runId}",
        "put",
        "Upsert a run",
        body=UpdateRunBody,
        ok_status=204,
    ),
    _Op(
        "/sessions/{sessionId}/status",
        "put",
        "Set the status",
        body=UpdateStatusBody,
        ok_status=204,
    ),
    _Op(
        "/sessions/{sessionId}/meta",
        "get",
        "The session's header row",
        "get_meta",
        ok=SessionMetaRow,
        not_found=True,
    ),
    _Op(
        "/sessions/{sessionId}/meta",
        "put",
        "Save the header, upserting runs",
        "save_meta",
        body=SaveMetaBody,
        ok_status=204,
    ),
    _Op(
        "/sessions/{sessionId}/meta",
        "patch",
        "Patch metadata keys",
        "patch_meta",
        body=PatchMetaBody,
        ok_status=204,
    ),
    _Op(
        "/sessions/{sessionId}/claim-run",
        "post",
        "Claim the session for a run",
        "claim_run",
        body=ClaimRunBody,
        ok=ClaimRunResult,
    ),
    _Op(
        "/sessions/{sessionId}/demote-stale-run",
        "post",
        "Persist a load's stale-running demotion if the marker is still stale",
        "demote_stale_run",
        body=DemoteStaleRunBody,
        ok=DemotedResult,
    ),
    _Op(
        "/sessions/{sessionId}/history",
        "get",
        "Turns and runs with their revision",
        ok=HistoryState,
        not_found=True,
    ),
    _Op(
        "/sessions/{sessionId}/history",
        "put",
        "Write the history if its revision still matches",
        body=HistoryBody,
        ok=HistoryResult,
    ),
    _Op(
        "/sessions/{sessionId}/send-requests/{requestId}/claim",
        "post",
        "Claim a send request id",
        "claim_send_request",
        body=ClaimSendRequestBody,
        ok=SendRequestClaim,
    ),
    _Op(
        "/sessions/{sessionId}/send-requests/{requestId}",
        "get",
        "The record of a claimed request id",
        "find_send_request",
        ok=SendRequestRecord,
        not_found=True,
    ),
    _Op(
        "/sessions/{sessionId}/send-requests/{requestId}/result",
        "put",
        "Settle a claimed send",
        "settle_send_request",
        body=SettleSendRequestBody,
        ok_status=204,
    ),
    _Op(
        "/sessions/{sessionId}/artifacts",
        "put",
        "Upsert an artifact",
        "upsert_artifact",
        body=SessionArtifact,
        ok=UpsertArtifactResult,
    ),
    _Op(
        "/sessions/{sessionId}/artifacts/{artifactId}",
        "delete",
        "Delete an artifact",
        "delete_artifact",
        ok_status=204,
    ),
    _Op(
        "/artifacts",
        "get",
        "List artifacts",
        "list_artifacts",
        ok=list[SessionArtifact],
        query=(
            ("sessionId", "string"),
            ("kind", "string"),
            ("uri", "string"),
            ("since", "integer"),
            ("limit", "integer"),
            ("projectRoot", "string"),
            ("untaggedOnly", "boolean"),
        ),
    ),
    _Op("/schedules", "get", "List schedules", "list_schedules", ok=list[Schedule]),
    _Op(
        "/schedules/{scheduleId}",
        "put",
        "Create or replace a schedule",
        "save_schedule",
        body=Schedule,
        ok_status=204,
        query=(("keepNextFireAt", "boolean"),),
    ),
    _Op(
        "/schedules/{scheduleId}",
        "delete",
        "Delete a schedule",
        "delete_schedule",
        ok=DeletedResult,
    ),
    _Op(
        "/schedules/{scheduleId}/claim-fire",
        "post",
        "Claim a due fire",
        "claim_schedule_fire",
        body=ClaimFireBody,
        ok=ClaimedResult,
    ),
    _Op(
        "/schedules/{scheduleId}/fires",
        "get",
        "A schedule's fires, newest first",
        "list_schedule_fires",
        ok=list[ScheduleFire],
        query=(("limit", "integer"),),
    ),
    _Op(
        "/schedules/{scheduleId}/fires",
        "post",
        "Record a fire",
        "record_schedule_fire",
        body=ScheduleFire,
        ok_status=204,
    ),
)


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": _REF.format(name="ErrorBody")}}},
    }


def _path_params(path: str) -> list[dict[str, Any]]:
    names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
    return [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": _ID_PATTERN, "maxLength": ID_MAX_LENGTH},
        }
        for name in names
    ]


def _query_params(query: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
    params = []
    for name, kind in query:
        schema: dict[str, Any] = {"type": kind}
        if kind == "integer":
            schema["minimum"] = 0
            schema["maximum"] = 10**15 - 1
        params.append({"name": name, "in": "query", "required": False, "schema": schema})
    return params


def openapi_document(capabilities: frozenset[str]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the operations served over a store with ``capabilities``."""
    ops = [op for op in _OPS if op.capability is None or op.capability in capabilities]
    types = [t for op in ops for t in (op.body, op.ok) if t is not None]
    schemas, components = msgspec.json.schema_components([ErrorBody, *types], ref_template=_REF)
    schema_of = dict(zip([ErrorBody, *types], schemas, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for op in ops:
        responses: dict[str, Any] = {
            "400": _error("Unparsable JSON, a bad id or a bad query parameter"),
            "401": _error("Missing or wrong bearer token"),
            "403": _error("Non-loopback client without a configured token"),
            "409": _error("Conflict (revision mismatch, lost race)"),
            "413": _error("Body larger than the server's limit"),
            "422": _error("The body does not fit its schema"),
        }
        if op.ok_status == 204:
            responses["204"] = {"description": "Done"}
        else:
            responses[str(op.ok_status)] = {
                "description": "OK",
                "content": {"application/json": {"schema": schema_of[op.ok]}},
            }
        if op.not_found:
            responses["404"] = _error("Not found")
        operation: dict[str, Any] = {
            "operationId": f"{op.method}{op.path}".replace("/", "_")
            .replace("{", "")
            .replace("}", ""),
            "summary": op.summary,
            "parameters": _path_params(op.path) + _query_params(op.query),
            "responses": responses,
        }
        if op.body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": schema_of[op.body]}},
            }
        paths.setdefault(op.path, {})[op.method] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "zidane-actors session API", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
    }
