"""The persisted data model: frozen msgspec Structs with the spec's camelCase keys.

Every type here is a value: frozen, sequences are tuples, and absent optional
fields are omitted from the JSON (``omit_defaults``), so a document written
here reads the same in zidane and back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeAlias

import msgspec
from msgspec import UNSET, Meta, UnsetType

from ..errors import ValidationError
from ._extra import ExtraFields, json_name
from ._words import check_search_text

__all__ = [
    "AppendTurnsOptions",
    "ArtifactFilter",
    "DropPartials",
    "FileBlock",
    "ImageBlock",
    "JsonValue",
    "NativeBlock",
    "PruneSteps",
    "ReasoningBlock",
    "RunErrorDetail",
    "RunEstimate",
    "RunEstimateFailure",
    "RunOrigin",
    "RunOwner",
    "RunStatus",
    "RunUserWait",
    "SaveMetaOptions",
    "Schedule",
    "ScheduleFire",
    "SearchOrder",
    "SendRequestClaim",
    "SendRequestRecord",
    "SessionArtifact",
    "SessionArtifactInput",
    "SessionContentBlock",
    "SessionData",
    "SessionFilter",
    "SessionHistory",
    "SessionMessage",
    "SessionMetaRow",
    "SessionRun",
    "SessionRunAgent",
    "SessionRunRetry",
    "SessionSearch",
    "SessionSearchPage",
    "SessionStatus",
    "SessionTurn",
    "StoredRunBehavior",
    "StoredRunOptions",
    "TextBlock",
    "ToolCallBlock",
    "ToolResultBlock",
    "TurnRole",
    "TurnUsage",
    "UpdateRunOptions",
    "call_input",
    "reasoning_text",
]

Number: TypeAlias = int | float
"""A JSON number field: ``12000`` reads back as ``12000``, ``12000.0`` as ``12000.0``."""

JsonValue: TypeAlias = Any
"""Any JSON value (``None``, bool, int, float, str, list, dict with str keys)."""

MAX_SAFE_INTEGER = 2**53 - 1
"""Largest integer a JavaScript number holds exactly: zidane reads these documents too."""

NonEmptyStr = Annotated[str, Meta(min_length=1)]
EpochMs = Annotated[int, Meta(ge=0, le=MAX_SAFE_INTEGER)]
Count = Annotated[int, Meta(ge=0, le=MAX_SAFE_INTEGER)]

SessionStatus: TypeAlias = Literal["error", "running", "completed", "idle"]
RunStatus: TypeAlias = Literal["error", "running", "completed", "aborted"]
TurnRole: TypeAlias = Literal["system", "user", "assistant", "command"]
ThinkingLevel: TypeAlias = Literal[
    "off", "minimal", "low", "medium", "high", "xhigh", "max", "adaptive"
]


class _Strict(
    msgspec.Struct, frozen=True, omit_defaults=True, rename="camel", forbid_unknown_fields=True
):
    """Base of the option and filter types: an unknown field is refused (it could not be obeyed)."""


class _Value(
    msgspec.Struct,
    frozen=True,
    omit_defaults=True,
    kw_only=True,
    rename=json_name,
    forbid_unknown_fields=True,
):
    """Base of every persisted value type.

    ``extra_fields`` holds the fields of a document this version does not
    know, kept as written (see docs/architecture.md). Decoders find them
    where msgspec refuses an unknown field (``forbid_unknown_fields``), so
    documents without them decode at full speed.
    """

    extra_fields: ExtraFields | None = None


class RequiredDefault:
    """The default factory of a field the spec marks required (see :func:`_required`).

    Its own type, so the OpenAPI document can list such a field as required.
    """

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make

    def __call__(self) -> Any:
        return self.make()


def _required(make: Callable[[], Any]) -> Any:
    """The default of a field the spec marks required: always written, filled in when absent.

    ``omit_defaults`` leaves out a value equal to a plain default (or to what
    a builtin container factory such as ``dict`` makes), but never one made by
    another factory.
    So the field is written even when it holds its default, and a document
    written before (without the field) still decodes.
    """
    return msgspec.field(default_factory=RequiredDefault(make))


class _Block(_Value, frozen=True, tag_field="type"):
    """Base of the content blocks, tagged by their ``type`` key."""


def _one_source(kind: str, sources: dict[str, object]) -> None:
    given = [name for name, value in sources.items() if value is not None]
    if len(given) != 1:
        names = "/".join(sources)
        raise ValidationError(f"{kind} block needs exactly one of {names}, got {given or 'none'}")


class TextBlock(_Block, frozen=True, tag="text"):
    """Plain text."""

    text: str
    provider_data: dict[str, JsonValue] | None = None


class ImageBlock(_Block, frozen=True, tag="image"):
    """An image, inline (base64 ``data`` + ``mediaType``), by ``url``, or by content ``ref``."""

    media_type: str | None = None
    data: str | None = None
    url: str | None = None
    ref: str | None = None
    provider_data: dict[str, JsonValue] | None = None

    def __post_init__(self) -> None:
        _one_source("image", {"data": self.data, "url": self.url, "ref": self.ref})
        if self.data is not None and not self.media_type:
            raise ValidationError("image block with inline data needs a mediaType")


class FileBlock(_Block, frozen=True, tag="file"):
    """A document: inline base64 ``data``, a ``url``, plain ``text`` or a content ``ref``."""

    media_type: str | None = None
    data: str | None = None
    url: str | None = None
    text: str | None = None
    ref: str | None = None
    name: str | None = None
    provider_data: dict[str, JsonValue] | None = None

    def __post_init__(self) -> None:
        _one_source(
            "file", {"data": self.data, "url": self.url, "text": self.text, "ref": self.ref}
        )
        if self.data is not None and not self.media_type:
            raise ValidationError("file block with inline data needs a mediaType")


class ToolCallBlock(_Block, frozen=True, tag="tool_call"):
    """A tool call the model made; ``input`` is a JSON object (``UNSET`` when left out)."""

    id: NonEmptyStr
    name: NonEmptyStr
    input: dict[str, JsonValue] | UnsetType = UNSET
    provider_data: dict[str, JsonValue] | None = None


class NativeBlock(_Block, frozen=True, tag="native"):
    """A provider block with no neutral counterpart, kept verbatim for that provider.

    ``provider`` names the wire format it came from (``anthropic``,
    ``openai-chat``, ``openai-responses``) and ``data`` is the block exactly
    as that format wrote it (an Anthropic server-tool result, a Chat
    ``input_audio`` part, a Responses ``web_search_call`` item...). The same
    format gets it back byte-exact; others get the documented downgrade.
    """

    provider: NonEmptyStr
    data: dict[str, JsonValue]


ToolResultPart: TypeAlias = TextBlock | ImageBlock | FileBlock | NativeBlock


class ToolResultBlock(_Block, frozen=True, tag="tool_result"):
    """The result of the tool call ``callId``: a string or text/image/file blocks."""

    call_id: NonEmptyStr
    output: str | tuple[ToolResultPart, ...]
    is_error: bool | None = None
    name: str | None = None
    provider_data: dict[str, JsonValue] | None = None


class ReasoningBlock(_Block, frozen=True, tag="reasoning"):
    """Model reasoning, kept byte-exact for replay to the provider that made it.

    ``provider`` names its origin (``anthropic``, ``openai``); ``signature``
    (Anthropic thinking signature, OpenAI encrypted content) and
    ``redactedData`` (Anthropic redacted thinking) are opaque.
    """

    text: str | UnsetType = UNSET
    provider: str | None = None
    signature: str | None = None
    redacted_data: str | None = None
    id: str | None = None
    provider_data: dict[str, JsonValue] | None = None


def call_input(block: ToolCallBlock) -> dict[str, JsonValue]:
    """The call's ``input``: ``{}`` when the document left it out (what a provider needs)."""
    return {} if block.input is UNSET else block.input


def reasoning_text(block: ReasoningBlock) -> str:
    """The reasoning's ``text``: ``""`` when the document left it out."""
    return "" if block.text is UNSET else block.text


SessionContentBlock: TypeAlias = (
    TextBlock
    | ImageBlock
    | FileBlock
    | ToolCallBlock
    | ToolResultBlock
    | ReasoningBlock
    | NativeBlock
)


class SessionMessage(_Value, frozen=True):
    """A provider-neutral message: what a provider request is built from.

    ``providerData`` (like the blocks' own) keeps the wire details the neutral
    fields do not carry, tagged with the wire format they belong to; see
    docs/wire.md.
    """

    role: Literal["system", "user", "assistant"]
    content: tuple[SessionContentBlock, ...]
    provider_data: dict[str, JsonValue] | None = None


class TurnUsage(_Value, frozen=True):
    """Token usage of one turn (or a run's total)."""

    input: Count = _required(lambda: 0)
    output: Count = _required(lambda: 0)
    cache_read: Count | None = None
    cache_creation: Count | None = None
    cost: Number | None = None
    model: str | None = None
    turn_id: str | None = None


class SessionTurn(_Value, frozen=True, weakref=True):
    """One persisted turn of a conversation."""

    id: NonEmptyStr
    role: TurnRole
    content: tuple[SessionContentBlock, ...]
    created_at: EpochMs
    run_id: str | None = None
    usage: TurnUsage | None = None
    metadata: dict[str, JsonValue] | None = None
    provider_data: dict[str, JsonValue] | None = None


class SessionRunAgent(_Value, frozen=True):
    """A host agent profile as a run record names it."""

    id: str
    label: str


class RunEstimate(_Value, frozen=True):
    """A run's expected duration."""

    at: EpochMs
    high_ms: Number
    initial_ms: Number
    revisions: Count
    total_ms: Number
    calibration: Number | None = None
    overrun_checked: Literal[True] | None = None


class RunEstimateFailure(_Value, frozen=True):
    """Why a run's estimate failed."""

    at: EpochMs
    reason: str
    message: str | None = None


class RunUserWait(_Value, frozen=True):
    """Time a run spent waiting on the user (``ms`` is required, as in the spec)."""

    ms: Number
    since: EpochMs | None = None


class RunErrorDetail(_Value, frozen=True):
    """What a run error's one line leaves out."""

    message: str | None = None
    provider_message: str | None = None
    status_code: int | None = None
    code: str | None = None
    reset_at: EpochMs | None = None
    retry_after_ms: Number | None = None


class SessionRunRetry(_Value, frozen=True):
    """One provider stream retry of a run."""

    attempt: Annotated[int, Meta(ge=1)]
    delay_ms: Number
    max_attempts: Annotated[int, Meta(ge=0)]
    message: str
    turn_id: str
    code: str | None = None
    discarded_text: Literal[True] | None = None
    error_type: str | None = None
    status_code: int | None = None


class RunOrigin(_Value, frozen=True):
    """How a run was initiated when not a plain user prompt."""

    kind: Literal["command"]
    display: str | None = None


class StoredRunBehavior(_Value, frozen=True):
    """The caps a checkpoint run keeps."""

    max_turns: int | None = None
    max_tokens: int | None = None
    max_cost_usd: Number | None = None
    max_total_tokens: int | None = None
    max_wall_ms: Number | None = None
    retry: dict[str, JsonValue] | None = None
    resume_on_max_tokens: bool | None = None


class StoredRunOptions(_Value, frozen=True):
    """What a checkpoint run keeps of its options."""

    behavior: StoredRunBehavior | None = None
    model: str | tuple[str | dict[str, JsonValue], ...] | None = None
    model_options: dict[str, bool] | None = None
    thinking: ThinkingLevel | None = None


class SessionRun(_Value, frozen=True, weakref=True):
    """Record of one agent run inside a session."""

    id: NonEmptyStr
    prompt: str
    started_at: EpochMs
    status: RunStatus
    agent: SessionRunAgent | None = None
    cost: Number | None = None
    depth: Count | None = None
    ended_at: EpochMs | None = None
    error: str | None = None
    error_detail: RunErrorDetail | None = None
    estimate: RunEstimate | None = None
    estimate_failure: RunEstimateFailure | None = None
    label: str | None = None
    loop_turn: Count | None = None
    options: StoredRunOptions | None = None
    origin: RunOrigin | None = None
    parent_call_id: str | None = None
    parent_run_id: str | None = None
    resumable: Literal[True] | None = None
    resumed_from_run_id: str | None = None
    stream_retries: tuple[SessionRunRetry, ...] | None = None
    tokens_in: Count | None = None
    tokens_out: Count | None = None
    total_usage: TurnUsage | None = None
    turns: Count | None = None
    turn_usage: tuple[TurnUsage, ...] | None = None
    user_wait: RunUserWait | None = None
    wall_ms: Number | None = None


class RunOwner(_Value, frozen=True):
    """Who wrote a stored ``running`` marker."""

    host_id: str
    pid: Annotated[int, Meta(ge=0)]
    token: str
    started_at: EpochMs | None = None


class SessionData(_Value, frozen=True):
    """Persisted form of a session: identity, turns, runs and metadata."""

    id: NonEmptyStr
    created_at: EpochMs
    updated_at: EpochMs
    status: SessionStatus = _required(lambda: "idle")
    metadata: dict[str, JsonValue] = _required(lambda: {})
    turns: tuple[SessionTurn, ...] = _required(lambda: ())
    runs: tuple[SessionRun, ...] = _required(lambda: ())
    agent_id: str | None = None
    project_root: str | None = None
    run_owner: RunOwner | None = None


class SessionHistory(_Value, frozen=True):
    """A session's turns and runs: what a history edit reads and writes."""

    turns: tuple[SessionTurn, ...]
    runs: tuple[SessionRun, ...]


class SessionMetaRow(_Value, frozen=True):
    """Compact per-session summary (``list_meta`` / ``get_meta``)."""

    id: str
    metadata: dict[str, JsonValue]
    run_count: Count
    turn_count: Count
    updated_at: EpochMs
    user_message_count: Count
    agent_id: str | None = None
    artifact_count: Count | None = None
    created_at: EpochMs | None = None
    first_user_turn: SessionTurn | None = None
    project_root: str | None = None
    rev: Count | None = None
    run_owner: RunOwner | None = None
    status: SessionStatus | None = None
    corrupt: str | None = None
    """Set (to what failed) on a listed session whose stored header does not decode:
    the listing names it instead of failing as a whole; its other fields are empty."""


class SessionFilter(_Strict, frozen=True):
    """Filter of ``list`` / ``list_meta``; conditions AND together.

    ``projectRoot`` is tri-state: a string keeps that project only, ``None``
    keeps untagged sessions only, ``UNSET`` (the default) ignores the axis.
    """

    agent_id: str | None = None
    limit: Annotated[int, Meta(ge=0)] | None = None
    project_root: str | UnsetType | None = UNSET


SearchOrder: TypeAlias = Literal["updated", "created"]


class SessionSearch(_Value, frozen=True):
    """Query of ``search_meta``: words, filters, order and page; conditions AND together.

    ``text`` matches a session when every word in it (a run of letters, marks and
    numbers, compared in NFKC with case folded) is a prefix of a word of the session's id,
    ``metadata.title``, the text of its text blocks or the name of a tool it
    called (see :func:`~zidane_actors.model.search_words`); text without a
    word matches every session. ``projectRoot`` is tri-state as in
    :class:`SessionFilter`. The ``*From`` bounds are inclusive and the
    ``*To`` bounds exclusive (epoch ms). Rows come newest first by
    ``order`` (``updatedAt`` or ``createdAt``), ties by id, from ``offset``.
    ``total`` counts the matches up to ``countLimit``.

    ``text`` is bounded (:func:`~zidane_actors.model.check_search_text`): at most
    :data:`~zidane_actors.model.MAX_SEARCH_TEXT` characters, and
    :data:`~zidane_actors.model.MAX_SEARCH_WORDS` words of at most
    :data:`~zidane_actors.model.MAX_SEARCH_WORD_LENGTH` characters; longer text
    is a :class:`~zidane_actors.errors.ValidationError` located at ``$.text``.
    """

    text: str | None = None
    agent_id: str | None = None
    project_root: str | UnsetType | None = UNSET
    status: SessionStatus | None = None
    created_from: EpochMs | None = None
    created_to: EpochMs | None = None
    updated_from: EpochMs | None = None
    updated_to: EpochMs | None = None
    order: SearchOrder = "updated"
    limit: Annotated[int, Meta(ge=0, le=1000)] = 50
    offset: Annotated[int, Meta(ge=0, le=MAX_SAFE_INTEGER)] = 0
    count_limit: Annotated[int, Meta(ge=0, le=1_000_000)] = 10_000

    def __post_init__(self) -> None:
        if self.text is not None:
            check_search_text(self.text)


class SessionSearchPage(_Value, frozen=True):
    """What ``search_meta`` answers: one page of rows and the count of matches.

    ``total`` is the number of matching sessions when ``totalExact``; when
    more than the query's ``countLimit`` match, it is ``countLimit`` and
    ``totalExact`` is false.
    """

    rows: tuple[SessionMetaRow, ...]
    total: Count
    total_exact: bool


class SessionArtifact(_Value, frozen=True):
    """A recorded output of a session (pull request, branch, commit, file…)."""

    id: NonEmptyStr
    session_id: NonEmptyStr
    kind: NonEmptyStr
    uri: NonEmptyStr
    label: str
    created_at: EpochMs
    updated_at: EpochMs
    meta: JsonValue | UnsetType = UNSET
    project_root: str | None = None
    run_id: str | None = None
    turn_id: str | None = None


class SessionArtifactInput(_Strict, frozen=True):
    """What a producer hands to ``Session.add_artifact``."""

    kind: NonEmptyStr
    uri: NonEmptyStr
    label: NonEmptyStr
    meta: JsonValue | UnsetType = UNSET
    project_root: str | None = None


class ArtifactFilter(_Strict, frozen=True):
    """Filter for listing artifacts; fields combine with AND.

    ``projectRoot`` is tri-state like :class:`SessionFilter`.
    """

    kind: str | None = None
    limit: Annotated[int, Meta(ge=0)] | None = None
    project_root: str | UnsetType | None = UNSET
    session_id: str | None = None
    since: EpochMs | None = None
    uri: str | None = None


class SendRequestRecord(_Value, frozen=True):
    """A claimed send request id; ``result`` is UNSET while the send is in flight."""

    request_id: NonEmptyStr
    fingerprint: str
    created_at: EpochMs
    result: JsonValue | UnsetType = UNSET


class SendRequestClaim(_Value, frozen=True):
    """What ``claim_send_request`` answers: claimed, or the record holding the id."""

    claimed: bool
    record: SendRequestRecord | None = None

    def __post_init__(self) -> None:
        if self.claimed == (self.record is not None):
            raise ValidationError("a claim carries a record exactly when it was not claimed")


class ScheduleFire(_Value, frozen=True):
    """One fire of a schedule."""

    id: NonEmptyStr
    schedule_id: NonEmptyStr
    due_at: EpochMs
    fired_at: EpochMs
    status: Literal["ok", "error", "skipped"]
    session_id: str | None = None
    run_id: str | None = None
    error: str | None = None


class Schedule(_Value, frozen=True):
    """A prompt to run on a session at times (an interval or a cron expression)."""

    id: NonEmptyStr
    prompt: str
    enabled: bool
    created_at: EpochMs
    updated_at: EpochMs
    next_fire_at: EpochMs | None = None
    name: str | None = None
    session_id: str | None = None
    agent_id: str | None = None
    project_root: str | None = None
    interval_ms: Annotated[int, Meta(gt=0)] | None = None
    cron: str | None = None
    timezone: str | None = None
    last_fire: ScheduleFire | None = None


class DropPartials(_Strict, frozen=True):
    """``AppendTurnsOptions.dropPartials``."""

    run_id: NonEmptyStr


class PruneSteps(_Strict, frozen=True):
    """``pruneSteps``: drop run ``runId``'s step records up to ``throughTurn`` (all when unset)."""

    run_id: NonEmptyStr
    through_turn: Count | None = None


class AppendTurnsOptions(_Strict, frozen=True):
    """Options of ``append_turns``; ``run`` is upserted in the same write as the turns."""

    drop_partials: DropPartials | None = None
    prune_steps: PruneSteps | None = None
    run: SessionRun | None = None


class UpdateRunOptions(_Strict, frozen=True):
    """Options of ``update_run``."""

    prune_steps: PruneSteps | None = None


class SaveMetaOptions(_Strict, frozen=True):
    """Options of ``save_meta``: ``metaKeys`` names the metadata keys this writer changed."""

    meta_keys: tuple[str, ...] | None = None
