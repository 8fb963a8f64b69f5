"""The OpenAPI 3.1 document of the session API, generated from the msgspec types."""

from __future__ import annotations

from typing import Any, Final

import attrs
import msgspec
import msgspec.inspect as mi

from .. import model
from ..model import (
    ID_MAX_LENGTH,
    REQUEST_ID_MAX_LENGTH,
    Schedule,
    ScheduleFire,
    SendRequestRecord,
    SessionArtifact,
    SessionData,
    SessionMetaRow,
    SessionTurn,
)
from ..model._extra import EXTRA_KEY
from ..model._types import RequiredDefault
from ..stores.remote import _bodies
from ..stores.remote._bodies import ErrorBody

__all__ = ["openapi_document"]

_REF: Final = "#/components/schemas/{name}"
# validate_id's rule: no leading dot or dash, never two dots in a row.
_ID_PATTERN: Final = r"^[A-Za-z0-9_](?:\.?[A-Za-z0-9_:@+=-])*\.?$"
# A send request id is the client's idempotency key, not a path: any text but NUL.
_REQUEST_ID_SCHEMA: Final = {
    "type": "string",
    "minLength": 1,
    "maxLength": REQUEST_ID_MAX_LENGTH,
    "pattern": "^[^\\u0000]+$",
}


# The rules the types check beyond their fields' own types, for the document to be exact.
_ID_FIELDS: Final = {
    "SessionData": ("id",),
    "SessionMetaRow": ("id",),
    "SessionTurn": ("id",),
    "SessionRun": ("id",),
    "SessionArtifact": ("id", "sessionId"),
    "Schedule": ("id",),
    "ScheduleFire": ("id", "scheduleId"),
    "AppendTurnsWrite": ("sessionId",),
    "DeleteWrite": ("sessionId",),
    "UpdateRunWrite": ("sessionId",),
    "UpdateStatusWrite": ("sessionId",),
    "PatchMetaWrite": ("sessionId",),
    "SettleSendRequestWrite": ("sessionId",),
    "DeleteArtifactWrite": ("sessionId", "artifactId"),
}
_REQUEST_ID_FIELDS: Final = {
    "SendRequestRecord": ("requestId",),
    "SettleSendRequestWrite": ("requestId",),
}


def _exactly_one(*names: str) -> dict[str, Any]:
    return {"oneOf": [{"required": [n], "properties": {n: {"type": "string"}}} for n in names]}


_INLINE_DATA_NEEDS_TYPE: Final = {
    "if": {"required": ["data"], "properties": {"data": {"type": "string"}}},
    "then": {
        "required": ["mediaType"],
        "properties": {"mediaType": {"type": "string", "minLength": 1}},
    },
}
_CROSS_FIELD: Final = {
    "ImageBlock": {**_exactly_one("data", "url", "ref"), **_INLINE_DATA_NEEDS_TYPE},
    "FileBlock": {**_exactly_one("data", "url", "text", "ref"), **_INLINE_DATA_NEEDS_TYPE},
}


def _schema_hook(type_: type) -> dict[str, Any]:
    if type_ is model.ExtraFields:
        return {"type": "object"}
    raise NotImplementedError


def _structs(types: list[Any]) -> dict[str, type]:
    """Every model type ``types`` reach, by the name its schema component has."""
    found: dict[str, type] = {}

    def walk(info: mi.Type) -> None:
        if isinstance(info, mi.StructType):
            if found.setdefault(info.cls.__name__, info.cls) is not info.cls:
                return
            for field in info.fields:
                walk(field.type)
        elif isinstance(info, mi.UnionType):
            for member in info.types:
                walk(member)
        elif isinstance(info, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
            walk(info.item_type)
        elif isinstance(info, mi.TupleType):
            for member in info.item_types:
                walk(member)
        elif isinstance(info, mi.DictType):
            walk(info.value_type)

    for info in mi.multi_type_info(types):
        walk(info)
    return found


def _spec_required(components: dict[str, Any], structs: dict[str, type]) -> None:
    """List as required the fields the spec requires that a reader still fills in when absent.

    (``SessionData``'s ``status``, ``metadata``, ``turns`` and ``runs``, ``TurnUsage``'s
    ``input`` and ``output``: every answer holds them; msgspec sees only their defaults.)
    """
    for name, schema in components.items():
        cls = structs.get(name)
        if cls is None:
            continue
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        factories = {f.encode_name: f.default_factory for f in info.fields}
        spec = {n for n, make in factories.items() if isinstance(make, RequiredDefault)}
        if spec:  # in the fields' order, as msgspec lists the others
            listed = set(schema.get("required", ())) | spec
            schema["required"] = [n for n in factories if n in listed]


def _tighten(components: dict[str, Any]) -> None:
    """Add the id rules and the cross-field rules to the generated schemas.

    A document type keeps the fields it does not know (``extra_fields``):
    its schema allows additional properties instead of naming that field.
    """
    for schema in components.values():
        properties = schema.get("properties", {})
        if properties.pop(EXTRA_KEY, None) is not None:
            schema.pop("additionalProperties", None)
    for name, fields in _ID_FIELDS.items():
        properties = components.get(name, {}).get("properties", {})
        for field in fields:
            if properties.get(field, {}).get("type") == "string":
                properties[field].update(pattern=_ID_PATTERN, maxLength=ID_MAX_LENGTH)
    for name, fields in _REQUEST_ID_FIELDS.items():
        properties = components.get(name, {}).get("properties", {})
        for field in fields:
            if field in properties:
                properties[field] = dict(_REQUEST_ID_SCHEMA)
    for name, rules in _CROSS_FIELD.items():
        if name in components:
            components[name].update(rules)


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


_FILTER: Final = (
    ("agentId", "string"),
    ("limit", "integer"),
    ("projectRoot", "string"),
    ("untaggedOnly", "boolean"),
)

_OPS: Final = (
    _Op("/capabilities", "get", "Optional methods the backing store serves", ok=list[str]),
    _Op(
        "/writes",
        "post",
        "Apply store writes in order (one transaction where the store can); one outcome each",
        body=_bodies.WritesBody,
        ok=_bodies.WritesResult,
    ),
    _Op("/sessions", "get", "List session ids", ok=_bodies.IdsResult, query=_FILTER),
    _Op(
        "/session-meta",
        "get",
        "List session summaries",
        "list_meta",
        ok=list[SessionMetaRow],
        query=_FILTER,
    ),
    _Op(
        "/session-search",
        "get",
        "Sessions whose words match text (prefixes of words in messages, tool names, titles,"
        " ids), filtered, one page of summaries and the count of matches",
        "search_meta",
        ok=model.SessionSearchPage,
        query=(
            ("text", "string"),
            ("agentId", "string"),
            ("projectRoot", "string"),
            ("untaggedOnly", "boolean"),
            ("status", "enum:idle,running,completed,error"),
            ("createdFrom", "integer"),
            ("createdTo", "integer"),
            ("updatedFrom", "integer"),
            ("updatedTo", "integer"),
            ("order", "enum:updated,created"),
            ("limit", "integer:1000"),
            ("offset", "integer"),
            ("countLimit", "integer:1000000"),
        ),
    ),
    _Op("/session-ids", "post", "Generate a session id", ok=_bodies.IdResult),
    _Op("/turn-ids", "post", "Generate a turn id", ok=_bodies.IdResult),
    _Op("/sessions/{sessionId}", "get", "Load a session", ok=SessionData),
    _Op("/sessions/{sessionId}", "put", "Save a whole session", body=SessionData, ok_status=204),
    _Op("/sessions/{sessionId}", "delete", "Delete a session", ok_status=204),
    _Op(
        "/sessions/{sessionId}/rev",
        "get",
        "The session's change counter",
        "get_rev",
        ok=_bodies.RevResult,
    ),
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
        "Append turns, skipping ids stored with identical content",
        body=_bodies.AppendTurnsBody,
        ok_status=204,
    ),
    _Op(
        "/sessions/{sessionId}/model-view",
        "get",
        "The turns the model sees: the latest compaction's summary, then the turns after it",
        ok=list[SessionTurn],
    ),
    _Op(
        "/sessions/{sessionId}/forks",
        "post",
        "Fork the session through a turn (all turns by default) into a new session",
        body=_bodies.ForkBody,
        ok=_bodies.IdResult,
        ok_status=201,
    ),
    _Op(
        "/sessions/{sessionId}/forks",
        "get",
        "The ids of the session's direct forks, sorted",
        ok=_bodies.IdsResult,
    ),
    _Op(
        "/sessions/{sessionId}/runs/{runId}",
        "put",
        "Upsert a run",
        body=_bodies.UpdateRunBody,
        ok_status=204,
    ),
    _Op(
        "/sessions/{sessionId}/status",
        "put",
        "Set the status",
        body=_bodies.UpdateStatusBody,
        ok_status=204,
    ),
    _Op(
        "/sessions/{sessionId}/meta",
        "get",
        "The session's header row",
        "get_meta",
        ok=SessionMetaRow,
    ),
    _Op(
        "/sessions/{sessionId}/meta",
        "put",
        "Save the header, upserting runs",
        "save_meta",
        body=_bodies.SaveMetaBody,
        ok_status=204,
    ),
    _Op(
        "/sessions/{sessionId}/meta",
        "patch",
        "Patch metadata keys",
        "patch_meta",
        body=_bodies.PatchMetaBody,
        ok_status=204,
    ),
    _Op(
        "/sessions/{sessionId}/claim-run",
        "post",
        "Claim the session for a run",
        "claim_run",
        body=_bodies.ClaimRunBody,
        ok=_bodies.ClaimRunResult,
    ),
    _Op(
        "/sessions/{sessionId}/demote-stale-run",
        "post",
        "Persist a load's stale-running demotion if the marker is still stale",
        "demote_stale_run",
        body=_bodies.DemoteStaleRunBody,
        ok=_bodies.DemotedResult,
    ),
    _Op(
        "/sessions/{sessionId}/history",
        "get",
        "Turns and runs with their revision",
        ok=_bodies.HistoryState,
    ),
    _Op(
        "/sessions/{sessionId}/history",
        "put",
        "Write the history if its revision still matches",
        body=_bodies.HistoryBody,
        ok=_bodies.HistoryResult,
    ),
    _Op(
        "/sessions/{sessionId}/send-requests/{requestId}/claim",
        "post",
        "Claim a send request id",
        "claim_send_request",
        body=_bodies.ClaimSendRequestBody,
        ok=model.SendRequestClaim,
    ),
    _Op(
        "/sessions/{sessionId}/send-requests",
        "get",
        "Every request id the session holds, oldest claim first",
        "list_send_requests",
        ok=list[SendRequestRecord],
    ),
    _Op(
        "/sessions/{sessionId}/send-requests/{requestId}",
        "get",
        "The record of a claimed request id",
        "find_send_request",
        ok=SendRequestRecord,
    ),
    _Op(
        "/sessions/{sessionId}/send-requests/{requestId}",
        "put",
        "Store a request id's record exactly as given (a copy or an import)",
        "put_send_request",
        body=SendRequestRecord,
        ok_status=204,
    ),
    _Op(
        "/sessions/{sessionId}/send-requests/{requestId}/result",
        "put",
        "Settle a claimed send",
        "settle_send_request",
        body=_bodies.SettleSendRequestBody,
        ok_status=204,
    ),
    _Op(
        "/sessions/{sessionId}/artifacts",
        "put",
        "Upsert an artifact",
        "upsert_artifact",
        body=SessionArtifact,
        ok=_bodies.UpsertArtifactResult,
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
            ("sessionId", "id"),
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
        ok=_bodies.DeletedResult,
    ),
    _Op(
        "/schedules/{scheduleId}/claim-fire",
        "post",
        "Claim a due fire",
        "claim_schedule_fire",
        body=_bodies.ClaimFireBody,
        ok=_bodies.ClaimedResult,
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
    id_schema = {"type": "string", "pattern": _ID_PATTERN, "maxLength": ID_MAX_LENGTH}
    return [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": dict(_REQUEST_ID_SCHEMA if name == "requestId" else id_schema),
        }
        for name in names
    ]


def _query_params(query: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
    params = []
    for name, kind in query:
        schema: dict[str, Any] = {"type": kind}
        if kind == "id":
            schema = {"type": "string", "pattern": _ID_PATTERN, "maxLength": ID_MAX_LENGTH}
        if kind == "integer":
            schema["minimum"] = 0
            schema["maximum"] = 10**15 - 1
        if kind.startswith("integer:"):  # a tighter maximum than the default
            schema = {"type": "integer", "minimum": 0, "maximum": int(kind.split(":")[1])}
        if kind.startswith("enum:"):
            schema = {"type": "string", "enum": kind.removeprefix("enum:").split(",")}
        params.append({"name": name, "in": "query", "required": False, "schema": schema})
    return params


def openapi_document(capabilities: frozenset[str]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the operations served over a store with ``capabilities``."""
    ops = [op for op in _OPS if op.capability is None or op.capability in capabilities]
    types = [t for op in ops for t in (op.body, op.ok) if t is not None]
    schemas, components = msgspec.json.schema_components(
        [ErrorBody, *types], schema_hook=_schema_hook, ref_template=_REF
    )
    schema_of = dict(zip([ErrorBody, *types], schemas, strict=True))
    _tighten(components)
    _spec_required(components, _structs([ErrorBody, *types]))
    paths: dict[str, dict[str, Any]] = {}
    for op in ops:
        responses: dict[str, Any] = {
            "400": _error("Unparsable JSON, a bad id or a bad query parameter"),
            "401": _error("Missing or wrong bearer token"),
            "403": _error("Without a token: a non-loopback client, Host or a foreign Origin"),
            "404": _error("Unknown session, record or route"),
            "409": _error(
                "Conflict: a body id differs from the URL's, a key both set and removed, "
                "a stale revision, a turn id stored with other content"
            ),
            "422": _error("A value the store refuses"),
            "503": _error("At a limit (see Retry-After), or the store is unavailable"),
        }
        if op.body is not None:
            responses["408"] = _error("The body did not arrive in time")
            responses["413"] = _error("Body larger than the server's limit")
            responses["415"] = _error("Without a token: a body not sent as application/json")
            responses["422"] = _error("The body does not fit its schema, or the store refuses it")
        if op.capability is not None:
            responses["501"] = _error("The backing store lacks this method")
        if op.ok_status == 204:
            responses["204"] = {"description": "Done"}
        else:
            responses[str(op.ok_status)] = {
                "description": "OK",
                "content": {"application/json": {"schema": schema_of[op.ok]}},
            }
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
