"""Realistic turns for the benchmarks: 1-4 KB of JSON each, seeded, so every run writes the same.

An agent step is three turns: the user's message, the assistant's answer with
a tool call (its input a nested JSON object), and the tool's result.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec

from zidane_actors.model import (
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    TurnUsage,
    encode,
)

__all__ = ["step_turn", "turn_item", "turn_size"]

_WORDS = [
    "session",
    "store",
    "actor",
    "durable",
    "commit",
    "turn",
    "tool",
    "result",
    "input",
    "output",
    "request",
    "reply",
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "that",
    "this",
    "be",
    "it",
    "are",
    "was",
    "or",
    "an",
]


def _text(rng: random.Random, size: int) -> str:
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


def step_turn(session: int, i: int, *, seed: int = 14) -> SessionTurn:
    """Turn ``i`` of session ``session``: user text, assistant tool call, tool result in turn."""
    rng = random.Random(seed * 1_000_003 + session * 10_007 + i)
    kind = i % 3
    tid = f"s{session}-t{i}"
    call_id = f"call-{session}-{i - kind + 1}"
    if kind == 0:
        return SessionTurn(
            id=tid,
            role="user",
            content=(TextBlock(text=_text(rng, rng.randint(1100, 3400))),),
            created_at=1_700_000_000_000 + i,
        )
    if kind == 1:
        return SessionTurn(
            id=tid,
            role="assistant",
            content=(
                TextBlock(text=_text(rng, rng.randint(600, 1400))),
                ToolCallBlock(
                    id=call_id,
                    name="search_files",
                    input={
                        "query": _text(rng, 60),
                        "paths": [f"src/module_{rng.randint(0, 99)}.py" for _ in range(8)],
                        "options": {"regex": False, "max_results": 50, "context_lines": 3},
                    },
                ),
            ),
            created_at=1_700_000_000_000 + i,
            usage=TurnUsage(input=rng.randint(1000, 9000), output=rng.randint(50, 900)),
        )
    return SessionTurn(
        id=tid,
        role="user",
        content=(
            ToolResultBlock(
                call_id=call_id,
                output=_text(rng, rng.randint(1100, 3600)),
                name="search_files",
            ),
        ),
        created_at=1_700_000_000_000 + i,
    )


def turn_item(turn: SessionTurn) -> Any:
    """The turn as plain JSON builtins, lists and dicts (what the peers store)."""
    return msgspec.json.decode(encode(turn))


def turn_size(turn: SessionTurn) -> int:
    """Bytes of the turn's JSON."""
    return len(encode(turn))
