"""ZidaneSaver against LangGraph's own SQLite and PostgreSQL savers, on the same graph runs.

Install: ``pip install -e '.[bench]'`` (langgraph, langgraph-checkpoint-sqlite,
langgraph-checkpoint-postgres, aiosqlite). PostgreSQL at 127.0.0.1:5432,
user ``postgres``, database ``test`` (each round creates and drops its own).

Run: ``PYTHONPATH=.:benchmarks .venv/bin/python benchmarks/bench_langgraph.py``
(``--rounds N``, ``--runs N``, ``--threads N``, ``--only sqlite|postgres``).

The graph is a ``StateGraph`` over ``MessagesState``: a fake chat model that
calls a tool, the tool, and the model's 400–1,200-character answer (each run
is five checkpoints). Per round and per pair (ours and the peer, in
alternating order):

* **one thread**: ``--runs`` runs on one thread with ``ainvoke``; time per
  checkpoint step, and the bytes the store holds afterwards (SQLite: the
  database file, its WAL included, once the saver is closed; PostgreSQL: the
  growth of ``pg_database_size`` over the freshly set-up database). Ours counts
  its search words too: its background indexer may not have reached the last
  turns, so the queue is indexed (a search does it) before the bytes are taken;
* **many threads**: ``--threads`` threads at once, 5 runs each (``asyncio.gather``).

Each saver's one-time setup (opening the store, making its tables) is done
before the timing starts, on both sides.

It prints each round's figures and the median of the round ratios (ours /
peer: below 1 is smaller or faster), with the middle half of the round ratios
from 4 rounds on.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import trio
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from psycopg import sql

from zidane_actors.integrations.langgraph import ZidaneSaver
from zidane_actors.model import SessionSearch
from zidane_actors.stores import open_postgres_store, open_sqlite_store

ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "clouds",
    "drift",
    "past",
    "hills",
]


def _text(rng: random.Random, low: int, high: int) -> str:
    size = rng.randint(low, high)
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(WORDS)
        out.append(word)
        length += len(word) + 1
    return " ".join(out)


def _script(seed: int) -> Iterator[AIMessage]:
    rng = random.Random(seed)
    for n in itertools.count():
        yield AIMessage(
            "",
            id=f"ai-{n}-call",
            tool_calls=[{"name": "weather", "args": {"city": f"City {n}"}, "id": f"call_{n}"}],
            usage_metadata={"input_tokens": 300 + n, "output_tokens": 20, "total_tokens": 320 + n},
        )
        yield AIMessage(
            _text(rng, 400, 1200),
            id=f"ai-{n}-answer",
            usage_metadata={"input_tokens": 400 + n, "output_tokens": 200, "total_tokens": 600 + n},
        )


def _graph(saver: Any, seed: int) -> Any:
    model = GenericFakeChatModel(messages=_script(seed))
    rng = random.Random(seed + 1)

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    def tools(state: MessagesState) -> dict[str, list[BaseMessage]]:
        last = state["messages"][-1]
        assert isinstance(last, AIMessage)
        return {
            "messages": [
                ToolMessage(_text(rng, 200, 600), tool_call_id=c["id"] or "", name=c["name"])
                for c in last.tool_calls
            ]
        }

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


async def _one_thread(saver: Any, runs: int) -> float:
    """Seconds per checkpoint step over ``runs`` runs on one thread."""
    graph = _graph(saver, 7)
    config = {"configurable": {"thread_id": "bench-thread"}}
    steps = 0
    start = time.perf_counter()
    for i in range(runs):
        question = {"messages": [HumanMessage(f"What is the weather in city {i}?")]}
        await graph.ainvoke(question, config)
        steps += 5
    return (time.perf_counter() - start) / steps


async def _many_threads(saver: Any, threads: int) -> float:
    """Seconds for ``threads`` threads at once, five runs each."""

    async def one(n: int) -> None:
        graph = _graph(saver, n)
        config = {"configurable": {"thread_id": f"many-{n}"}}
        for i in range(5):
            await graph.ainvoke({"messages": [HumanMessage(f"q{i} of thread {n}")]}, config)

    start = time.perf_counter()
    await asyncio.gather(*(one(n) for n in range(threads)))
    return time.perf_counter() - start


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


@asynccontextmanager
async def _database() -> AsyncIterator[str]:
    name = f"bench_lg_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def _db_size(name: str) -> int:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        row = conn.execute("SELECT pg_database_size(%s)", (name,)).fetchone()
        assert row is not None
        return int(row[0])


def _drain_search(kind: str, where: str) -> None:
    """Index what our store queued for search (a search indexes it first): its words are
    bytes it stores, whenever its indexer gets to them."""

    async def drain() -> None:
        opened = open_sqlite_store(where) if kind == "sqlite" else open_postgres_store(where)
        async with opened as store:
            await store.search_meta(SessionSearch(text="drain"))

    trio.run(drain)


async def _set_up(saver: Any) -> None:
    """Open the store and make its tables before timing (each saver's one-time setup)."""
    if isinstance(saver, ZidaneSaver):
        await saver.aget_tuple({"configurable": {"thread_id": "warm-up"}})
    else:
        await saver.setup()


async def _measure(kind: str, ours: bool, runs: int, threads: int) -> tuple[float, int, float]:
    """(seconds per step, bytes stored, seconds for many threads) of one variant."""
    gc.collect()
    if kind == "sqlite":
        folder = tempfile.mkdtemp(prefix="bench-lg-")
        path = os.path.join(folder, "one.db")
        if ours:
            async with ZidaneSaver(store=f"sqlite:{path}") as saver:
                await _set_up(saver)
                step = await _one_thread(saver, runs)
            await asyncio.to_thread(_drain_search, kind, path)
        else:
            async with AsyncSqliteSaver.from_conn_string(path) as saver:
                await _set_up(saver)
                step = await _one_thread(saver, runs)
        size = _dir_bytes(folder)
        many_path = os.path.join(folder, "many.db")
        if ours:
            async with ZidaneSaver(store=f"sqlite:{many_path}") as saver:
                await _set_up(saver)
                many = await _many_threads(saver, threads)
        else:
            async with AsyncSqliteSaver.from_conn_string(many_path) as saver:
                await _set_up(saver)
                many = await _many_threads(saver, threads)
        return step, size, many
    async with _database() as name:
        url = f"postgresql://postgres@127.0.0.1:5432/{name}"
        if ours:
            async with ZidaneSaver(store=url) as saver:
                await _set_up(saver)
                base = _db_size(name)
                step = await _one_thread(saver, runs)
                await asyncio.to_thread(_drain_search, kind, url)
                size = _db_size(name) - base
                many = await _many_threads(saver, threads)
        else:
            async with AsyncPostgresSaver.from_conn_string(url) as saver:
                await _set_up(saver)
                base = _db_size(name)
                step = await _one_thread(saver, runs)
                size = _db_size(name) - base
                many = await _many_threads(saver, threads)
        return step, size, many


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _shown(values: list[float]) -> str:
    """The median ratio, with the middle half of the rounds' ratios from 4 rounds on: the
    noise a single median hides (this machine's runs differ by about 10%)."""
    median = f"{_median(values):.2f}x"
    if len(values) < 4:
        return median
    low, _, high = statistics.quantiles(values, n=4)
    return f"{median} (middle half {low:.2f}-{high:.2f}x)"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=20)
    parser.add_argument("--only", choices=["sqlite", "postgres"])
    args = parser.parse_args()
    kinds = [args.only] if args.only else ["sqlite", "postgres"]
    peers = {"sqlite": "AsyncSqliteSaver", "postgres": "AsyncPostgresSaver"}
    print(f"{args.runs} runs on one thread (5 steps each); {args.threads} threads x 5 runs at once")
    for kind in kinds:
        ratios: dict[str, list[float]] = {"step": [], "bytes": [], "many": []}
        for round_ in range(args.rounds):
            order: list[bool] = [True, False] if round_ % 2 == 0 else [False, True]
            got: dict[bool, tuple[float, int, float]] = {}
            for ours in order:
                got[ours] = await _measure(kind, ours, args.runs, args.threads)
            (s1, b1, m1), (s2, b2, m2) = got[True], got[False]
            ratios["step"].append(s1 / s2)
            ratios["bytes"].append(b1 / b2)
            ratios["many"].append(m1 / m2)
            print(
                f"{kind} round {round_ + 1}: step {s1 * 1e3:.2f} ms vs {s2 * 1e3:.2f} ms,"
                f" bytes {b1:,} vs {b2:,}, many threads {m1:.2f} s vs {m2:.2f} s"
            )
        show = {key: _shown(values) for key, values in ratios.items()}
        print(
            f"== ZidaneSaver ({kind}) / {peers[kind]}, median of {args.rounds} round ratios:"
            f" time per step {show['step']}, bytes {show['bytes']},"
            f" many threads wall time {show['many']}"
        )


if __name__ == "__main__":
    asyncio.run(main())
