"""The item shapes ``turn_metadata`` takes without checking them come back exactly,
and the shapes ``group_items`` converts itself convert as the converters do.

Items are drawn from :data:`PROVEN_SHAPES` itself (every entry, each key's
rule turned into values: unicode, NUL, lone surrogates, empty and blank
strings, tool ids up to the 40-character limit, arguments of nested JSON
with big and odd numbers or no JSON at all) in runs of mixed shapes; every
turn ``group_items`` makes of them must come back from its content with the
same JSON text, key order included, with no item copy or order record kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from zidane_actors.integrations._responses import (
    _DIRECT,
    PROVEN_SHAPES,
    TEXT_TOO,
    _direct,
    group_items,
    items_of_turn,
    marked,
    proven,
    turn_metadata,
)
from zidane_actors.model import SessionTurn, ToolResultBlock
from zidane_actors.wire import from_openai_responses

ODD = st.sampled_from(["", " ", "\n\n", "\x00", "\ud800", "a\udfff", "é🙂", "{}", "null", "0"])
TEXT = st.text(max_size=12) | ODD
ID = st.text(min_size=1, max_size=12) | st.sampled_from(["\ud800", "🙂", "x" * 40])
CALL_ID = st.text(min_size=1, max_size=40) | st.sampled_from(["x" * 40, "\udfff", "call_0"])
NUMBER = (
    st.integers(-(2**80), 2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([2**63, -(2**64) - 1, 1e308, 0.1, -0.0])
)
JSON = st.recursive(
    st.none() | st.booleans() | NUMBER | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


@st.composite
def arguments(draw: st.DrawFn) -> str:
    """A call's arguments: JSON written any way, or text that is no JSON object."""
    value = draw(st.dictionaries(TEXT, JSON, max_size=3) | JSON)
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (",", ": ")]))
    written = json.dumps(
        value,
        separators=separators,
        ensure_ascii=draw(st.booleans()),
        indent=draw(st.none() | st.just(2)),
    )
    odd = st.sampled_from(["", "{", "[1, 2]", "1e999", "NaN", '{"a": 1, "a": 2}', " {} "])
    return draw(st.just(written) | odd | TEXT)


def _value(key: str, rule: Any, kind: str) -> st.SearchStrategy[Any]:
    """Values ``rule`` accepts (see ``_responses.Rule``); ``type`` and ``role`` follow the kind."""
    if key == "type":
        return st.just("message" if kind.startswith("message:") else kind)
    if key == "role":
        return st.just(kind.split(":")[1])
    if key == "arguments":
        return arguments()
    if rule is str:
        return TEXT
    if rule is True:
        return ID
    if type(rule) is int:
        return CALL_ID
    if rule == ():
        return st.just([])
    if type(rule) is tuple:
        return TEXT | st.none()
    parts = st.lists(
        st.sampled_from(sorted(k for k in rule if k != TEXT_TOO)).flatmap(_shape(rule)), max_size=3
    )
    return parts | TEXT if TEXT_TOO in rule else parts


def _shape(
    shapes: Mapping[Any, Mapping[str, Any]],
) -> Any:
    def draw(entry: tuple[str, tuple[str, ...]]) -> st.SearchStrategy[dict[str, Any]]:
        kind, keys = entry
        rules = shapes[entry]
        values = st.tuples(*(_value(key, rules[key], kind) for key in keys))
        return values.map(lambda vs: dict(zip(keys, vs, strict=True)))

    return draw


FOLLOWER = _shape(PROVEN_SHAPES)(("function_call", ("arguments", "call_id", "name", "type")))


@st.composite
def proven_items(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A run of items of proven shapes, each reasoning item followed by what it belongs to."""
    entries = st.sampled_from(sorted(PROVEN_SHAPES))
    items = draw(st.lists(entries.flatmap(_shape(PROVEN_SHAPES)), min_size=1, max_size=6))
    out: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        out.append(item)
        after = items[index + 1] if index + 1 < len(items) else {}
        role, kind = after.get("role"), after.get("type")
        follows = role == "assistant" or kind in ("reasoning", "function_call")
        if item.get("type") == "reasoning" and not follows:
            out.append(draw(FOLLOWER))
    return out


def _text(value: Any) -> str:
    return json.dumps(value)  # ASCII escapes: lone surrogates compare too


@settings(max_examples=200)
@given(proven_items(), st.booleans())
def test_proven_shapes_come_back_exactly(items: list[dict[str, Any]], fail: bool) -> None:
    for role, content, group in group_items(items):
        assert proven(group)
        if fail:  # results the Runner reported failed carry isError: no item changes
            content = marked(
                content, {b.call_id for b in content if isinstance(b, ToolResultBlock)}
            )
        assert turn_metadata(None, role, content, group) is None
        turn = SessionTurn(id="t", role=role, content=content, created_at=0)
        assert _text(items_of_turn(turn)) == _text(group)
        assert turn_metadata({"k": 1}, role, content, group) == {"k": 1}


def test_every_shape_is_drawn_and_other_shapes_are_not_proven() -> None:
    kinds = {kind for kind, _ in PROVEN_SHAPES}
    assert kinds >= {"function_call", "function_call_output", "reasoning", "message:user"}
    call = {"arguments": "{}", "call_id": "c", "name": "f", "type": "function_call"}
    assert proven([call])
    assert not proven([{**call, "call_id": "c" * 41}])  # remapped on the way back
    assert not proven([{"type": "function_call", **call}])  # another key order
    assert not proven([{**call, "extra": 1}])
    assert not proven([{**call, "name": ""}])
    reasoning = {"id": "r", "summary": [], "type": "reasoning"}
    assert not proven([reasoning])  # nothing it belongs to: dropped on the way back
    assert proven([reasoning, call])
    assert not proven([reasoning, call, reasoning])
    out = {"annotations": [{"type": "url_citation"}], "text": "a", "type": "output_text"}
    message = {"id": "m", "content": [out], "role": "assistant", "status": "s", "type": "message"}
    assert not proven([message])
    assert proven([{**message, "content": [{**out, "annotations": []}]}])


@settings(max_examples=200)
@given(st.sampled_from(sorted(_DIRECT)).flatmap(_shape(_DIRECT)))
def test_direct_conversions_are_the_converters(item: dict[str, Any]) -> None:
    made = _direct(item)
    if made is None:  # blank text: the converters' own
        return
    (message,) = from_openai_responses([item])
    assert made == (message.role, message.content)
    assert _text(msgspec.to_builtins(made[1])) == _text(msgspec.to_builtins(message.content))


def test_the_runners_commonest_items_are_converted_directly() -> None:
    part = {"annotations": [], "text": "a", "type": "output_text", "logprobs": []}
    answer = {"id": "m", "content": [part], "role": "assistant", "status": "s", "type": "message"}
    for item in (
        {"content": "hi", "role": "user"},
        answer,
        {**answer, "content": [part, {**part, "text": "b"}]},
        {"call_id": "c", "output": "", "type": "function_call_output"},
        {"arguments": '{"q": 1}', "call_id": "c", "name": "f", "type": "function_call", "id": "c"},
    ):
        assert _direct(item) is not None
    for item in (
        {"content": " ", "role": "user"},
        {"role": "user", "content": "hi"},
        {**answer, "content": []},
        {"call_id": "", "output": "", "type": "function_call_output"},
    ):
        assert _direct(item) is None
