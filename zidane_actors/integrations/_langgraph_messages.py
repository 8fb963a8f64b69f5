"""LangChain messages ⇄ zidane turns, exactly (the LangGraph door's converter).

One message is one turn:

* ``HumanMessage`` → a ``user`` turn, ``SystemMessage`` → a ``system`` turn,
  ``AIMessage`` → an ``assistant`` turn (text, ``ToolCallBlock`` per tool
  call, ``usage_metadata`` as the turn's ``usage``), ``ToolMessage`` → a
  ``user`` turn holding one ``ToolResultBlock`` (``isError`` for
  ``status="error"``);
* string content is one ``TextBlock``; list content keeps its order: plain
  strings and ``{"type": "text", "text": …}`` items as ``TextBlock``\\ s, any
  other item as a ``NativeBlock(provider="langchain")``;
* what the blocks do not hold (the message id when it is not the turn id,
  ``name``, ``additional_kwargs``, ``response_metadata``, the rest of the
  usage, an ``artifact``…) is kept once, beside them, in the turn's
  ``providerData`` (``{"provider": "langchain", "message": {...}}``).

Every converted turn is checked: the message it gives back must serialize to
the very bytes the original does with LangGraph's serializer. A message that
would not (another message class, a value JSON cannot hold exactly, key
orders the rebuild cannot give back) keeps the serializer's bytes whole in
``providerData["serde"]``, with readable text blocks for the browser; so does
a message whose tool blocks zidane's load-time pairing heal would drop
(``readable_only=True``).
"""

from __future__ import annotations

import base64
import copy
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..model import (
    NativeBlock,
    SessionContentBlock,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    TurnUsage,
    encode,
    parse_json,
)

__all__ = [
    "PROVIDER",
    "copy_message",
    "is_message_turn",
    "message_to_turn",
    "plain_json",
    "turn_to_message",
]

PROVIDER: Final = "langchain"
"""The ``provider`` tag of a message turn's ``providerData`` and of its native blocks."""

_KINDS: Final[dict[type[BaseMessage], str]] = {
    HumanMessage: "human",
    AIMessage: "ai",
    ToolMessage: "tool",
    SystemMessage: "system",
}
_ROLE: Final = {"human": "user", "ai": "assistant", "tool": "user", "system": "system"}
_USAGE_KEYS: Final = ("input_tokens", "output_tokens")
_MAX_DEPTH: Final = 100
_isfinite: Final = math.isfinite


def plain_json(value: object, depth: int = 0) -> bool:
    """Whether ``value`` is JSON that reads back as itself (types and all)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return _isfinite(value)  # type: ignore[arg-type]
    if depth > _MAX_DEPTH:
        return False
    items: Iterable[Any]
    if kind is dict:
        for key in value:  # type: ignore[attr-defined]
            if type(key) is not str:
                return False
        items = value.values()  # type: ignore[attr-defined]
    elif kind is list:
        items = value  # type: ignore[assignment]
    else:
        return False
    for item in items:  # the atoms most JSON holds settled here, without a call
        of = type(item)
        if (
            of is str
            or of is int
            or of is bool
            or item is None
            or (of is float and _isfinite(item))
        ):
            continue
        if not plain_json(item, depth + 1):
            return False
    return True


def thaw(value: Any) -> Any:
    """A plain, changeable copy of a JSON value read from a session's frozen memory."""
    if type(value) in (str, int, float, bool) or value is None:
        return value
    return parse_json(encode(value))


def is_message_turn(turn: SessionTurn) -> bool:
    """Whether ``turn`` holds a LangChain message written by this converter."""
    data = turn.provider_data
    return data is not None and data.get("provider") == PROVIDER


def _serde_blob(dumped: tuple[str, bytes]) -> list[str]:
    kind, raw = dumped
    return [kind, base64.b64encode(raw).decode("ascii")]


def _readable(message: BaseMessage) -> tuple[SessionContentBlock, ...]:
    """Text blocks a person can read, for a message kept whole as serializer bytes."""
    content = message.content
    if isinstance(content, str):
        text = content
    else:
        parts = []
        for item in content:
            if isinstance(item, str):
                parts.append(item)
            elif isinstance(item, dict) and isinstance(item.get("text"), str):
                parts.append(item["text"])
        text = "\n".join(parts)
    calls = getattr(message, "tool_calls", None) or ()
    lines = [text] if text else []
    for call in calls:
        args = call.get("args")
        shown = encode(args).decode() if plain_json(args) else repr(args)
        lines.append(f"{call.get('name')}({shown})")
    if isinstance(message, ToolMessage):
        lines.insert(0, f"{message.name or message.tool_call_id} →")
    body = "\n".join(lines)
    return (TextBlock(text=body),) if body else ()


def _whole(
    message: BaseMessage,
    *,
    turn_id: str,
    created_at: int,
    run_id: str | None,
    dumped: tuple[str, bytes],
) -> SessionTurn:
    kind = _KINDS.get(type(message))
    role = _ROLE[kind] if kind is not None else ("assistant" if message.type == "ai" else "user")
    if message.type == "system":
        role = "system"
    return SessionTurn(
        id=turn_id,
        role=role,  # type: ignore[arg-type]
        content=_readable(message),
        created_at=created_at,
        run_id=run_id,
        provider_data={"provider": PROVIDER, "serde": _serde_blob(dumped)},
    )


def _content_blocks(content: Any, rest: dict[str, Any]) -> list[SessionContentBlock] | None:
    """Blocks of a message's content; ``None`` when it has no exact block form."""
    if isinstance(content, str):
        if content:
            return [TextBlock(text=content)]
        return []
    if type(content) is not list:
        return None
    blocks: list[SessionContentBlock] = []
    form: list[str] = []
    for item in content:
        if type(item) is str:
            blocks.append(TextBlock(text=item))
            form.append("s")
        elif type(item) is dict and item.keys() == {"type", "text"} and item["type"] == "text":
            if list(item) != ["type", "text"] or type(item["text"]) is not str:
                return None
            blocks.append(TextBlock(text=item["text"]))
            form.append("t")
        elif type(item) is dict and plain_json(item):
            blocks.append(NativeBlock(provider=PROVIDER, data=item))
            form.append("n")
        else:
            return None
    rest["content"] = "".join(form)
    return blocks


def _tool_call_blocks(calls: Any) -> list[SessionContentBlock] | None:
    blocks: list[SessionContentBlock] = []
    for call in calls:
        if (
            type(call) is not dict
            or list(call) != ["name", "args", "id", "type"]
            or call["type"] != "tool_call"
            or type(call["name"]) is not str
            or not call["name"]
            or type(call["id"]) is not str
            or not call["id"]
            or type(call["args"]) is not dict
            or not plain_json(call["args"])
        ):
            return None
        blocks.append(ToolCallBlock(id=call["id"], name=call["name"], input=call["args"]))
    return blocks


def _usage(usage: Any, rest: dict[str, Any]) -> TurnUsage | None:
    if usage is None:
        return None
    if type(usage) is not dict or list(usage)[:2] != list(_USAGE_KEYS) or not plain_json(usage):
        rest["usage"] = usage  # checked by the caller's plain_json
        return None
    tokens_in, tokens_out = usage["input_tokens"], usage["output_tokens"]
    if type(tokens_in) is not int or type(tokens_out) is not int or tokens_in < 0 or tokens_out < 0:
        rest["usage"] = usage
        return None
    details = usage.get("input_token_details")
    cache_read = cache_creation = None
    if type(details) is dict:
        read, made = details.get("cache_read"), details.get("cache_creation")
        cache_read = read if type(read) is int and read >= 0 else None
        cache_creation = made if type(made) is int and made >= 0 else None
    rest["usage"] = {k: v for k, v in usage.items() if k not in _USAGE_KEYS}
    return TurnUsage(
        input=tokens_in, output=tokens_out, cache_read=cache_read, cache_creation=cache_creation
    )


def _neutral(
    message: BaseMessage, *, turn_id: str, created_at: int, run_id: str | None
) -> SessionTurn | None:
    """The turn of a message of one of the four standard classes; ``None`` when it has none."""
    kind = _KINDS.get(type(message))
    if kind is None:
        return None
    rest: dict[str, Any] = {"type": kind}
    if message.id != turn_id:
        rest["id"] = message.id
    if message.name is not None:
        rest["name"] = message.name
    if message.additional_kwargs:
        rest["additional_kwargs"] = message.additional_kwargs
    if message.response_metadata:
        rest["response_metadata"] = message.response_metadata
    usage: TurnUsage | None = None
    blocks: list[SessionContentBlock]
    if isinstance(message, ToolMessage):
        if not message.tool_call_id or type(message.tool_call_id) is not str:
            return None
        content = message.content
        if isinstance(content, str):
            output = content
        else:
            if not plain_json(content):
                return None
            rest["content"] = content
            output = "\n".join(i if isinstance(i, str) else str(i.get("text", "")) for i in content)
        if message.artifact is not None:
            rest["artifact"] = message.artifact
        blocks = [
            ToolResultBlock(
                call_id=message.tool_call_id,
                output=output,
                is_error=True if message.status == "error" else None,
                name=message.name,
            )
        ]
        rest.pop("name", None)  # the block holds it
        if message.status not in ("success", "error"):
            return None
    else:
        found = _content_blocks(message.content, rest)
        if found is None:
            return None
        blocks = found
        if isinstance(message, AIMessage):
            calls = _tool_call_blocks(message.tool_calls)
            if calls is None:
                rest["tool_calls"] = message.tool_calls
            else:
                blocks.extend(calls)
            if message.invalid_tool_calls:
                rest["invalid_tool_calls"] = message.invalid_tool_calls
            usage = _usage(message.usage_metadata, rest)
    if not plain_json(rest):
        return None
    return SessionTurn(
        id=turn_id,
        role=_ROLE[kind],  # type: ignore[arg-type]
        content=tuple(blocks),
        created_at=created_at,
        run_id=run_id,
        usage=usage,
        provider_data={"provider": PROVIDER, "message": rest},
    )


def message_to_turn(
    message: BaseMessage,
    serde: SerializerProtocol,
    *,
    turn_id: str,
    created_at: int,
    run_id: str | None = None,
    readable_only: bool = False,
    dumped: tuple[str, bytes] | None = None,
) -> tuple[SessionTurn, BaseMessage | None]:
    """The turn of ``message``, and the message it gives back (same serializer bytes;
    ``None`` when the turn keeps those bytes whole).

    ``readable_only`` keeps the message whole (serializer bytes) behind text
    blocks only: for a message whose tool blocks would not pair. ``dumped``:
    the serializer's ``dumps_typed(message)``, when the caller has it.
    """
    if not readable_only:
        turn = _neutral(message, turn_id=turn_id, created_at=created_at, run_id=run_id)
        if turn is not None:
            try:
                back = turn_to_message(turn, serde)
                if strict_state(message) is not None:
                    # The serializer writes a message's class and state: the same message
                    # value (equal states, their JSON too: types, order) is written alike.
                    same = messages_equal(back, message)
                else:
                    if dumped is None:
                        dumped = serde.dumps_typed(message)
                    same = serde.dumps_typed(back) == dumped
            except Exception:  # a value the rebuild cannot take: kept whole below
                same = False
            if same:
                return turn, back
    if dumped is None:
        dumped = serde.dumps_typed(message)
    whole = _whole(message, turn_id=turn_id, created_at=created_at, run_id=run_id, dumped=dumped)
    return whole, None


def has_tool_blocks(turn: SessionTurn) -> bool:
    """Whether the turn holds blocks zidane's tool pairing rules apply to."""
    return any(isinstance(b, ToolCallBlock | ToolResultBlock) for b in turn.content)


def _content_of(blocks: Sequence[SessionContentBlock], form: Any) -> Any:
    """The message content the blocks hold, as ``form`` (``None`` for a string) says."""
    texts = [b for b in blocks if isinstance(b, TextBlock | NativeBlock)]
    if form is None:
        if not texts:
            return ""
        first = texts[0]
        return first.text if isinstance(first, TextBlock) else ""
    content: list[Any] = []
    for code, block in zip(form, texts, strict=False):
        if code == "s" and isinstance(block, TextBlock):
            content.append(block.text)
        elif code == "t" and isinstance(block, TextBlock):
            content.append({"type": "text", "text": block.text})
        elif isinstance(block, NativeBlock):
            content.append(thaw(block.data))
    return content


def turn_to_message(turn: SessionTurn, serde: SerializerProtocol) -> BaseMessage:
    """The LangChain message a turn written by :func:`message_to_turn` holds (a new object)."""
    data = turn.provider_data or {}
    whole = data.get("serde")
    if whole is not None:
        kind, raw = whole[0], base64.b64decode(whole[1])
        message = serde.loads_typed((kind, raw))
        if not isinstance(message, BaseMessage):
            raise TypeError(f"turn {turn.id!r} holds a {type(message).__name__}, not a message")
        return message
    rest: dict[str, Any] = thaw(data.get("message") or {})
    kind = rest.pop("type", None)
    fields: dict[str, Any] = {"id": rest.pop("id", turn.id)}
    for key in ("name", "additional_kwargs", "response_metadata"):
        if key in rest:
            fields[key] = rest.pop(key)
    blocks = turn.content
    if kind == "tool":
        result = next(b for b in blocks if isinstance(b, ToolResultBlock))
        content = rest.pop("content", result.output)
        return ToolMessage(
            content=content,
            tool_call_id=result.call_id,
            name=result.name,
            status="error" if result.is_error else "success",
            artifact=rest.pop("artifact", None),
            **fields,
        )
    content = _content_of(blocks, rest.pop("content", None))
    if kind == "human":
        return HumanMessage(content=content, **fields)
    if kind == "system":
        return SystemMessage(content=content, **fields)
    if kind != "ai":
        raise ValueError(f"turn {turn.id!r} holds no known LangChain message kind ({kind!r})")
    if "tool_calls" in rest:
        tool_calls = rest.pop("tool_calls")
    else:
        tool_calls = [
            {
                "name": b.name,
                "args": thaw(b.input) if b.input else {},
                "id": b.id,
                "type": "tool_call",
            }
            for b in blocks
            if isinstance(b, ToolCallBlock)
        ]
    usage_rest = rest.pop("usage", None)
    usage_metadata = usage_rest
    if turn.usage is not None and isinstance(usage_rest, dict):
        usage_metadata = {
            "input_tokens": turn.usage.input,
            "output_tokens": turn.usage.output,
            **usage_rest,
        }
    return AIMessage(
        content=content,
        tool_calls=tool_calls,
        invalid_tool_calls=rest.pop("invalid_tool_calls", []),
        usage_metadata=usage_metadata,
        **fields,
    )


def readable_blocks(message: BaseMessage) -> tuple[SessionContentBlock, ...]:
    """Text blocks of a message (for callers that show one without storing it)."""
    return _readable(message)


def copy_message(message: BaseMessage) -> BaseMessage:
    """A deep copy of ``message``, as ``model_copy(deep=True)`` makes, in a quarter of its time.

    Reads hand out copies of the messages a thread's index keeps (the caller may
    change them); JSON containers are copied directly, anything else by ``deepcopy``.
    """
    cls = type(message)
    out = cls.__new__(cls)
    setattr_ = object.__setattr__
    fields = message.__dict__.copy()
    for key, value in fields.items():
        if type(value) not in _ATOMS:
            fields[key] = _copied(value)  # a new value for a key: the dict stays as it is
    setattr_(out, "__dict__", fields)
    setattr_(out, "__pydantic_fields_set__", set(message.__pydantic_fields_set__))
    setattr_(out, "__pydantic_extra__", _copied(message.__pydantic_extra__))
    private = message.__pydantic_private__
    setattr_(out, "__pydantic_private__", None if private is None else copy.deepcopy(private))
    return out


_ATOMS: Final = frozenset((str, int, float, bool, type(None)))


def _copied(value: Any) -> Any:
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind is dict:
        return {k: _copied(v) for k, v in value.items()} if value else {}
    if kind is list:
        return [_copied(v) for v in value] if value else []
    return copy.deepcopy(value)


_STATE: Final = operator.attrgetter("__dict__", "__pydantic_extra__", "__pydantic_private__")
"""A message's whole state as pydantic's ``==`` reads it: fields, extras, private attributes."""


def message_state(message: BaseMessage) -> tuple[type[BaseMessage], tuple[Any, ...]]:
    """The class and a snapshot of the whole state of ``message`` (what :func:`same_states`
    compares): its containers copied, its strings and numbers shared. A change made in
    place later does not reach the snapshot, and a comparison with an unchanged message
    finds each string the very same object, without reading its text."""
    return type(message), tuple(map(_copied, _STATE(message)))


def same_states(messages: Sequence[BaseMessage], states: Sequence[Any]) -> bool:
    """Whether each message's class and state equal (``==``) its counterpart in ``states``
    (:func:`message_state`), compared in one pass."""
    return list(zip(map(type, messages), map(_STATE, messages), strict=True)) == states


_JSON: Final = msgspec.json.Encoder()


def strict_state(message: BaseMessage) -> bytes | None:
    """The JSON of a message's whole state (:func:`message_state`), which tells apart what
    ``==`` takes as equal: ``1``, ``1.0`` and ``True``, ``0.0`` and ``-0.0``, the same keys
    in another order. ``None`` for a state JSON cannot hold."""
    try:
        return _JSON.encode(_STATE(message))
    except (TypeError, ValueError, OverflowError):
        return None


def messages_equal(a: BaseMessage, b: BaseMessage) -> bool:
    """Whether two messages are the same message value: same class, equal fields
    (pydantic's ``==``; equal state dicts settle it at once), and the same JSON
    (:func:`strict_state`), so that one read back for the other is exactly it."""
    if type(a) is not type(b) or not (_STATE(a) == _STATE(b) or a == b):
        return False
    return strict_state(a) == strict_state(b)


def first_text(content: str | Sequence[Any] | Mapping[str, Any]) -> str:
    """The first text of a message content, for a run's prompt."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        for item in content:
            if isinstance(item, str):
                return item
            if isinstance(item, Mapping) and isinstance(item.get("text"), str):
                return str(item["text"])
    return ""
