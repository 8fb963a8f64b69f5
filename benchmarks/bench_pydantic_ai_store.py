"""``ZidaneConversationStore``: what a save and a load cost as a conversation grows.

A conversation of ``--short`` and one of ``--long`` messages (TestModel runs
of a tool call and an answer, saved after each), in one SQLite file; then
rounds alternating between the two: one more run saved (``save``) and the
last 20 messages loaded (``load(limit=20)``). Printed: the median time of
each on each conversation, and the long / short ratio (1: the cost does not
grow with the conversation). The agent run itself is not timed.
Run: ``.venv/bin/python benchmarks/bench_pydantic_ai_store.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.conversation import Conversation
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import UsageLimits

from zidane_actors.integrations.pydantic_ai import ZidaneConversationStore

UNLIMITED = UsageLimits(request_limit=None)


def agent() -> Agent[None, str]:
    made: Agent[None, str] = Agent(TestModel(custom_output_text="noted " * 40), name="bench")

    @made.tool_plain
    def add(a: int, b: int) -> int:
        return a + b

    return made


async def grown(store: ZidaneConversationStore, cid: str, size: int) -> Conversation:
    """Conversation ``cid`` saved after each run until it holds ``size`` messages."""
    conversation = Conversation(conversation_id=cid)
    bench = agent()
    while len(conversation.messages) < size:
        result = await bench.run("hello " * 20, conversation=conversation, usage_limits=UNLIMITED)
        await store.save(result)
        conversation = result.conversation
    return conversation


async def main(rounds: int, short: int, long: int) -> None:
    bench = agent()
    with tempfile.TemporaryDirectory() as where:
        url = f"sqlite:{Path(where) / 'bench.db'}"
        async with ZidaneConversationStore(store=url) as store:
            conversations = {
                "short": await grown(store, "short", short),
                "long": await grown(store, "long", long),
            }
            saves: dict[str, list[float]] = {"short": [], "long": []}
            loads: dict[str, list[float]] = {"short": [], "long": []}
            for _ in range(rounds):
                for name in ("short", "long"):
                    result = await bench.run(
                        "again", conversation=conversations[name], usage_limits=UNLIMITED
                    )
                    began = time.perf_counter()
                    await store.save(result)
                    saves[name].append(time.perf_counter() - began)
                    conversations[name] = result.conversation
                    began = time.perf_counter()
                    await store.load(name, limit=20)
                    loads[name].append(time.perf_counter() - began)
    sizes = {name: len(c.messages) for name, c in conversations.items()}
    for what, times in (("save", saves), ("load(limit=20)", loads)):
        medians = {name: statistics.median(values) * 1000 for name, values in times.items()}
        print(
            f"{what}: {medians['short']:.2f} ms at {sizes['short']} messages,"
            f" {medians['long']:.2f} ms at {sizes['long']} messages;"
            f" long / short {medians['long'] / medians['short']:.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--short", type=int, default=20)
    parser.add_argument("--long", type=int, default=1000)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.short, args.long))
