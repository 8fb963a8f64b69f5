"""OpenAI Responses input items ↔ zidane turns, item-exact, each item stored once.

Items become turns through the wire layer's Responses converters: each run
of consecutive items of one role is one turn (so an assistant turn holds a
response's tool calls and the next user turn their outputs, as the pairing
rules want). The converters carry every value; what they do not decide is
the order of an item's keys. On the way back the converters' items are
put in the order openai-agents writes them (``SDK_KEY_ORDER``); an item
sent in another order keeps a compact description of its own order under
``metadata["openaiOrder"]`` (only the keys that differ). An item whose
values the converters would not give back (a reasoning item with no
follower in its turn, a tool id over 40 characters) keeps the turn's items
whole under ``metadata["openaiItems"]``, as turns written by
earlier versions do; that copy is used only while it still converts to
exactly the turn's content, so a turn changed by anything else (a heal, an
edit) is read from its content.

A tool result the Runner reported as failed carries ``isError`` in its turn
(the Responses items have no such mark, so it changes no item); regrouping
a turn's items keeps its marks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import msgspec

from ..errors import WireFormatError
from ..model import (
    SessionContentBlock,
    SessionMessage,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from ..wire import OPENAI_TOOL_ID_MAX_LENGTH, from_openai_responses, to_openai_responses
from ..wire._common import arguments_from_json
from ..wire._json import arguments_to_json, check_json_types
from ..wire._provider_data import RESPONSES

__all__ = [
    "OPENAI_ITEMS_METADATA_KEY",
    "OPENAI_ORDER_METADATA_KEY",
    "PROVEN_SHAPES",
    "SDK_KEY_ORDER",
    "TEXT_TOO",
    "ItemGroup",
    "error_marks",
    "group_items",
    "items_of_turn",
    "marked",
    "proven",
    "turn_metadata",
    "turn_without_last_item",
]

OPENAI_ITEMS_METADATA_KEY: Final = "openaiItems"
OPENAI_ORDER_METADATA_KEY: Final = "openaiOrder"

Role = Literal["system", "user", "assistant"]
ItemGroup = tuple[Role, tuple[SessionContentBlock, ...], list[dict[str, Any]]]
"""A run of items of one role: the role, their neutral content, the items."""

_MESSAGE_IN: Final = ("content", "role", "phase", "type", "status", "id")
SDK_KEY_ORDER: Final[Mapping[str, tuple[str, ...]]] = {
    # Field order of the openai types openai-agents dumps (``model_dump``),
    # and of the dicts the Runner builds itself (input messages, tool outputs).
    "message:assistant": ("id", "content", "role", "status", "type", "phase"),
    "message:user": _MESSAGE_IN,
    "message:system": _MESSAGE_IN,
    "message:developer": _MESSAGE_IN,
    "output_text": ("annotations", "text", "type", "logprobs"),
    "refusal": ("refusal", "type"),
    "input_text": ("text", "type"),
    "input_image": ("detail", "type", "file_id", "image_url"),
    "input_file": ("type", "file_data", "file_id", "file_url", "filename"),
    "function_call": (
        "arguments",
        "call_id",
        "name",
        "type",
        "id",
        "async_",
        "caller",
        "namespace",
        "status",
    ),
    "function_call_output": ("call_id", "output", "type", "id", "status"),
    "reasoning": ("id", "summary", "type", "content", "encrypted_content", "status"),
    "summary_text": ("text", "type"),
    "reasoning_text": ("text", "type"),
}
_PART_LISTS: Final = ("content", "summary", "output")

_encode = msgspec.json.Encoder().encode
_encode_sorted = msgspec.json.Encoder(order="sorted").encode


def _json_text(value: Any, *, sort: bool = False) -> bytes | str:
    """The JSON text of ``value`` to compare, as sent or with its keys sorted.

    msgspec refuses a lone surrogate (JSON keeps it as an escape, and so do
    the stores): such a value is compared as Python's JSON text instead.
    """
    try:
        return _encode_sorted(value) if sort else _encode(value)
    except UnicodeEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=sort)


def _kind(value: Mapping[str, Any]) -> str | None:
    kind = value.get("type")
    role = value.get("role")
    if (kind is None or kind == "message") and isinstance(role, str):
        return f"message:{role}"
    return kind if isinstance(kind, str) else None


def _sdk_ordered(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` (an item or a part, fresh from the converters) in the SDK's key order."""
    for key in _PART_LISTS:
        parts = value.get(key)
        if type(parts) is list:
            value[key] = [_sdk_ordered(p) if type(p) is dict else p for p in parts]
    order = SDK_KEY_ORDER.get(_kind(value) or "")
    if order is None:
        return value
    ordered = {key: value[key] for key in order if key in value}
    if len(ordered) != len(value):
        ordered.update((key, v) for key, v in value.items() if key not in ordered)
    return ordered


# -- the order of keys that differ from the SDK's -----------------------------------


def _order_spec(want: Any, have: Any) -> Any:
    """How ``have`` (``want`` in another key order) is put in ``want``'s order; ``None``: as is."""
    spec: dict[str, Any] = {}
    if type(want) is dict:
        if list(want) != list(have):
            spec["k"] = list(want)
        children = {k: s for k in want if (s := _order_spec(want[k], have[k])) is not None}
    elif type(want) is list:
        pairs = enumerate(zip(want, have, strict=True))
        children = {str(i): s for i, (w, h) in pairs if (s := _order_spec(w, h)) is not None}
    else:
        return None
    if children:
        spec["c"] = children
    return spec or None


def _apply_order(value: Any, spec: Any) -> Any:
    if not isinstance(spec, dict):
        return value
    children = spec.get("c") or {}
    if type(value) is dict:
        keys = spec.get("k")
        if isinstance(keys, list) and sorted(keys) == sorted(value):
            value = {key: value[key] for key in keys}
        for key, child in children.items():
            if key in value:
                value[key] = _apply_order(value[key], child)
    elif type(value) is list:
        for key, child in children.items():
            if key.isdigit() and int(key) < len(value):
                value[int(key)] = _apply_order(value[int(key)], child)
    return value


# -- item shapes proven to come back exactly ------------------------------------------

Rule = Any
"""A value rule: a type (the value's exact type), a tuple (a value of one of those
types; ``()``: an empty list), ``True`` (a non-empty string), an ``int`` (a string
of 1 to that many characters), or a mapping of part shapes (a list of parts matching
them, keyed as :data:`PROVEN_SHAPES` is; holding :data:`TEXT_TOO`, a string too)."""
Shapes = Mapping[tuple[str, tuple[str, ...]], Mapping[str, Rule]]
"""Shapes by (kind, keys in order): each key's rule."""

_STR: Final = str
_ID: Final = True
_CALL_ID: Final = OPENAI_TOOL_ID_MAX_LENGTH  # longer tool ids are remapped on the way back
_EMPTY: Final = ()
TEXT_TOO: Final = ("", ())
_INPUT_PARTS: Final[Shapes] = {
    ("input_text", ("text", "type")): {"text": _STR, "type": _STR},
}
_OUTPUT_PARTS: Final[Shapes] = {
    ("output_text", ("annotations", "text", "type")): {
        "annotations": _EMPTY,
        "text": _STR,
        "type": _STR,
    },
    ("output_text", ("annotations", "text", "type", "logprobs")): {
        "annotations": _EMPTY,
        "text": _STR,
        "type": _STR,
        "logprobs": _EMPTY,
    },
}
_SUMMARY: Final[Shapes] = {
    ("summary_text", ("text", "type")): {"text": _STR, "type": _STR},
}


def _input_message(*keys: str) -> Mapping[str, Rule]:
    # Parts only without ``type``: a list item with it merges into the parts before it.
    content = _STR if "type" in keys else {**_INPUT_PARTS, TEXT_TOO: {}}
    rules = {"content": content, "role": _STR, "type": _STR}
    return {key: rules[key] for key in keys}


def _call(*extra: str) -> Mapping[str, Rule]:
    rules = {"arguments": _STR, "call_id": _CALL_ID, "name": _ID, "type": _STR}
    return {**rules, **{key: _STR for key in extra}}


def _output(*extra: str) -> Mapping[str, Rule]:
    return {"call_id": _CALL_ID, "output": _STR, "type": _STR, **{key: _STR for key in extra}}


def _reasoning(*extra: str) -> Mapping[str, Rule]:
    rules = {"id": _ID, "summary": _SUMMARY, "type": _STR}
    return {**rules, **{key: (str, type(None)) for key in extra}}


_ASSISTANT_OUT: Final = {
    "id": _STR,
    "content": _OUTPUT_PARTS,
    "role": _STR,
    "status": _STR,
    "type": _STR,
}
PROVEN_SHAPES: Final[Shapes] = {
    # (kind, the item's keys in order): each key's rule. Every item of these shapes
    # comes back from its turn's content exactly, key order included (proven by the
    # property tests); ``turn_metadata`` checks no further.
    **{
        (f"message:{role}", keys): _input_message(*keys)
        for role in ("user", "system")  # not developer: beside system items it is lost
        for keys in (("content", "role"), ("content", "role", "type"))
    },
    ("message:assistant", ("content", "role")): {"content": _STR, "role": _STR},
    ("message:assistant", tuple(_ASSISTANT_OUT)): _ASSISTANT_OUT,
    ("message:assistant", (*_ASSISTANT_OUT, "phase")): {**_ASSISTANT_OUT, "phase": _STR},
    **{
        ("function_call", tuple(rules)): rules
        for rules in (_call(), _call("id"), _call("status"), _call("id", "status"))
    },
    **{
        ("function_call_output", tuple(rules)): rules
        for rules in (_output(), _output("id"), _output("status"), _output("id", "status"))
    },
    **{
        ("reasoning", tuple(rules)): rules
        for rules in (_reasoning(), _reasoning("encrypted_content"))
    },
}
_FOLLOWERS: Final = frozenset({"function_call", "message:assistant"})


def _fits(value: Any, rule: Rule) -> bool:
    if type(rule) is type:
        return type(value) is rule
    if type(rule) is tuple:
        return type(value) in rule if rule else type(value) is list and not value
    if rule is True:
        return type(value) is str and value != ""
    if type(rule) is int:
        return type(value) is str and 0 < len(value) <= rule
    if type(value) is str:
        return TEXT_TOO in rule
    return type(value) is list and all(_shaped(part, rule) for part in value)


def _shaped(value: Any, shapes: Shapes) -> bool:
    """Whether ``value`` is a dict of one of ``shapes`` (its kind and keys in order, its values)."""
    if type(value) is not dict:
        return False
    rules = shapes.get((_kind(value) or "", tuple(value)))
    return rules is not None and all(_fits(value[key], rules[key]) for key in rules)


def proven(items: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the items of one turn all have shapes of :data:`PROVEN_SHAPES`.

    A reasoning item also needs a follower in the turn (a function call or an
    assistant message after it, past other reasoning), as the converters
    replay reasoning only with the item it belongs to.
    """
    waiting = False
    for item in items:
        if not _shaped(item, PROVEN_SHAPES):
            return False
        kind = _kind(item)
        if kind == "reasoning":
            waiting = True
        elif kind in _FOLLOWERS:
            waiting = False
    return not waiting


_DIRECT: Final[Shapes] = {
    # The shapes whose conversion :func:`_direct` builds itself (the Runner's commonest;
    # a function call with its item id, so its block always carries a patch).
    ("message:user", ("content", "role")): {"content": _STR, "role": _STR},
    ("message:system", ("content", "role")): {"content": _STR, "role": _STR},
    ("message:assistant", tuple(_ASSISTANT_OUT)): _ASSISTANT_OUT,
    ("function_call_output", ("call_id", "output", "type")): {
        "call_id": _ID,
        "output": _STR,
        "type": _STR,
    },
    **{
        ("function_call", tuple(rules)): {**rules, "call_id": _ID}
        for rules in (_call("id"), _call("id", "status"))
    },
}


def _direct(item: Mapping[str, Any]) -> tuple[Role, tuple[SessionContentBlock, ...]] | None:
    """What the converters make of ``item`` when it has a :data:`_DIRECT` shape, else ``None``.

    The same blocks, built without the converters' own checks (proven equal,
    JSON text included, by the property tests); blank text is left to them.
    """
    if not _shaped(item, _DIRECT):
        return None
    kind = item.get("type")
    if kind == "function_call_output":
        return "user", (ToolResultBlock(call_id=item["call_id"], output=item["output"]),)
    if kind == "function_call":
        arguments = item["arguments"]
        tool_input = arguments_from_json(arguments)
        sets = {"/arguments": arguments} if arguments_to_json(tool_input, "$") != arguments else {}
        sets.update((f"/{key}", item[key]) for key in ("id", "status") if key in item)
        call = ToolCallBlock(
            id=item["call_id"],
            name=item["name"],
            input=tool_input,
            provider_data={"provider": RESPONSES, "set": sets},
        )
        return "assistant", (call,)
    content = item["content"]
    if type(content) is str:
        if not content.strip():
            return None
        mark = {"form": "string", "unset": ["/type"]}
        return item["role"], (
            TextBlock(content, provider_data={"provider": RESPONSES, "item": mark}),
        )
    blocks: list[SessionContentBlock] = []
    for part in content:
        if not part["text"].strip():
            return None
        data: dict[str, Any] = {"provider": RESPONSES}
        if "logprobs" in part:
            data["set"] = {"/logprobs": []}
        if blocks:
            data["join"] = True
        else:
            data["item"] = {"form": "list", "set": {"/id": item["id"], "/status": item["status"]}}
        blocks.append(TextBlock(part["text"], provider_data=data))
    return ("assistant", tuple(blocks)) if blocks else None


# -- error marks ----------------------------------------------------------------------


def error_marks(content: Sequence[SessionContentBlock]) -> set[str]:
    """The call ids of the tool results in ``content`` marked ``isError``."""
    return {b.call_id for b in content if isinstance(b, ToolResultBlock) and b.is_error}


def marked(
    content: tuple[SessionContentBlock, ...], failed: set[str] | frozenset[str]
) -> tuple[SessionContentBlock, ...]:
    """``content`` with the tool results of the calls ``failed`` marked ``isError``."""
    if not failed:
        return content
    return tuple(
        msgspec.structs.replace(b, is_error=True)
        if isinstance(b, ToolResultBlock) and b.call_id in failed and not b.is_error
        else b
        for b in content
    )


# -- items → turns --------------------------------------------------------------------


def group_items(items: Sequence[Mapping[str, Any]]) -> list[ItemGroup]:
    """Split items into runs of one role, each with its neutral content (one conversion per item).

    Raises :class:`WireFormatError` (path ``$[i]…`` into ``items``) for an
    item the converters cannot carry: a :class:`~zidane_actors.errors.WireTypeError` (a
    ``TypeError``) when an item holds a value of a type JSON cannot carry.
    """
    groups: list[ItemGroup] = []
    for item in items:
        made = _direct(item)
        if made is None:
            try:
                (message,) = from_openai_responses([item])
            except (WireFormatError, ValueError):
                # A value JSON cannot carry anywhere in the call is named first, as a TypeError
                # (WireTypeError), as json.dumps (SQLiteSession) refuses it; else the located error.
                check_json_types(items, "$")
                from_openai_responses(items)
                raise
            made = message.role, message.content
        role, content = made
        if groups and groups[-1][0] == role:
            groups[-1][2].append(item)  # type: ignore[arg-type]
            groups[-1] = (role, groups[-1][1] + content, groups[-1][2])
        else:
            groups.append((role, content, [item]))  # type: ignore[list-item]
    return groups


def _converted(role: Role, content: tuple[SessionContentBlock, ...]) -> list[dict[str, Any]]:
    return [_sdk_ordered(i) for i in to_openai_responses([SessionMessage(role, content)])]


def turn_metadata(
    metadata: Mapping[str, Any] | None,
    role: Role,
    content: tuple[SessionContentBlock, ...],
    items: list[dict[str, Any]],
) -> dict[str, Any] | None:
    """``metadata`` with what ``items`` need beyond ``content``: usually nothing.

    Items of shapes proven to come back are taken as they are (:func:`proven`);
    for the rest, checks that the items come back from ``content`` as sent
    (same JSON text); records the key order of those that differ from the SDK's, and keeps the
    items whole only when their values would not come back.
    """
    updated = {
        k: v
        for k, v in (metadata or {}).items()
        if k not in (OPENAI_ITEMS_METADATA_KEY, OPENAI_ORDER_METADATA_KEY)
    }
    if proven(items):
        return updated or None
    back = _converted(role, content)
    order: dict[str, Any] = {}
    if len(back) == len(items):
        for index, (item, mine) in enumerate(zip(items, back, strict=True)):
            if _json_text(item) == _json_text(mine):
                continue
            if _json_text(item, sort=True) != _json_text(mine, sort=True):
                break
            order[str(index)] = _order_spec(item, mine)
        else:
            if order:
                updated[OPENAI_ORDER_METADATA_KEY] = order
            return updated or None
    updated[OPENAI_ITEMS_METADATA_KEY] = [dict(item) for item in items]
    return updated


# -- turns → items --------------------------------------------------------------------


def _native_items(turn: SessionTurn) -> list[dict[str, Any]] | None:
    stored = (turn.metadata or {}).get(OPENAI_ITEMS_METADATA_KEY)
    if not isinstance(stored, list) or not stored:
        return None
    if not all(isinstance(item, dict) for item in stored):
        return None
    try:
        groups = group_items(stored)  # converted as the turn was made: item by item
    except (WireFormatError, ValueError):
        return None
    if len(groups) != 1 or groups[0][0] != turn.role:
        return None
    if marked(groups[0][1], error_marks(turn.content)) != turn.content:
        return None
    return [dict(item) for item in stored]


def items_of_turn(turn: SessionTurn) -> list[dict[str, Any]]:
    """The Responses input items a turn stands for (none for ``command`` turns)."""
    if turn.role == "command":
        return []
    metadata = turn.metadata
    if metadata:
        native = _native_items(turn)
        if native is not None:
            return native
    items = _converted(turn.role, turn.content)
    order = metadata.get(OPENAI_ORDER_METADATA_KEY) if metadata else None
    if isinstance(order, dict):
        for key, spec in order.items():
            if isinstance(key, str) and key.isdigit() and int(key) < len(items):
                items[int(key)] = _apply_order(items[int(key)], spec)
    return items


def turn_without_last_item(turn: SessionTurn) -> SessionTurn | None:
    """``turn`` with its last item removed, or ``None`` when nothing would remain."""
    items = items_of_turn(turn)
    if len(items) <= 1:
        return None
    ((role, content, group),) = group_items(items[:-1])
    content = marked(content, error_marks(turn.content))
    return msgspec.structs.replace(
        turn, content=content, metadata=turn_metadata(turn.metadata, role, content, group)
    )
