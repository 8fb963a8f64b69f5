"""Properties of turns checked once (``CheckedTurns``): its bodies are what the slow path writes.

For any turns, ``checked_turns`` refuses exactly what the session's check
refuses (same error, same path); it answers a carrier exactly when a store
accepts every turn, and then the rows a store makes from the carrier's bodies
equal the rows it makes by checking the same turns itself.
"""

from __future__ import annotations

import copy
import datetime
import decimal
import enum
import math
import pickle
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace
from sdk_strategies import json_object
from store_contract import make_turn, rich_turns

from zidane_actors.errors import InvalidNameError, ValidationError
from zidane_actors.model import SessionTurn, TextBlock, ToolCallBlock, TurnUsage, encode
from zidane_actors.model._checked import (
    CheckedTurns,
    _checked_walked,
    check_turns,
    check_values,
    checked_turns,
)
from zidane_actors.model._json import MAX_JSON_DEPTH
from zidane_actors.stores.sqlite._rows import _turn_rows_of

_BAD_VALUES = st.sampled_from([math.nan, math.inf, b"x", {1, 2}, {1: "int key"}])


class _Color(enum.IntEnum):
    RED = 1


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


# Values a turn may hold that read back changed, refused, or equal in another type:
# each must take the whole check (the skipped walk is only for what reads back equal).
_ODD: list[Any] = [
    math.nan,
    -math.inf,
    b"x",
    bytearray(b"x"),
    frozenset({1}),
    {True: 1},
    {1.5: "float key"},
    (1, [2, (3,)]),
    _Color.RED,
    {"k": _Color.RED},
    -0.0,
    2**70,
    datetime.datetime(2026, 1, 1),
    decimal.Decimal("1.5"),
    TextBlock("a model value"),
    msgspec.UNSET,
    _nested(MAX_JSON_DEPTH - 2),
    _nested(MAX_JSON_DEPTH + 5),
    {"deep": _nested(MAX_JSON_DEPTH - 1)},
    "{[" * 80,
]
_ODD_VALUES = st.sampled_from(_ODD)
_IDS = st.sampled_from(["t1", "t2", "t3", "../x", "a b", "ok.id"])


@st.composite
def turns(draw: st.DrawFn, odd: bool = False) -> list[Any]:
    """Turns with random ids (some unsafe or repeated), times (some negative), metadata and
    tool inputs (some holding what JSON cannot carry), usage (some out of range), and
    sometimes a value that is not a turn at all."""
    drawn: list[Any] = []
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.integers(0, 15)) == 0:
            drawn.append({"id": "t9"})
            continue
        metadata = draw(st.none() | json_object)
        if metadata is not None and draw(st.integers(0, 5)) == 0:
            metadata["bad"] = draw(_BAD_VALUES)
        if odd and metadata is not None and draw(st.integers(0, 2)) == 0:
            metadata["odd"] = draw(_ODD_VALUES)
        tool_input = draw(json_object)
        if draw(st.integers(0, 7)) == 0:
            tool_input["bad"] = draw(_BAD_VALUES)
        drawn.append(
            SessionTurn(
                id=draw(_IDS),
                role=draw(st.sampled_from(["user", "assistant"])),
                content=(TextBlock(draw(st.text(max_size=5))), ToolCallBlock("c", "f", tool_input)),
                created_at=draw(st.integers(-2, 3)),
                usage=draw(st.none() | st.builds(TurnUsage, input=st.integers(-1, 5))),
                metadata=metadata,
            )
        )
    return drawn


@settings(max_examples=300, deadline=None)
@given(turns())
def test_the_carrier_holds_exactly_what_the_slow_path_writes(drawn: list[Any]) -> None:
    try:
        expected = check_turns(drawn)
    except ValidationError as exc:
        with pytest.raises(type(exc)) as raised:
            checked_turns(drawn)
        assert str(raised.value) == str(exc) and raised.value.path == exc.path
        return
    checked = checked_turns(drawn)
    assert checked == expected
    try:
        rows = _turn_rows_of(expected, 3)  # the store checking the turns itself
    except ValidationError:
        assert type(checked) is tuple  # no carrier: the store refuses them as before
        return
    assert type(checked) is CheckedTurns
    assert checked.bodies == tuple(encode(t) for t in drawn)
    assert _turn_rows_of(checked, 3) == rows


def _odd_turn(value: Any) -> list[Any]:
    return [replace(make_turn(1), metadata={"odd": value})]


@settings(max_examples=500, deadline=None)
@given(turns(odd=True))
def test_skipping_the_walk_changes_no_answer(drawn: list[Any]) -> None:
    """``checked_turns`` answers what the whole walk of every turn answers: the same
    error at the same path, or the same turns with the same bodies."""
    _same_answer(drawn)


@pytest.mark.parametrize("value", _ODD, ids=[type(v).__name__ for v in _ODD])
def test_each_odd_value_gets_the_answer_of_the_whole_walk(value: Any) -> None:
    _same_answer(_odd_turn(value))


def _same_answer(drawn: list[Any]) -> None:
    try:
        walked: Any = _checked_walked(check_values(drawn, SessionTurn, "turns", walk=False))
    except ValidationError as exc:
        walked = exc
    try:
        fast: Any = checked_turns(drawn)
    except ValidationError as exc:
        fast = exc
    if isinstance(walked, ValidationError):
        assert type(fast) is type(walked) and str(fast) == str(walked)
        assert fast.path == walked.path
        return
    assert type(fast) is type(walked) and fast == walked
    assert [type(t) for t in fast] == [type(t) for t in walked]
    if type(fast) is CheckedTurns:
        assert fast.bodies == walked.bodies


def test_a_carrier_is_built_by_checked_turns_only() -> None:
    carrier = checked_turns(rich_turns())
    assert type(carrier) is CheckedTurns and carrier == rich_turns()
    with pytest.raises(TypeError, match="checked_turns"):
        CheckedTurns(rich_turns(), carrier.bodies, object())
    # whatever the bodies could not follow is a plain tuple
    for other in (
        carrier[1:],
        carrier + carrier,
        tuple(carrier),
        copy.copy(carrier),
        copy.deepcopy(carrier),
        pickle.loads(pickle.dumps(carrier)),
    ):
        assert type(other) is tuple and all(t in carrier for t in other)


def test_what_a_store_refuses_gets_no_carrier() -> None:
    for bad in (
        replace(make_turn(2), id="../x"),
        replace(make_turn(2), created_at=-1),
        replace(make_turn(2), usage=TurnUsage(input=-1)),
    ):
        checked = checked_turns([make_turn(1), bad])
        assert type(checked) is tuple and checked == (make_turn(1), bad)
    with pytest.raises(InvalidNameError):
        _turn_rows_of((replace(make_turn(2), id="../x"),), 0)


def test_refusals_stay_located_as_the_session_check_locates_them() -> None:
    nan = replace(make_turn(2), metadata={"x": math.nan})
    cases: list[tuple[list[Any], str]] = [
        ([make_turn(1), nan], "$.turns[1].metadata.x"),
        ([make_turn(1), "turn"], "$.turns[1]"),
        ([make_turn(1), make_turn(1)], "$.turns[1].id"),
    ]
    for given_turns, path in cases:
        with pytest.raises(ValidationError) as raised:
            checked_turns(given_turns)
        assert raised.value.path == path


def _changeable(value: Any, path: str = "$") -> list[str]:
    """Where ``value`` holds a dict or list a caller could change."""
    from zidane_actors.model._frozen import FrozenDict, FrozenList

    if isinstance(value, dict):
        own = [] if type(value) is FrozenDict else [path]
        return own + [p for k, v in value.items() for p in _changeable(v, f"{path}.{k}")]
    if isinstance(value, list):
        own = [] if type(value) is FrozenList else [path]
        return own + [p for i, v in enumerate(value) for p in _changeable(v, f"{path}[{i}]")]
    if isinstance(value, tuple):
        return [p for i, v in enumerate(value) for p in _changeable(v, f"{path}[{i}]")]
    if isinstance(value, msgspec.Struct):
        fields = msgspec.structs.asdict(value)
        return [p for k, v in fields.items() for p in _changeable(v, f"{path}.{k}")]
    return []


@settings(max_examples=300, deadline=None)
@given(turns(), st.booleans())
def test_a_checked_turn_holds_nothing_a_caller_can_change(drawn: list[Any], twice: bool) -> None:
    from zidane_actors.model._frozen import frozen

    real = [t for t in drawn if isinstance(t, SessionTurn)]
    # Leaf containers (only scalars inside) and structs of scalars take the fast paths.
    leafy = {"flat": {"a": 1, "b": None}, "list": [1, "x", 2.5], "none": {}}
    real.append(SessionTurn(id="leafy", role="user", content=(), created_at=0, metadata=leafy))
    kept = frozen(tuple(real))
    if twice:
        kept = frozen(kept)
    assert kept == tuple(real)
    assert _changeable(kept) == []
