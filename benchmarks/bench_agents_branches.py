"""Branch operations benchmark: ``ZidaneSession`` against openai-agents' ``AdvancedSQLiteSession``.

Both sessions, each on a SQLite file of its own, hold the same conversation
(``TURNS`` user turns, each a question and an answer). Each round, in
alternating order, times on each: ``create_branch_from_turn`` from the middle
turn (a new name per round), ``switch_to_branch`` back to the branch it left,
``list_branches`` and ``get_conversation_turns``. Branches accumulate over the
rounds on both. Medians of the rounds are printed per operation, with the
ratio zidane / AdvancedSQLiteSession. Run:
``.venv/bin/python benchmarks/bench_agents_branches.py`` (about half a minute).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agents.extensions.memory import AdvancedSQLiteSession

from zidane_actors.integrations.openai_agents import ZidaneSession

TURNS, ROUNDS, CHUNK = 1_000, 7, 100
OPS = ("branch", "switch", "list", "turns")


def exchange(n: int) -> list[dict[str, Any]]:
    answer = f"Answer {n}: " + "lorem ipsum dolor sit amet " * 8
    return [
        {"role": "user", "content": f"Question {n} about the weather in city number {n}?"},
        {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": answer, "annotations": []}],
        },
    ]


async def fill(session: Any) -> None:
    for start in range(0, TURNS, CHUNK):
        items = [i for n in range(start, min(start + CHUNK, TURNS)) for i in exchange(n)]
        await session.add_items(items)


async def timed(fn: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await fn()
    return (time.perf_counter() - start) * 1000


async def one_round(session: Any, r: int, left: str) -> dict[str, float]:
    name = f"b{r}"
    return {
        "branch": await timed(lambda: session.create_branch_from_turn(TURNS // 2, name)),
        "switch": await timed(lambda: session.switch_to_branch(left)),
        "list": await timed(session.list_branches),
        "turns": await timed(session.get_conversation_turns),
    }


async def main(directory: Path) -> None:
    peer = AdvancedSQLiteSession(
        session_id="bench", db_path=directory / "advanced.db", create_tables=True
    )
    zidane = ZidaneSession("bench", store=f"sqlite:{directory / 'zidane.db'}")
    sessions = {"advanced": peer, "zidane": zidane}
    for session in sessions.values():
        await fill(session)
    times: dict[str, dict[str, list[float]]] = {k: {op: [] for op in OPS} for k in sessions}
    for r in range(ROUNDS):
        order = list(sessions) if r % 2 == 0 else list(reversed(sessions))
        for kind in order:
            for op, ms in (await one_round(sessions[kind], r, "main")).items():
                times[kind][op].append(ms)
    peer.close()
    await zidane.aclose()
    print(f"{TURNS} user turns, {ROUNDS} rounds, medians (ms):")
    print(f"{'operation':<10} {'Advanced':>10} {'zidane':>10} {'ratio':>7}")
    for op in OPS:
        a = statistics.median(times["advanced"][op])
        z = statistics.median(times["zidane"][op])
        print(f"{op:<10} {a:>10.1f} {z:>10.1f} {z / a:>7.2f}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(tmp)))
