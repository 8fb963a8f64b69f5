"""No error message repr's an unbounded input: ``model.preview`` renders one bounded and safe."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from zidane_actors.errors import InvalidNameError, ValidationError
from zidane_actors.model import (
    PREVIEW_MAX_CHARS,
    SessionTurn,
    TextBlock,
    check_column_text,
    check_json,
    preview,
    validate_request_id,
)
from zidane_actors.stores import create_remote_store, open_postgres_store


def _nested_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def _nested_tuple(depth: int) -> tuple[Any, ...]:
    value: tuple[Any, ...] = ()
    for _ in range(depth):
        value = (value,)
    return value


def _nested_dict(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


class _FailingRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class _HugeRepr:
    def __repr__(self) -> str:
        return "x" * 1_000_000


def _cyclic() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


def _deep_turn() -> SessionTurn:
    turn = SessionTurn(id="t", role="user", content=(TextBlock("x"),), created_at=1)
    for _ in range(3_000):
        turn = msgspec.structs.replace(turn, metadata={"t": turn})
    return turn


ODD_VALUES: list[tuple[str, Any]] = [
    ("deep list", _nested_list(3_000)),
    ("deep tuple", _nested_tuple(3_000)),
    ("deep dict", _nested_dict(3_000)),
    ("cyclic list", _cyclic()),
    ("huge int", 10**5_000),
    ("huge str", "é" * 1_000_000),
    ("huge bytes", b"x" * 1_000_000),
    ("big dict", {i: i for i in range(100_000)}),
    ("big set", set(range(100_000))),
    ("failing repr", _FailingRepr()),
    ("huge repr", _HugeRepr()),
    ("deep struct", _deep_turn()),
    ("lone surrogate", "\ud800" * 500),
]


@pytest.mark.parametrize("value", [v for _, v in ODD_VALUES], ids=[n for n, _ in ODD_VALUES])
def test_preview_is_bounded_and_never_raises(value: Any) -> None:
    text = preview(value)
    assert len(text) <= PREVIEW_MAX_CHARS + 40
    text.encode()  # printable: a lone surrogate is shown escaped


def test_preview_of_short_text_reads_as_repr() -> None:
    assert preview("user") == "'user'"
    assert preview(None) == "None"
    assert preview(7) == "7"
    assert preview(float("nan")) == "nan"
    assert preview([1, 2]) == "[1, 2] (a list)"
    assert preview("x" * 200).endswith("…' (200 chars)")


def test_check_json_names_a_deep_non_string_key_boundedly() -> None:
    """A tuple key nested 3,000 deep: a located ``ValidationError``, not ``RecursionError``."""
    with pytest.raises(ValidationError) as info:
        check_json({"a": {_nested_tuple(3_000): 1}}, what="metadata", path="$.metadata")
    assert info.value.path == "$.metadata.a"
    assert "is a tuple, not a string" in str(info.value)
    assert len(str(info.value)) < 300


def test_id_and_column_text_errors_clip_the_text() -> None:
    with pytest.raises(InvalidNameError) as info:
        validate_request_id("\x00" * 1_000)
    assert len(str(info.value)) < 300
    with pytest.raises(ValidationError) as refused:
        check_column_text("\x00" + "x" * 1_000_000, what="agent id", path="$.agentId")
    assert len(str(refused.value)) < 300


def test_preview_of_short_text_full_of_escapes_is_clipped() -> None:
    text = preview("\U0001f600\x00" * 40)
    assert len(text) <= PREVIEW_MAX_CHARS + 20
    assert text.endswith("…' (80 chars)")


async def test_store_options_are_checked_and_named_boundedly() -> None:
    """Options of the wrong type, or numbers too long to print, are refused with a bounded
    message (``str`` of an int past 4,300 digits raises ``ValueError`` itself)."""
    deep = _nested_list(3_000)
    for kwargs in (
        {"url": deep},
        {"url": "http://x", "timeout_ms": float("nan")},
        {"url": "http://x", "retries": -(10**5_000)},
        {"url": "http://x", "max_answer_bytes": "big"},
    ):
        with pytest.raises(ValidationError) as caught:
            create_remote_store(**kwargs)
        assert len(str(caught.value)) < 200
    for options in ({"schema": deep}, {"pool_size": -(10**5_000)}, {"retries": "3"}):
        with pytest.raises(ValidationError) as refused:
            async with open_postgres_store("postgresql://127.0.0.1:1/none", **options):
                pass
        assert len(str(refused.value)) < 200
