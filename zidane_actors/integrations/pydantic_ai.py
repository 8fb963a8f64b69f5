"""pydantic-ai message history ↔ zidane turns and runs, each part stored once.

A ``ModelRequest`` becomes one ``user`` turn (user prompts' text and images,
tool returns, retry feedback as text), preceded by a ``system`` turn when it
opens with system prompts; a ``ModelResponse`` becomes one ``assistant``
turn (text, tool calls, thinking) carrying its token ``usage``. That
neutral content is what other zidane code, other providers and the
session browser read. A tool return whose outcome is ``failed`` or
``retried`` (a ``ModelRetry``) is an error result (``isError``).

What the neutral blocks do not hold (timestamps, ids, provider details,
usage details, part kinds zidane has no block for) is kept next to them,
without repeating what the blocks hold: each block's
``providerData["part"]`` is its part minus the fields the block gives
back, the turn's ``providerData["message"]`` its message minus the parts
(both tagged ``"provider": "pydantic-ai"``), and parts with no neutral
counterpart are ``NativeBlock``s. A history comes back exactly as
pydantic-ai wrote it (a deprecated ``RetryPromptPart`` as itself), and a
block edited by other code comes back edited. Turns written by earlier
versions keep a whole copy in ``metadata["pydanticAiMessage"]``, still read.

Each agent run in the stored messages (pydantic-ai's ``run_id``) is also
recorded as a ``SessionRun`` (start and end from the message timestamps,
models, usage and cost per response, the agent, the OpenTelemetry span it
was stored in as ``traceContext``), in the same write as its turns; the
session's ``agentId`` becomes the agent's name when it has none.

``message_history(session)`` gives a session's history for
``agent.run(..., message_history=...)``; ``append_messages`` /
``append_messages_sync`` store ``result.new_messages()``. ``run_agent`` /
``run_agent_sync`` make the run and store it as it ended: a run that raises
keeps the messages it exchanged and ends ``error`` with the exception's
type and text. Requires the ``pydantic-ai`` extra.
"""

from __future__ import annotations

import base64
import datetime
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal, cast

import msgspec
import pydantic
from pydantic_ai import capture_run_messages
from pydantic_ai.agent import AbstractAgent, AgentRunResult
from pydantic_ai.messages import (
    BinaryContent,
    DocumentUrl,
    ImageUrl,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from ..actors import Session
from ..errors import InvalidNameError, ValidationError
from ..model import (
    AppendTurnsOptions,
    FileBlock,
    ImageBlock,
    NativeBlock,
    ReasoningBlock,
    SessionContentBlock,
    SessionRun,
    SessionRunAgent,
    SessionTurn,
    StoredRunOptions,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    TurnUsage,
    call_input,
    encode,
    is_column_text,
    key_segment,
    new_id,
    parse_json,
    preview,
    reasoning_text,
    validate_id,
)
from ..portal import AsyncSession, SyncSession
from . import _pydantic_ai_shapes
from ._pydantic_ai_store import ZidaneConversationStore  # uses this module's converters
from ._shared import trace_context, with_trace
from ._usage import Price, cost_of, total

__all__ = [
    "PYDANTIC_AI_METADATA_KEY",
    "PYDANTIC_AI_PROVIDER",
    "ZidaneConversationStore",
    "append_messages",
    "append_messages_sync",
    "message_history",
    "messages_to_turns",
    "run_agent",
    "run_agent_sync",
    "runs_of_turns",
    "turns_to_messages",
]

PYDANTIC_AI_PROVIDER: Final = "pydantic-ai"
PYDANTIC_AI_METADATA_KEY: Final = "pydanticAiMessage"
"""Where turns written by earlier versions keep their whole message."""

_ERROR_OUTCOMES: Final = ("failed", "retried")

# -- pydantic-ai → neutral ------------------------------------------------------


def _tagged(**data: Any) -> dict[str, Any]:
    return {"provider": PYDANTIC_AI_PROVIDER, **data}


def _native(part: Mapping[str, Any]) -> NativeBlock:
    return NativeBlock(PYDANTIC_AI_PROVIDER, dict(part))


def _without(part: Mapping[str, Any], **given: Any) -> dict[str, Any]:
    """``part`` minus the fields equal to ``given`` (the block gives them back)."""
    return {k: v for k, v in part.items() if k not in given or given[k] != v}


def _user_item(item: Any) -> SessionContentBlock | None:
    if isinstance(item, str):
        return TextBlock(item)
    if isinstance(item, ImageUrl):
        return ImageBlock(url=item.url)
    if isinstance(item, DocumentUrl):
        return FileBlock(url=item.url)
    if isinstance(item, BinaryContent):
        data = base64.b64encode(item.data).decode("ascii")
        if item.is_image:
            return ImageBlock(media_type=item.media_type, data=data)
        if item.is_document:
            return FileBlock(media_type=item.media_type, data=data)
    return None  # audio, video, cache points…: kept whole in the part


def _prompt_blocks(part: UserPromptPart, dumped: dict[str, Any]) -> list[SessionContentBlock]:
    if isinstance(part.content, str):
        rest = _without(dumped, content=part.content)
        return [TextBlock(part.content, provider_data=_tagged(part=rest))]
    blocks: list[SessionContentBlock] = []
    entries: list[Any] = []
    for item, item_dump in zip(part.content, dumped["content"], strict=True):
        block = _user_item(item)
        if block is None:
            entries.append({"k": item_dump})
        elif isinstance(item, str):
            entries.append(None)
            blocks.append(block)
        else:
            source = getattr(block, "data", None) or getattr(block, "url", None)
            entries.append({"b": _without(item_dump, data=source, url=source)})
            blocks.append(block)
    rest = {**dumped, "content": entries}
    if not blocks:
        return [_native(dumped)]
    first = blocks[0]
    blocks[0] = msgspec.structs.replace(first, provider_data=_tagged(part=rest, blocks=len(blocks)))
    return blocks


def _tool_output(part: ToolReturnPart) -> str:
    if isinstance(part.content, str):
        return part.content
    try:
        return part.model_response_str()  # pydantic-ai's JSON text of it, as the model sees it
    except (ValueError, TypeError, RecursionError) as exc:
        raise _NoJsonForm(str(exc)) from None


def _request_blocks(
    parts: Sequence[Any], dumps: list[dict[str, Any]]
) -> tuple[list[SessionContentBlock], list[SessionContentBlock]]:
    """The system prompts opening a request, and the rest of its parts, as blocks."""
    system: list[SessionContentBlock] = []
    blocks: list[SessionContentBlock] = []
    for part, dumped in zip(parts, dumps, strict=True):
        kind = dumped.get("part_kind")
        if isinstance(part, SystemPromptPart) and not blocks:
            rest = _without(dumped, content=part.content)
            system.append(TextBlock(part.content, provider_data=_tagged(part=rest)))
        elif isinstance(part, UserPromptPart):
            blocks.extend(_prompt_blocks(part, dumped))
        elif (kind == "tool-return" and isinstance(part, ToolReturnPart)) or (
            isinstance(part, RetryPromptPart) and part.tool_name is not None
        ):
            blocks.append(_tool_result(part, dumped))
        elif kind == "retry-feedback" or isinstance(part, RetryPromptPart):
            text = part.model_response()
            blocks.append(TextBlock(text, provider_data=_tagged(part=dumped)))
        else:
            blocks.append(_native(dumped))
    return system, blocks


def _tool_result(part: ToolReturnPart | RetryPromptPart, dumped: dict[str, Any]) -> ToolResultBlock:
    if isinstance(part, RetryPromptPart):
        output, error = part.model_response(), True
        if isinstance(part.content, str):
            output = part.content
    else:
        output, error = _tool_output(part), part.outcome in _ERROR_OUTCOMES
    call_id = part.tool_call_id
    rest = _without(dumped, content=output, tool_call_id=call_id, tool_name=part.tool_name)
    return ToolResultBlock(
        call_id=call_id,
        output=output,
        is_error=True if error else None,
        name=part.tool_name,
        provider_data=_tagged(part=rest),
    )


def _response_blocks(
    parts: Sequence[Any], dumps: list[dict[str, Any]]
) -> list[SessionContentBlock]:
    blocks: list[SessionContentBlock] = []
    for part, dumped in zip(parts, dumps, strict=True):
        if isinstance(part, TextPart) and dumped.get("part_kind") == "text":
            rest = _without(dumped, content=part.content)
            blocks.append(TextBlock(part.content, provider_data=_tagged(part=rest)))
        elif isinstance(part, ToolCallPart) and dumped.get("part_kind") == "tool-call":
            args = part.args_as_dict()
            rest = _without(
                dumped, args=args, tool_call_id=part.tool_call_id, tool_name=part.tool_name
            )
            call = ToolCallBlock(
                id=part.tool_call_id,
                name=part.tool_name,
                input=args,
                provider_data=_tagged(part=rest),
            )
            blocks.append(call)
        elif isinstance(part, ThinkingPart):
            given = {
                "content": part.content,
                "signature": part.signature,
                "provider_name": part.provider_name,
                "id": part.id,
            }
            block = ReasoningBlock(
                text=part.content,
                provider=part.provider_name,
                signature=part.signature,
                id=part.id,
                provider_data=_tagged(part=_without(dumped, **given)),
            )
            blocks.append(block)
        else:
            blocks.append(_native(dumped))
    return blocks


def _usage(message: ModelResponse, price: Price | None) -> TurnUsage:
    measured = message.usage
    usage = TurnUsage(
        input=measured.input_tokens,
        output=measured.output_tokens,
        cache_read=measured.cache_read_tokens or None,
        cache_creation=measured.cache_write_tokens or None,
        model=message.model_name,
    )
    cost = cost_of(usage, price)
    return usage if cost is None else msgspec.structs.replace(usage, cost=cost)


def _epoch_ms(stamp: datetime.datetime | None) -> int:
    return int(stamp.timestamp() * 1000) if stamp is not None else time.time_ns() // 10**6


class _NoJsonForm(Exception):
    """pydantic could not write a message as JSON (nested too deep, a value it cannot)."""


def _dump(message: ModelMessage) -> dict[str, Any]:
    try:
        dumped: dict[str, Any] = ModelMessagesTypeAdapter.dump_python([message], mode="json")[0]
    except (ValueError, TypeError, RecursionError) as exc:
        raise _NoJsonForm(str(exc)) from None
    return dumped


def _turns_of(message: ModelMessage, price: Price | None, lean: bool) -> list[SessionTurn]:
    dumped = _dump(message)
    part_dumps = dumped.pop("parts")
    if lean:  # defaults left out (checked by the caller)
        part_dumps = [{k: v for k, v in p.items() if v is not None} for p in part_dumps]
        dumped = {k: v for k, v in dumped.items() if v is not None}
        if isinstance(dumped.get("usage"), dict):
            dumped["usage"] = {k: v for k, v in dumped["usage"].items() if v not in (0, {}, None)}
    run_id = dumped.get("run_id") if _run_id(dumped.get("run_id")) else None
    if run_id is not None:
        del dumped["run_id"]
    created_at = _epoch_ms(message.timestamp)
    kept = _tagged(message=dumped)

    def turn(
        role: Literal["system", "user", "assistant"],
        blocks: Sequence[SessionContentBlock],
        data: dict[str, Any],
        usage: TurnUsage | None = None,
    ) -> SessionTurn:
        return SessionTurn(
            id=new_id(),
            role=role,
            content=tuple(blocks),
            created_at=created_at,
            run_id=run_id,
            usage=usage,
            provider_data=data,
        )

    if isinstance(message, ModelResponse):
        content = _response_blocks(message.parts, part_dumps)
        return [turn("assistant", content, kept, _usage(message, price))]
    system, content = _request_blocks(message.parts, part_dumps)
    turns = []
    if system:
        # Joined to the next turn's message on the way back.
        joined = None if content else kept
        turns.append(turn("system", system, joined or _tagged(joins="next")))
    if content or not system:
        turns.append(turn("user", content, kept))
    return turns


def _run_id(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        validate_id(value, what="run id")
    except InvalidNameError:
        return False
    return True


def messages_to_turns(
    messages: Iterable[ModelMessage], *, price: Price | None = None
) -> list[SessionTurn]:
    """The turns that store ``messages``: neutral content, the rest kept beside it once.

    ``price(usage)`` gives a response's cost in USD (default: genai-prices,
    when it knows the model).
    """
    turns: list[SessionTurn] = []
    for index, message in enumerate(messages):
        where = f"$[{index}]"
        try:
            made = _turns_of(message, price, lean=True)
        except _NoJsonForm as exc:
            raise ValidationError(f"the message has no JSON form: {exc}", path=where) from None
        if _pydantic_ai_shapes.proven(message):  # its lean form gives it back (proven)
            turns.extend(made)
            continue
        if turns_to_messages(made) != [message]:  # the lean form must give the message back
            made = _turns_of(message, price, lean=False)
        if turns_to_messages(made) != [message]:
            made = [_copy_turn(message, price)]
            back = turns_to_messages(made)
            if back != [message]:  # pydantic's JSON form alters it: refused, never stored
                _refuse_altered(message, back, where)
        turns.extend(made)
    return turns


def _refuse_altered(message: ModelMessage, back: list[ModelMessage], path: str) -> None:
    """Raise a :class:`ValidationError` at the first value of ``message`` that ``back`` alters.

    Compared as pydantic-ai dumps them (a ``BinaryContent`` read back as the
    ``BinaryImage`` it is, for one, is the same message).
    """
    want = ModelMessagesTypeAdapter.dump_python([message])[0]
    got = ModelMessagesTypeAdapter.dump_python(back)[0] if len(back) == 1 else None
    where = _first_difference(want, got, path)
    if where is not None:
        raise ValidationError(
            "this value has no exact JSON form (pydantic's would alter it)", path=where
        )


def _first_difference(want: Any, got: Any, path: str) -> str | None:
    if isinstance(want, dict) and isinstance(got, dict):
        for key, value in want.items():
            step = path + (key_segment(key) if isinstance(key, str) else f"[{preview(key)}]")
            if key not in got:
                return step
            found = _first_difference(value, got[key], step)
            if found is not None:
                return found
        return None
    if isinstance(want, list | tuple) and isinstance(got, list | tuple) and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            found = _first_difference(a, b, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    return None if want is got or want == got else path


def _copy_turn(message: ModelMessage, price: Price | None) -> SessionTurn:
    """The message as earlier versions stored it (content plus a whole copy): the last resort
    for a message the blocks and what is kept beside them would not give back."""
    dumped = _dump(message)
    (validated,) = ModelMessagesTypeAdapter.validate_python([dumped])
    role, content = _legacy_role_and_content(validated)
    return SessionTurn(
        id=new_id(),
        role="assistant" if role == "assistant" else "user",
        content=content,
        created_at=_epoch_ms(message.timestamp),
        run_id=dumped.get("run_id") if _run_id(dumped.get("run_id")) else None,
        usage=_usage(message, price) if isinstance(message, ModelResponse) else None,
        metadata={PYDANTIC_AI_METADATA_KEY: dumped},
    )


# -- runs -------------------------------------------------------------------------------


def runs_of_turns(
    turns: Sequence[SessionTurn],
    known: Sequence[SessionRun] = (),
    *,
    agent: str | None = None,
) -> list[SessionRun]:
    """The run records ``turns`` make (or extend, when their run is in ``known``)."""
    runs: dict[str, SessionRun] = {}
    for turn in turns:
        if turn.run_id is None:
            continue
        run = runs.get(turn.run_id) or next((r for r in known if r.id == turn.run_id), None)
        prompt = next((b.text for b in turn.content if isinstance(b, TextBlock)), "")
        if run is None:
            run = SessionRun(
                id=turn.run_id,
                prompt=prompt if turn.role == "user" else "",
                started_at=turn.created_at,
                status="running",
                agent=None if agent is None else SessionRunAgent(id=agent, label=agent),
            )
            run = with_trace(run, trace_context())
        elif not run.prompt and turn.role == "user":
            run = msgspec.structs.replace(run, prompt=prompt)
        usages = list(run.turn_usage or ())
        if turn.usage is not None:
            usages.append(msgspec.structs.replace(turn.usage, turn_id=turn.id))
        summed = total(usages) if usages else None
        models = tuple(dict.fromkeys(u.model for u in usages if u.model))
        run = msgspec.structs.replace(
            run,
            status="completed" if turn.role == "assistant" else "running",
            ended_at=turn.created_at if turn.role == "assistant" else None,
            turns=(run.turns or 0) + (turn.role == "assistant"),
            turn_usage=tuple(usages) or None,
            total_usage=summed,
            tokens_in=None if summed is None else summed.input,
            tokens_out=None if summed is None else summed.output,
            cost=None if summed is None else summed.cost,
            options=StoredRunOptions(model=models[-1]) if models else run.options,
            wall_ms=float(turn.created_at - run.started_at) if turn.role == "assistant" else None,
        )
        runs[run.id] = run
    return list(runs.values())


# -- neutral → pydantic-ai ------------------------------------------------------


def _thawed(value: Mapping[str, Any]) -> dict[str, Any]:
    """A fresh copy of JSON data from a session's frozen memory, for the caller to change.

    pydantic keeps free-form values (a tool's args or return) as given: a frozen one
    would reach the caller's messages.
    """
    return cast(dict[str, Any], parse_json(encode(value)))


def _kept_message(turn: SessionTurn) -> ModelMessage | None:
    """A turn written by an earlier version: its whole message, while it still matches."""
    stored = (turn.metadata or {}).get(PYDANTIC_AI_METADATA_KEY)
    if not isinstance(stored, dict):
        return None
    try:
        (message,) = ModelMessagesTypeAdapter.validate_python([_thawed(stored)])
    except ValueError:
        return None
    if _legacy_role_and_content(message) != (turn.role, turn.content):
        return None
    return message


def _legacy_role_and_content(message: ModelMessage) -> tuple[str, tuple[SessionContentBlock, ...]]:
    """The content earlier versions gave a message (to check their copies still match)."""
    blocks: list[SessionContentBlock] = []
    if isinstance(message, ModelResponse):
        for response_part in message.parts:
            part: Any = response_part
            if isinstance(part, TextPart):
                blocks.append(TextBlock(part.content))
            elif isinstance(part, ToolCallPart):
                blocks.append(ToolCallBlock(part.tool_call_id, part.tool_name, part.args_as_dict()))
            elif isinstance(part, ThinkingPart):
                blocks.append(
                    ReasoningBlock(part.content, part.provider_name, part.signature, id=part.id)
                )
        return "assistant", tuple(blocks)
    for part in message.parts:
        if isinstance(part, UserPromptPart):
            items = [part.content] if isinstance(part.content, str) else list(part.content)
            blocks.extend(b for b in map(_user_item, items) if b is not None)
        elif isinstance(part, ToolReturnPart):
            output = part.model_response_str()
            blocks.append(ToolResultBlock(part.tool_call_id, output, name=part.tool_name))
    return "user", tuple(blocks)


def _part_of(block: SessionContentBlock) -> dict[str, Any] | None:
    """The part dump a block kept (``None``: the block has none, e.g. written elsewhere)."""
    if isinstance(block, NativeBlock):
        return dict(block.data) if block.provider == PYDANTIC_AI_PROVIDER else None
    data = block.provider_data
    if data is None or data.get("provider") != PYDANTIC_AI_PROVIDER:
        return None
    part = data.get("part")
    return dict(part) if isinstance(part, dict) else None


def _restored(block: SessionContentBlock, part: dict[str, Any]) -> dict[str, Any]:
    """``part`` with the fields ``block`` holds put back (the block wins: it may be edited)."""
    kind = part.get("part_kind")
    if isinstance(block, TextBlock) and kind in ("text", "user-prompt", "system-prompt"):
        part["content"] = block.text
    elif isinstance(block, ToolCallBlock):
        part.update(tool_call_id=block.id, tool_name=block.name)
        part.setdefault("args", dict(call_input(block)))
    elif isinstance(block, ToolResultBlock):
        part.update(tool_call_id=block.call_id)
        part.setdefault("tool_name", block.name)
        if isinstance(block.output, str):
            part.setdefault("content", block.output)
    elif isinstance(block, ReasoningBlock):
        part["content"] = block.text
        part.setdefault("signature", block.signature)
        part.setdefault("provider_name", block.provider)
        part.setdefault("id", block.id)
    return part


def _prompt_part(blocks: Sequence[SessionContentBlock], part: dict[str, Any]) -> dict[str, Any]:
    """A list-content user prompt put back together from its blocks."""
    queue = list(blocks)
    content: list[Any] = []
    for entry in part.get("content") or ():
        if entry is None:
            block = queue.pop(0)
            content.append(block.text if isinstance(block, TextBlock) else "")
        elif "k" in entry:
            content.append(entry["k"])
        else:
            item = dict(entry["b"])
            block = queue.pop(0)
            for key in ("data", "url"):
                value = getattr(block, key, None)
                if value is not None:
                    item.setdefault(key, value)
            content.append(item)
    part["content"] = content
    return part


def _parts(turn: SessionTurn) -> list[dict[str, Any] | Any] | None:
    """The part dumps of a turn written here, or ``None`` when a block has no kept part."""
    parts: list[dict[str, Any] | Any] = []
    blocks = list(turn.content)
    while blocks:
        block = blocks.pop(0)
        part = _part_of(block)
        if part is None:
            return None
        if isinstance(block, NativeBlock):
            parts.append(part)
            continue
        blocks_kept = (block.provider_data or {}).get("blocks")
        span = blocks_kept if isinstance(blocks_kept, int) else 1
        prompt = part.get("part_kind") == "user-prompt"  # a tool's return may be a list too
        if span > 1 or (prompt and isinstance(part.get("content"), list)):
            group = [block, *blocks[: span - 1]]
            del blocks[: span - 1]
            parts.append(_prompt_part(group, part))
        else:
            parts.append(_restored(block, part))
    return parts


def _message_from(
    kept: Mapping[str, Any], parts: list[dict[str, Any]], run_id: str | None, where: str
) -> ModelMessage:
    dumped = _thawed({**kept, "parts": parts})
    dumped.pop("provider", None)
    if run_id is not None:
        dumped.setdefault("run_id", run_id)
    legacy = {i: p for i, p in enumerate(parts) if p.get("part_kind") == "retry-prompt"}
    if legacy:  # pydantic-ai reads these as newer parts: build the deprecated part itself
        dumped["parts"] = [p for p in parts if p.get("part_kind") != "retry-prompt"]
    try:
        (message,) = ModelMessagesTypeAdapter.validate_python([dumped])
    except pydantic.ValidationError as exc:  # what the turn keeps of the message is damaged
        first = exc.errors()[0]
        step = ".".join(str(p) for p in first["loc"][1:])[:200]
        raise ValidationError(
            f"the pydantic-ai message the turn keeps does not validate ({exc.error_count()}"
            f" errors; first at {step}: {first['msg']})",
            path=where,
        ) from None
    if legacy and isinstance(message, ModelRequest):
        rebuilt: list[Any] = list(message.parts)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the part is deprecated, and wanted as is
            for index, part in sorted(legacy.items()):
                stamp = part.get("timestamp")
                fields: dict[str, Any] = {
                    k: part[k] for k in ("content", "tool_name", "tool_call_id") if k in part
                }
                if isinstance(stamp, str):
                    fields["timestamp"] = datetime.datetime.fromisoformat(stamp)
                rebuilt.insert(index, RetryPromptPart(**fields))
        message = ModelRequest(**{**_fields(message), "parts": rebuilt})
    return message


def _fields(message: ModelRequest) -> dict[str, Any]:
    import dataclasses

    return {
        f.name: getattr(message, f.name)
        for f in dataclasses.fields(message)
        if f.init and f.name != "parts"
    }


def _binary(media_type: str | None, data: str) -> BinaryContent:
    return BinaryContent(data=base64.b64decode(data, validate=True), media_type=media_type or "")


def _check_media_data(turn: SessionTurn, where: str) -> None:
    """Refuse an image or file whose ``data`` is not base64 (pydantic-ai holds its bytes).

    Strict: a character outside the base64 alphabet is never skipped, a
    missing ``=`` never guessed (the bytes would not be the stored ones).
    """
    for index, block in enumerate(turn.content):
        if isinstance(block, ImageBlock | FileBlock) and block.data is not None:
            try:
                base64.b64decode(block.data, validate=True)
            except ValueError:  # binascii.Error; non-ASCII text
                kind = "image" if isinstance(block, ImageBlock) else "file"
                raise ValidationError(
                    f"the {kind}'s data is not base64 text ({len(block.data)} characters)",
                    path=f"{where}.content[{index}].data",
                ) from None


def _user_part(block: SessionContentBlock) -> Any:
    if isinstance(block, TextBlock):
        return block.text
    if isinstance(block, ImageBlock):
        if block.data is not None:
            return _binary(block.media_type, block.data)
        if block.url is not None:
            return ImageUrl(url=block.url)
    if isinstance(block, FileBlock):
        if block.text is not None:
            return block.text
        if block.data is not None:
            return _binary(block.media_type, block.data)
        if block.url is not None:
            return DocumentUrl(url=block.url)
    return None  # unresolved refs and reasoning in a user turn have no place


def _rebuilt(turn: SessionTurn) -> ModelMessage | None:
    """A message built from a turn's neutral content alone (turns other code wrote)."""
    if turn.role == "assistant":
        parts: list[Any] = []
        for block in turn.content:
            if isinstance(block, TextBlock):
                parts.append(TextPart(block.text))
            elif isinstance(block, ToolCallBlock):
                parts.append(
                    ToolCallPart(
                        tool_name=block.name, args=_thawed(call_input(block)), tool_call_id=block.id
                    )
                )
            elif isinstance(block, ReasoningBlock):
                parts.append(
                    ThinkingPart(
                        reasoning_text(block),
                        id=block.id,
                        signature=block.signature,
                        provider_name=block.provider,
                    )
                )
        return ModelResponse(parts=parts) if parts else None
    if turn.role == "system":
        texts = [b.text for b in turn.content if isinstance(b, TextBlock)]
        return ModelRequest(parts=[SystemPromptPart(t) for t in texts]) if texts else None
    if turn.role != "user":
        return None
    request: list[Any] = []
    prompt: list[Any] = []

    def flush() -> None:
        if prompt:
            only_text = len(prompt) == 1 and isinstance(prompt[0], str)
            request.append(UserPromptPart(prompt[0] if only_text else list(prompt)))
            prompt.clear()

    for block in turn.content:
        if isinstance(block, ToolResultBlock):
            flush()
            output = block.output if isinstance(block.output, str) else _parts_text(block.output)
            request.append(
                ToolReturnPart(
                    tool_name=block.name or "",
                    content=output,
                    tool_call_id=block.call_id,
                    outcome="retried" if block.is_error else "success",
                )
            )
        else:
            part = _user_part(block)
            if part is not None:
                prompt.append(part)
    flush()
    return ModelRequest(parts=request) if request else None


def _parts_text(parts: Sequence[Any]) -> str:
    return "\n".join(p.text for p in parts if isinstance(p, TextBlock))


def turns_to_messages(turns: Iterable[SessionTurn]) -> list[ModelMessage]:
    """pydantic-ai messages for ``turns``: as pydantic-ai wrote them where the turns
    keep what their blocks do not hold, else built from the neutral content.

    An image or file whose ``data`` is not base64 text is refused with a
    :class:`~zidane_actors.errors.ValidationError` at ``$[i].content[j].data``.
    """
    messages: list[ModelMessage] = []
    joined: list[dict[str, Any]] = []  # system prompts waiting for their request
    joined_at = "$"  # the turn the first of them came from
    for position, turn in enumerate(turns):
        where = f"$[{position}]"
        _check_media_data(turn, where)
        data = turn.provider_data or {}
        kept = data.get("message") if data.get("provider") == PYDANTIC_AI_PROVIDER else None
        parts = _parts(turn) if kept is not None or data.get("joins") else None
        if parts is not None and data.get("joins") == "next":
            joined_at = joined_at if joined else where
            joined.extend(parts)
            continue
        if parts is not None and isinstance(kept, dict):
            at = joined_at if joined else where
            messages.append(_message_from(kept, [*joined, *parts], turn.run_id, at))
            joined.clear()
            continue
        if joined:  # the request they opened is gone: keep them as their own request
            messages.append(_message_from({"kind": "request"}, joined, turn.run_id, joined_at))
            joined = []
        message = _kept_message(turn) or _rebuilt(turn)
        if message is not None:
            messages.append(message)
    if joined:
        messages.append(_message_from({"kind": "request"}, joined, None, joined_at))
    return messages


# -- sessions -------------------------------------------------------------------


def message_history(session: Session | SyncSession | AsyncSession) -> list[ModelMessage]:
    """The session's history as pydantic-ai ``message_history`` (a snapshot read)."""
    return turns_to_messages(session.turns)


Named = str | AbstractAgent[Any, Any] | None
"""An agent as the door takes it: its name, the pydantic-ai agent, or none."""


def _name(agent: Named) -> str | None:
    return agent if isinstance(agent, str) or agent is None else agent.name


def _agent_to_set(session: SyncSession | AsyncSession, agent: str | None) -> str | None:
    """``agent`` when the session has no ``agentId`` and a store can keep it as one."""
    if agent and session.agent_id is None and is_column_text(agent):
        return agent
    return None


def _write(
    session: SyncSession | AsyncSession,
    messages: Iterable[ModelMessage],
    agent: str | None,
    price: Price | None,
    error: BaseException | None = None,
) -> tuple[list[SessionTurn], list[SessionRun]]:
    turns = messages_to_turns(messages, price=price)
    runs = runs_of_turns(turns, session.runs, agent=agent)
    if error is not None and runs:  # the run that raised: its last messages' run
        now = time.time_ns() // 1_000_000
        failed = runs[-1]
        runs[-1] = msgspec.structs.replace(
            failed,
            status="error",
            error=f"{type(error).__name__}: {error}",
            ended_at=now,
            wall_ms=float(max(now - failed.started_at, 0)),
        )
    return turns, runs


async def append_messages(
    session: AsyncSession,
    messages: Iterable[ModelMessage],
    *,
    agent: Named = None,
    price: Price | None = None,
    error: BaseException | None = None,
) -> None:
    """Store a run's ``new_messages()`` and its run record(s) in an asyncio session handle.

    One write for the turns and the first run (more only when the messages
    span several runs). ``agent`` (a name or the pydantic-ai agent) names
    the agent in the run record, and the session when it has no ``agentId``.
    ``error``: the exception the run raised (the messages are then those
    ``capture_run_messages`` gave); its run ends ``error`` with its text.
    """
    name = _name(agent)
    turns, runs = _write(session, messages, name, price, error)
    await session.append_turns(turns, AppendTurnsOptions(run=runs[0]) if runs else None)
    for run in runs[1:]:
        await session.update_run(run)
    named = _agent_to_set(session, name)
    if named is not None:
        await session.set_agent_id(named)
        await session.save_meta_keys(())


def append_messages_sync(
    session: SyncSession,
    messages: Iterable[ModelMessage],
    *,
    agent: Named = None,
    price: Price | None = None,
    error: BaseException | None = None,
) -> None:
    """:func:`append_messages` through a blocking session handle."""
    name = _name(agent)
    turns, runs = _write(session, messages, name, price, error)
    session.append_turns(turns, AppendTurnsOptions(run=runs[0]) if runs else None)
    for run in runs[1:]:
        session.update_run(run)
    named = _agent_to_set(session, name)
    if named is not None:
        session.set_agent_id(named)
        session.save_meta_keys(())


async def run_agent(
    session: AsyncSession,
    agent: AbstractAgent[Any, Any],
    prompt: Any = None,
    *,
    price: Price | None = None,
    **kwargs: Any,
) -> AgentRunResult[Any]:
    """``agent.run(prompt, message_history=<the session's>, **kwargs)``, stored as it ended.

    Its new messages and run record in one write; a run that raises stores
    the messages it exchanged with its run ``error`` (the exception's type and
    text), then the exception goes on. ``kwargs`` go to ``agent.run``
    (``deps``, ``event_stream_handler`` for a streamed run, …).
    """
    history = message_history(session)
    with capture_run_messages() as captured:
        try:
            result = await agent.run(prompt, message_history=history, **kwargs)
        except Exception as exc:
            new = captured[len(history) :]
            if new:
                await append_messages(session, new, agent=agent, price=price, error=exc)
            raise
    await append_messages(session, result.new_messages(), agent=agent, price=price)
    return result


def run_agent_sync(
    session: SyncSession,
    agent: AbstractAgent[Any, Any],
    prompt: Any = None,
    *,
    price: Price | None = None,
    **kwargs: Any,
) -> AgentRunResult[Any]:
    """:func:`run_agent` through ``agent.run_sync`` and a blocking session handle."""
    history = message_history(session)
    with capture_run_messages() as captured:
        try:
            result = agent.run_sync(prompt, message_history=history, **kwargs)
        except Exception as exc:
            new = captured[len(history) :]
            if new:
                append_messages_sync(session, new, agent=agent, price=price, error=exc)
            raise
    append_messages_sync(session, result.new_messages(), agent=agent, price=price)
    return result
