"""The integrations against what their users would use instead, measured in one run.

1. openai-agents: ``ZidaneSession`` against the SDK's own ``SQLiteSession``
   with the items a real ``Runner`` writes (a scripted model: reasoning, a
   tool call with a 1-2 KB result, a handoff, 1-3 KB answers), replayed in
   the Runner's own ``add_items`` batches into one session each, rounds
   alternating: ``add_items`` wall and CPU time (the process's, and the
   calling asyncio thread's), ``get_items`` of 120 items,
   and stored bytes per item (the JSON each keeps, and the database file).
   ``add_items`` is measured bare and as the Runner calls it (with its run
   context, so runs are recorded too).
2. pydantic-ai: the bytes of the turns ``append_messages`` stores against
   pydantic-ai's own JSON of the same messages (``ModelMessagesTypeAdapter``),
   and the CPU time of making those turns against writing that JSON.

Ratios are ours / theirs (below 1: we are faster or smaller), median over
rounds with the spread in brackets. Run:
``.venv/bin/python benchmarks/bench_integrations.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agents import Agent, RunContextWrapper, Runner, function_tool, set_tracing_disabled
from agents.memory import SQLiteSession
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.usage import Usage
from openai.types.responses import ResponseReasoningItem
from openai.types.responses.response_reasoning_item import Summary

from zidane_actors.integrations import _shared
from zidane_actors.integrations.openai_agents import ZidaneSession

set_tracing_disabled(True)

WORDS = (
    "the",
    "store",
    "keeps",
    "every",
    "turn",
    "of",
    "a",
    "session",
    "durable",
    "exact",
    "agent",
)
SESSION = "5b0e6c1e-8d7a-4f43-9a55-3c1f2d7e9b10"  # a session id as users make them


def text(rng: random.Random, size: int) -> str:
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < size:
        out.append(rng.choice(WORDS))
    return " ".join(out)


# -- 1. openai-agents -------------------------------------------------------------------


class Recorder:
    """A Session that keeps the Runner's ``add_items`` batches, to replay them."""

    session_id = "recorder"
    session_settings = None

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.batches: list[list[Any]] = []

    async def get_items(self, limit: int | None = None) -> list[Any]:
        return list(self.items)

    async def add_items(self, items: list[Any]) -> None:
        self.batches.append(json.loads(json.dumps(items)))
        self.items.extend(items)

    async def pop_item(self) -> Any:
        return self.items.pop() if self.items else None

    async def clear_session(self) -> None:
        self.items.clear()


def usage(rng: random.Random) -> Usage:
    n_in, n_out = rng.randint(1000, 9000), rng.randint(50, 900)
    return Usage(requests=1, input_tokens=n_in, output_tokens=n_out, total_tokens=n_in + n_out)


def runner_batches(runs: int, seed: int = 24) -> list[list[Any]]:
    """The ``add_items`` batches of ``runs`` Runner calls of a triage → expert conversation."""
    rng = random.Random(seed)

    @function_tool
    def search(query: str) -> str:
        """Search the notes."""
        return text(rng, rng.randint(1000, 2000))

    def reasoning(i: int) -> ResponseReasoningItem:
        summary = [Summary(text=text(rng, 300), type="summary_text")]
        return ResponseReasoningItem(id=f"rs_{i}", type="reasoning", summary=summary)

    recorder = Recorder()

    async def main() -> None:
        for r in range(runs):
            expert = Agent(
                name="expert",
                tools=[search],
                model=ScriptedModel(
                    [
                        ModelStep(
                            output=[
                                reasoning(r),
                                function_call("search", {"query": text(rng, 80)}, call_id=f"c{r}"),
                            ],
                            usage=usage(rng),
                        ),
                        ModelStep(
                            output=[assistant_message(text(rng, rng.randint(1000, 3000)))],
                            usage=usage(rng),
                        ),
                    ]
                ),
            )
            triage = Agent(
                name="triage",
                handoffs=[expert],
                model=ScriptedModel(
                    [
                        ModelStep(
                            output=[function_call("transfer_to_expert", {}, call_id=f"h{r}")],
                            usage=usage(rng),
                        )
                    ]
                ),
            )
            await Runner.run(triage, text(rng, rng.randint(500, 1500)), session=recorder)

    asyncio.run(main())
    return recorder.batches


async def timed(fn: Callable[[], Awaitable[object]]) -> tuple[float, float, float]:
    """Wall time, the process's CPU time and the calling (asyncio) thread's CPU time."""
    wall, cpu, caller = time.perf_counter(), time.process_time(), time.thread_time()
    await fn()
    return (
        time.perf_counter() - wall,
        time.process_time() - cpu,
        time.thread_time() - caller,
    )


def sqlite_payload(db: Path) -> tuple[int, int]:
    """The items' JSON, and whole rows (every column, the rowid as 8 bytes)."""
    with sqlite3.connect(db) as conn:
        json_bytes, rows = conn.execute(
            "SELECT SUM(LENGTH(message_data)), SUM(LENGTH(message_data) + LENGTH(session_id)"
            " + LENGTH(created_at) + 8) FROM agent_messages"
        ).fetchone()
    return int(json_bytes), int(rows)


def zidane_payload(db: Path) -> tuple[int, int, int]:
    """The turns' JSON, whole turn rows, and the runs' JSON."""
    with sqlite3.connect(db) as conn:
        json_bytes, rows = conn.execute(
            "SELECT SUM(LENGTH(body)), SUM(LENGTH(body) + LENGTH(session_id) + LENGTH(id)"
            " + LENGTH(role) + 8) FROM turns"
        ).fetchone()
        (runs,) = conn.execute("SELECT COALESCE(SUM(LENGTH(body)), 0) FROM runs").fetchone()
    return int(json_bytes), int(rows), int(runs)


def file_size(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
    return os.path.getsize(db)


async def agents_round(
    tmp: Path, r: int, batches: list[list[Any]], wrapped: bool
) -> dict[str, float]:
    out: dict[str, float] = {}
    theirs_db, ours_db = tmp / f"agents-{r}-{wrapped}.db", tmp / f"zidane-{r}-{wrapped}.db"
    theirs = SQLiteSession(SESSION, theirs_db)
    ours = ZidaneSession(SESSION, store=f"sqlite:{ours_db}")
    await ours.get_items()  # the store is open before the clock starts
    context = RunContextWrapper(context=None)

    async def add_theirs() -> None:
        for batch in batches:
            await theirs.add_items(batch)

    async def add_ours() -> None:
        for batch in batches:
            if wrapped:
                await ours.add_items(batch, wrapper=context)
            else:
                await ours.add_items(batch)

    order = [("theirs", add_theirs), ("ours", add_ours)]
    for name, fn in order if r % 2 else reversed(order):
        out[f"add_wall_{name}"], out[f"add_cpu_{name}"], out[f"add_caller_{name}"] = await timed(fn)

    async def get(session: Any) -> float:
        samples = []
        for _ in range(30):
            start = time.perf_counter()
            items = await session.get_items(120)
            samples.append(time.perf_counter() - start)
        assert len(items) == 120
        return statistics.median(samples)

    mine, peer = await ours.get_items(), await theirs.get_items()
    assert json.dumps(mine) == json.dumps(peer), "items differ"
    for name, _ in order if r % 2 else reversed(order):
        out[f"get_{name}"] = await get(ours if name == "ours" else theirs)
    theirs.close()
    await ours.aclose()
    out["bytes_theirs"], out["rows_theirs"] = sqlite_payload(theirs_db)
    out["bytes_ours"], out["rows_ours"], out["run_bytes"] = zidane_payload(ours_db)
    empty_theirs, empty_ours = await empty_files(Path(tempfile.mkdtemp(dir=tmp)))
    out["file_theirs"] = file_size(theirs_db) - empty_theirs
    out["file_ours"] = file_size(ours_db) - empty_ours
    return out


async def empty_files(tmp: Path) -> tuple[int, int]:
    """The size of each database with its schema and an empty session (the fixed part)."""
    theirs = SQLiteSession(SESSION, tmp / "a.db")
    await theirs.add_items([{"content": "x", "role": "user"}])
    await theirs.clear_session()
    theirs.close()
    ours = ZidaneSession(SESSION, store=f"sqlite:{tmp / 'z.db'}")
    await ours.add_items([{"content": "x", "role": "user"}])
    await ours.clear_session()
    await ours.aclose()
    return file_size(tmp / "a.db"), file_size(tmp / "z.db")


def ratio_line(
    label: str, rounds: list[dict[str, float]], ours: str, theirs: str, *, ms: bool = False
) -> str:
    """The median of the rounds' ratios and their spread; with ``ms``, each side's median time."""
    ratios = sorted(r[ours] / r[theirs] for r in rounds)
    med = statistics.median(ratios)
    line = f"   {label:<44} {med:5.2f}x  [{ratios[0]:.2f}-{ratios[-1]:.2f}]"
    if ms:
        mine, peer = (statistics.median(r[key] for r in rounds) * 1e3 for key in (ours, theirs))
        line += f"  ours {mine:.2f} ms, theirs {peer:.2f} ms"
    return line


def openai_agents(rounds: int) -> None:
    batches = runner_batches(18)
    items = sum(len(b) for b in batches)
    print(f"1. openai-agents: {items} Runner items in {len(batches)} add_items calls, one session")
    print("   (ZidaneSession / SQLiteSession; below 1: ours is faster or smaller;")
    print(
        f"   times: medians over rounds, add_items for all {len(batches)} calls,"
        " get_items per call)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        bare = [asyncio.run(agents_round(Path(tmp), r, batches, False)) for r in range(rounds)]
        wrapped = [asyncio.run(agents_round(Path(tmp), r, batches, True)) for r in range(rounds)]
    _shared.close_all()
    print(ratio_line("add_items, wall", bare, "add_wall_ours", "add_wall_theirs", ms=True))
    print(ratio_line("add_items, CPU", bare, "add_cpu_ours", "add_cpu_theirs", ms=True))
    print(
        ratio_line(
            "add_items, CPU of the asyncio thread",
            bare,
            "add_caller_ours",
            "add_caller_theirs",
            ms=True,
        )
    )
    print(
        ratio_line(
            "add_items with the Runner's context, wall",
            wrapped,
            "add_wall_ours",
            "add_wall_theirs",
            ms=True,
        )
    )
    print(ratio_line("get_items(120)", bare, "get_ours", "get_theirs", ms=True))
    print(ratio_line("stored JSON bytes per item", bare, "bytes_ours", "bytes_theirs"))
    print(ratio_line("stored row bytes per item (every column)", bare, "rows_ours", "rows_theirs"))
    print(
        ratio_line(
            "database file growth (VACUUM, schema excluded)", bare, "file_ours", "file_theirs"
        )
    )
    last = bare[-1]
    print(
        f"   per item: ours {last['bytes_ours'] / items:,.0f} B, SQLiteSession"
        f" {last['bytes_theirs'] / items:,.0f} B; the runs the Runner's context adds:"
        f" {wrapped[-1]['run_bytes']:,.0f} B in all"
    )


# -- 2. pydantic-ai ---------------------------------------------------------------------


def pydantic_ai_bytes(rounds_of_cpu: int) -> None:
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai import ModelRetry
    from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from zidane_actors.integrations.pydantic_ai import append_messages_sync, message_history
    from zidane_actors.portal import start_host

    rng = random.Random(7)

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        step = sum(isinstance(m, ModelResponse) for m in messages) % 3
        if step == 0:
            return ModelResponse(parts=[ToolCallPart("search", {"query": text(rng, 80)})])
        if step == 1:
            return ModelResponse(parts=[ToolCallPart("search", {"query": "again"})])
        return ModelResponse(parts=[TextPart(text(rng, rng.randint(1000, 3000)))])

    agent = PydanticAgent(FunctionModel(model), system_prompt="You answer from the notes.")
    tries: dict[str, int] = {}

    @agent.tool_plain
    def search(query: str) -> str:
        """Search the notes."""
        tries[query] = tries.get(query, 0) + 1
        if query == "again" and tries[query] % 2:
            raise ModelRetry("no notes match 'again'; search for something precise")
        return text(rng, rng.randint(1000, 2000))

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "p.db"
        with start_host(f"sqlite:{db}") as host:
            session = host.create_session(id="p")
            messages: list[Any] = []
            for _ in range(10):
                result = agent.run_sync(text(rng, 800), message_history=message_history(session))
                append_messages_sync(session, result.new_messages())
                messages.extend(result.new_messages())
        ours, _, runs = zidane_payload(db)
    theirs = len(ModelMessagesTypeAdapter.dump_json(messages))
    print(f"2. pydantic-ai: {len(messages)} messages of 10 agent runs (tools, a ModelRetry)")
    print(f"   {'stored turn bytes / ModelMessagesTypeAdapter JSON':<44} {ours / theirs:5.2f}x")
    print(f"   ours {ours:,} B, pydantic-ai {theirs:,} B; runs add {runs:,} B")
    rounds = [conversion_cpu(messages, r % 2 == 1) for r in range(rounds_of_cpu)]
    print(ratio_line("messages_to_turns / dump_json, CPU", rounds, "ours", "theirs", ms=True))


def conversion_cpu(messages: list[Any], flip: bool) -> dict[str, float]:
    """CPU time of the turns of ``messages`` against pydantic-ai's JSON of them (20 times
    each; ``flip``: theirs first)."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    from zidane_actors.integrations.pydantic_ai import messages_to_turns

    out: dict[str, float] = {}
    work = {
        "ours": lambda: messages_to_turns(messages),
        "theirs": lambda: ModelMessagesTypeAdapter.dump_json(messages),
    }
    for name, fn in reversed(work.items()) if flip else work.items():
        start = time.process_time()
        for _ in range(20):
            fn()
        out[name] = time.process_time() - start
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    openai_agents(args.rounds)
    pydantic_ai_bytes(args.rounds)


if __name__ == "__main__":
    main()
