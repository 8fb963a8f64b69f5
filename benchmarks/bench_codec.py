"""Model codec benchmark: every figure is a ratio against a baseline measured in this run.

A 10k-turn ``SessionData`` (text, tool calls with nested input, tool results
with text and image parts, reasoning, usage and metadata) is encoded and
decoded with:

- ``zidane_actors.model.encode`` / ``decode(..., SessionData)`` — typed,
  validated Structs straight from bytes;
- stdlib ``json.dumps`` / ``json.loads`` of the same document as plain dicts
  (the baseline: no types, no validation);
- stdlib ``json`` plus building the Structs from the dicts (``model.convert``
  on the ``json.loads`` output, ``to_builtins`` before ``json.dumps``).

Run: ``.venv/bin/python benchmarks/bench_codec.py`` (about 20 seconds).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from zidane_actors import model
from zidane_actors.model import (
    ImageBlock,
    ReasoningBlock,
    SessionData,
    SessionRun,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    TurnUsage,
)

TURNS = 10_000
REPEATS = 5
TEXT = "A line of conversation, about as long as a short paragraph in a chat. " * 3


def build_session() -> SessionData:
    turns: list[SessionTurn] = []
    for i in range(TURNS):
        kind = i % 4
        if kind == 0:
            role, content = "user", (TextBlock(TEXT),)
        elif kind == 1:
            role = "assistant"
            content = (
                ReasoningBlock(
                    text="Thinking it over. " * 4, provider="anthropic", signature="s" * 64
                ),
                TextBlock(TEXT),
                ToolCallBlock(
                    id=f"toolu_{i}",
                    name="read_file",
                    input={"path": f"src/mod_{i}.py", "range": [1, 200], "opts": {"follow": True}},
                ),
            )
        elif kind == 2:
            role = "user"
            content = (
                ToolResultBlock(
                    call_id=f"toolu_{i - 1}",
                    output=(
                        TextBlock(TEXT * 2),
                        ImageBlock(media_type="image/png", data="iVBORw0K" * 16),
                    ),
                ),
            )
        else:
            role, content = "assistant", (TextBlock(TEXT),)
        turns.append(
            SessionTurn(
                id=f"turn-{i}",
                role=role,  # type: ignore[arg-type]
                content=content,
                created_at=1_700_000_000_000 + i,
                run_id=f"run-{i // 40}",
                usage=TurnUsage(input=1200 + i, output=300, cache_read=800)
                if role == "assistant"
                else None,
            )
        )
    runs = tuple(
        SessionRun(
            id=f"run-{r}", prompt="Do the thing", started_at=1_700_000_000_000, status="completed"
        )
        for r in range(TURNS // 40)
    )
    return SessionData(
        id="bench",
        created_at=1_700_000_000_000,
        updated_at=1_700_000_000_000 + TURNS,
        metadata={"title": "benchmark", "tags": ["a", "b"]},
        turns=tuple(turns),
        runs=runs,
    )


def best(fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    session = build_session()
    raw = model.encode(session)
    as_dicts = json.loads(raw)
    text = json.dumps(as_dicts)
    assert model.decode(raw, SessionData) == session
    assert model.convert(json.loads(text), SessionData) == session

    timings = {
        "stdlib json, dicts only": best(lambda: json.loads(json.dumps(as_dicts))),
        "stdlib json + convert": best(
            lambda: model.convert(json.loads(json.dumps(model.to_builtins(session))), SessionData)
        ),
        "model.encode/decode": best(lambda: model.decode(model.encode(session), SessionData)),
    }
    baseline = timings["stdlib json, dicts only"]
    print(f"{TURNS} turns, {len(raw) / 1e6:.1f} MB of JSON, best of {REPEATS} encode+decode rounds")
    for label, seconds in timings.items():
        print(f"  {label:<26} {seconds * 1e3:8.1f} ms   {baseline / seconds:5.2f}x vs stdlib dicts")
    ratio = timings["stdlib json + convert"] / timings["model.encode/decode"]
    print(f"  model codec is {ratio:.2f}x faster than stdlib json + building the same Structs")
    for label, fn in (
        ("encode only", lambda: model.encode(session)),
        ("decode only", lambda: model.decode(raw, SessionData)),
    ):
        std = (
            best(lambda: json.dumps(as_dicts))
            if label == "encode only"
            else best(lambda: json.loads(text))
        )
        own = best(fn)
        print(f"  {label:<26} {own * 1e3:8.1f} ms   {std / own:5.2f}x vs stdlib dicts")


if __name__ == "__main__":
    main()
