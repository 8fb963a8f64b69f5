"""The shortcuts a store and ``checked_turns`` read turns by: proofs, never guesses.

``nests_at_most`` answers ``True`` only when a turn's JSON nests at most that
deep (the bytes outside its text cannot hold more brackets); the SQLite
store counts the bytes of any other row, so a deep row next to long text is
still corrupt, and one at the limit still loads. ``plain_turn`` answers
``True`` only for a turn ``frozen`` would leave as it is.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from odd_values import any_json, any_text, any_value

from zidane_actors.errors import CorruptDataError
from zidane_actors.model import (
    MAX_STORED_JSON_DEPTH,
    ImageBlock,
    ReasoningBlock,
    SessionData,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    TurnUsage,
    decode,
    encode,
    parse_json,
    stored_too_deep,
)
from zidane_actors.model._depth import nests_at_most
from zidane_actors.model._frozen import _walked, frozen, plain_turn
from zidane_actors.stores import open_sqlite_store


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


_TEXT = st.text(max_size=40) | any_text
_BLOCKS = st.lists(
    st.builds(TextBlock, _TEXT, provider_data=st.none() | st.dictionaries(_TEXT, any_json))
    | st.builds(
        ToolCallBlock,
        st.just("c"),
        st.just("f"),
        st.dictionaries(_TEXT, st.none() | _TEXT | any_json, max_size=4),
    )
    | st.builds(
        ToolResultBlock,
        st.just("c"),
        _TEXT | st.tuples(st.builds(TextBlock, _TEXT)),
    ),
    max_size=4,
)


@settings(max_examples=400, deadline=None)
@given(_BLOCKS, st.none() | st.dictionaries(_TEXT, any_json, max_size=3), st.integers(0, 9))
@example([], {"\ud800": None}, 0)  # a lone surrogate, written escaped
def test_a_proven_bound_holds(blocks: list[Any], metadata: Any, depth: int) -> None:
    turn = SessionTurn(id="t", role="user", content=tuple(blocks), created_at=1, metadata=metadata)
    body = encode(turn)
    deepest = _depth(parse_json(body))  # lone surrogates written escaped
    for told in (turn, decode(body, SessionTurn)):  # as written, and as read back
        if nests_at_most(told, len(body), depth):
            assert deepest <= depth
    if nests_at_most(turn, len(body), MAX_STORED_JSON_DEPTH):
        assert not stored_too_deep(body)


def _nest(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    ("body", "corrupt"),
    [
        # turn, content, block, providerData: 4 levels around the nested arrays
        (f'{{"content":[{{"type":"text","text":"{"x" * 3000}","providerData":{{"x":%s}}}}]', False),
        (f'{{"content":[{{"type":"text","text":"{"x" * 3000}","providerData":{{"x":%s}}}}]', True),
        # a repeated key: the value read drops the deep one, the row is still too deep
        (
            '{"content":[{"type":"text","text":"x","providerData":{"x":%s}}],'
            f'"content":[{{"type":"text","text":"{"x" * 3000}"}}]',
            True,
        ),
    ],
)
async def test_sqlite_reads_deep_rows_beside_long_text_as_corrupt(
    tmp_path: Path, body: str, corrupt: bool
) -> None:
    path = tmp_path / "s.db"
    turn = SessionTurn(id="t1", role="user", content=(TextBlock("a"),), created_at=1)
    async with open_sqlite_store(path) as store:
        await store.save(SessionData(id="s1", created_at=1, updated_at=1, turns=(turn,)))
    row = (body % _nest(MAX_STORED_JSON_DEPTH - 4 + corrupt)) + ',"createdAt":1}'
    assert stored_too_deep(row) is corrupt
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE turns SET body = ?", (row.encode(),))
    async with open_sqlite_store(path) as store:
        for read in (store.load("s1"), store.get_turns("s1")):
            if corrupt:
                with pytest.raises(CorruptDataError, match="MAX_STORED_JSON_DEPTH"):
                    await read
            else:
                assert await read is not None


_ANY = st.none() | any_value | st.lists(any_value, max_size=2).map(tuple)
_IMAGE = st.builds(
    ImageBlock, media_type=st.just("image/png"), data=st.just("aGk="), provider_data=_ANY
)
_PARTS = st.lists(st.builds(TextBlock, _ANY) | _IMAGE | _ANY, max_size=3).map(tuple)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.builds(TextBlock, _ANY, provider_data=st.none() | _ANY)
        | st.builds(ToolResultBlock, _ANY, _ANY | _PARTS, name=_ANY)
        | st.builds(ToolCallBlock, st.just("c"), st.just("f"), _ANY)
        | _IMAGE
        | st.builds(ReasoningBlock, text=_ANY)
        | _ANY,
        max_size=3,
    ).map(tuple)
    | _ANY,
    st.none() | st.builds(TurnUsage, input=_ANY, model=_ANY),
    _ANY,
    _ANY,
)
def test_a_plain_turn_is_frozen_as_it_is(content: Any, usage: Any, run_id: Any, other: Any) -> None:
    """``plain_turn`` says yes only where ``frozen`` would walk the turn and change nothing."""
    turn = SessionTurn(
        id="t", role="user", content=content, created_at=1, usage=usage, run_id=run_id
    )
    for told in (turn, msgspec.structs.replace(turn, metadata=other)):
        if plain_turn(told):
            assert _walked(told) is told  # the walk itself, not the shortcut
    # a field added to turns is one plain_turn must look at
    assert msgspec.structs.fields(SessionTurn) and {
        f.name for f in msgspec.structs.fields(SessionTurn)
    } == {
        "id",
        "role",
        "content",
        "created_at",
        "run_id",
        "usage",
        "metadata",
        "provider_data",
        "extra_fields",
    }


def test_text_and_text_results_are_plain() -> None:
    parts = (TextBlock("a"), ImageBlock(media_type="image/png", data="aGk="))
    blocks = (
        TextBlock("a"),
        ToolResultBlock("c", "out", is_error=True),
        ToolResultBlock("c", parts),
        ReasoningBlock(text="r", signature="s"),
    )
    turn = SessionTurn(id="t", role="user", content=blocks, created_at=1, usage=TurnUsage(input=1))
    assert plain_turn(turn) and frozen(turn) is turn
    called = SessionTurn(id="t", role="user", content=(ToolCallBlock("c", "f", {}),), created_at=1)
    assert not plain_turn(called)
