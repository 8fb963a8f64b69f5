"""google-adk session services at 100 concurrent sessions: ours against ADK's own, in one run.

Each session plays what ADK's ``Runner`` asks of its session service for two
invocations: ``get_session``, then four ``append_event`` calls (the user's
message, the model's function call with token usage, the function response,
the model's answer with an ``output_key`` state delta, and on the first
invocation a ``user:`` delta too). Event texts are realistic (1-4 KB, seeded,
see ``_realistic.py``) and made before the clock starts, as a Runner hands
over events its model made. All sessions run at once in one asyncio loop.

Variants, their order rotating from round to round (fresh database files every
round; a full garbage collection before each, so no variant's timed run pays
for the objects another one left):

- ``ZidaneSessionService(store="sqlite:…")``: a durable commit per write
  (WAL, ``synchronous=FULL``).
- ADK's ``DatabaseSessionService("sqlite+aiosqlite:///…")``: its defaults.
- ADK's ``InMemorySessionService``: no storage at all, the ceiling.

Every call that raises is an error (counted, the session goes on with a
fresh ``get_session``); after each run every session is read back and each
missing or altered event counts as an error too. Figures are medians over
rounds: appends per second (``get_session`` time included), process CPU
time per append, and each variant's ratio to ADK's database service and to
its in-memory service; the verdict is the median of each round's own ratio
of ours to the database service (both measured back to back).

``--scoped-processes`` measures shared scope state across processes instead:
1, 2 and 4 worker processes (order rotating by round), each with its own
``ZidaneSessionService`` over one store and a session of its own of one
user, append ``--events`` events each, every event on a fresh
``get_session`` and setting ``user:`` and ``app:`` keys of its own and one
key all processes share. Setup is untimed: the parent sends every worker one
instant to start at. It prints events/s in total per process count and the
median of each round's ratio of 4 (and 2) processes to 1, on SQLite (a fresh
file per run) and PostgreSQL (one fresh database at ``ZIDANE_TEST_POSTGRES``
or the local ``test`` server, an app per run), and checks that the user's
and app's state hold every process's last value of each key.

``--long-session N`` measures one long session instead: N invocations of
ours on SQLite, each the user's message and an answer with a state delta (a
run record and a state checkpoint each), reporting the mean time of the
first and the last 50 appends and the CPU per append, so what an append
costs as the session's runs grow shows.

Run: ``.venv/bin/python benchmarks/bench_adk.py [--sessions 100] [--rounds 5]``,
``... --scoped-processes [--events 40] [--rounds 5]`` or ``... --long-session 600``
(needs the ``bench`` extra: google-adk, sqlalchemy[asyncio], aiosqlite).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from _common import run_workers
from _realistic import _text  # the seeded word soup the other benchmarks write
from google.adk.errors import StaleSessionError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions import BaseSessionService, InMemorySessionService
from google.adk.sessions.database_session_service import DatabaseSessionService
from google.genai import types

from zidane_actors.integrations.adk import ZidaneSessionService

INVOCATIONS = 2
TARGET = 20.0  # x DatabaseSessionService at 100 concurrent sessions, with 0 errors


@attrs.frozen
class Run:
    appends_per_s: float
    cpu_us: float  # process CPU time (all threads) per append, get_session included
    errors: int


def invocation(session: int, n: int) -> list[Event]:
    """One invocation's four events, realistic sizes, seeded by session and invocation."""
    rng = random.Random(session * 1_000_003 + n)
    call_id = f"adk-call-{session}-{n}"
    args = {
        "query": _text(rng, 60),
        "paths": [f"src/module_{rng.randint(0, 99)}.py" for _ in range(8)],
        "options": {"regex": False, "max_results": 50, "context_lines": 3},
    }
    answer = _text(rng, rng.randint(600, 1400))
    delta: dict[str, Any] = {"last_answer": answer[:200]}
    if n == 0:
        delta["user:last_topic"] = args["query"]
    common = {"invocation_id": f"inv-{session}-{n}"}
    return [
        Event(
            author="user",
            content=types.Content(
                role="user", parts=[types.Part(text=_text(rng, rng.randint(1100, 3400)))]
            ),
            **common,
        ),
        Event(
            author="coder",
            content=types.Content(
                role="model",
                parts=[
                    types.Part(text=_text(rng, rng.randint(300, 700))),
                    types.Part(
                        function_call=types.FunctionCall(id=call_id, name="search_files", args=args)
                    ),
                ],
            ),
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=rng.randint(1000, 9000),
                candidates_token_count=rng.randint(50, 900),
                total_token_count=10_000,
            ),
            model_version="gemini-2.5-flash",
            **common,
        ),
        Event(
            author="coder",
            content=types.Content(
                role="user",
                parts=[
                    types.Part(
                        function_response=types.FunctionResponse(
                            id=call_id,
                            name="search_files",
                            response={"result": _text(rng, rng.randint(1100, 3600))},
                        )
                    )
                ],
            ),
            **common,
        ),
        Event(
            author="coder",
            content=types.Content(role="model", parts=[types.Part(text=answer)]),
            actions=EventActions(state_delta=delta),
            **common,
        ),
    ]


async def play(service: BaseSessionService, sessions: int) -> Run:
    ids = [f"s{s}" for s in range(sessions)]
    for sid in ids:
        await service.create_session(app_name="bench", user_id="u", session_id=sid)
    scripts = [[invocation(s, n) for n in range(INVOCATIONS)] for s in range(sessions)]
    # The events a Runner would hand over, made before the clock starts (making them is the
    # agent's work, not the session service's); ``scripts`` keeps the originals to check.
    sent = [[[e.model_copy(deep=True) for e in events] for events in script] for script in scripts]
    errors = 0

    async def one(s: int) -> None:
        nonlocal errors
        for events in sent[s]:
            session = None
            for event in events:
                try:
                    if session is None:
                        session = await service.get_session(
                            app_name="bench", user_id="u", session_id=ids[s]
                        )
                        assert session is not None
                    await service.append_event(session, event)
                except Exception:
                    errors += 1
                    session = None

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(s) for s in range(sessions)))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    for s in range(sessions):
        got = await service.get_session(app_name="bench", user_id="u", session_id=ids[s])
        want = [e for events in scripts[s] for e in events]
        stored = got.events if got is not None else []
        errors += sum(
            1 for a, b in zip(stored, want, strict=False) if a.content != b.content
        ) + abs(len(stored) - len(want))
    appends = sessions * INVOCATIONS * 4
    return Run(appends / wall, cpu / appends * 1e6, errors)


async def close(service: BaseSessionService) -> None:
    if isinstance(service, ZidaneSessionService):
        await service.aclose()
    elif isinstance(service, DatabaseSessionService):
        await service.close()


VARIANTS: dict[str, Callable[[Path], BaseSessionService]] = {
    "zidane (sqlite)": lambda d: ZidaneSessionService(store=f"sqlite:{d / 'zidane.db'}"),
    "adk DatabaseSessionService": lambda d: DatabaseSessionService(
        f"sqlite+aiosqlite:///{d / 'adk.db'}"
    ),
    "adk InMemorySessionService": lambda d: InMemorySessionService(),
}


async def one_round(sessions: int, first: int) -> dict[str, Run]:
    runs: dict[str, Run] = {}
    names = list(VARIANTS)
    for name in names[first:] + names[:first]:
        make = VARIANTS[name]
        gc.collect()
        with tempfile.TemporaryDirectory() as tmp:
            service = make(Path(tmp))
            try:
                runs[name] = await play(service, sessions)
            finally:
                await close(service)
    return runs


async def long_session(invocations: int) -> None:
    """One session of ``invocations`` invocations (the user's event, an answer changing
    state); prints the mean wall time of the first and last 50 appends, and CPU per append."""
    events = [invocation(0, n) for n in range(invocations)]
    with tempfile.TemporaryDirectory() as tmp:
        service = ZidaneSessionService(store=f"sqlite:{Path(tmp) / 'zidane.db'}")
        try:
            await service.create_session(app_name="bench", user_id="u", session_id="long")
            times: list[float] = []
            cpu = time.process_time()
            for user, *_, answer in events:
                session = await service.get_session(
                    app_name="bench", user_id="u", session_id="long"
                )
                assert session is not None
                for event in (user, answer):
                    started = time.perf_counter()
                    await service.append_event(session, event)
                    times.append(time.perf_counter() - started)
            cpu = time.process_time() - cpu
            got = await service.get_session(app_name="bench", user_id="u", session_id="long")
            assert got is not None and len(got.events) == 2 * invocations, "events lost"
        finally:
            await service.aclose()
    first, last = statistics.mean(times[:50]) * 1e3, statistics.mean(times[-50:]) * 1e3
    print(
        f"one session, {invocations} invocations x 2 events (state delta each):"
        f" first 50 appends {first:.2f} ms, last 50 {last:.2f} ms each;"
        f" {cpu / len(times) * 1e6:.0f} µs CPU per append (get_session included)"
    )


PROCESSES = (1, 2, 4)
SCOPED_TARGET = 1.0  # 4 processes' events/s x 1 process's, on PostgreSQL


def scoped_delta(index: int, i: int) -> dict[str, Any]:
    """Process ``index``'s ``i``-th event's state delta: keys of its own, one key shared."""
    return {f"user:p{index}": i, f"app:p{index}": i, "user:last": [index, i]}


async def scoped_worker(url: str, app: str, index: int, events: int) -> None:
    """One process: its session, then ``events`` appends from the instant read on stdin."""
    loop = asyncio.get_running_loop()
    async with ZidaneSessionService(store=url) as service:
        names = {"app_name": app, "user_id": "u", "session_id": f"p{index}"}
        await service.create_session(**names)
        print("ready", flush=True)
        start_at = float(await loop.run_in_executor(None, sys.stdin.readline))
        await asyncio.sleep(max(0.0, start_at - time.time()))
        begin, stale = time.time(), 0
        for i in range(events):
            event = Event(
                invocation_id=f"p{index}-{i}",
                author="user",
                content=types.Content(role="user", parts=[types.Part(text=f"p{index}-{i}")]),
                actions=EventActions(state_delta=scoped_delta(index, i)),
            )
            while True:
                session = await service.get_session(**names)
                assert session is not None
                try:
                    await service.append_event(session, event)
                except StaleSessionError:
                    stale += 1
                    continue
                break
        end = time.time()
    print(json.dumps({"begin": begin, "end": end, "stale": stale}), flush=True)


def scoped_run(url: str, processes: int, events: int) -> float:
    """Events/s of ``processes`` workers appending at once to sessions of one user."""
    app = f"scoped_{uuid.uuid4().hex[:8]}"
    argvs = [["--scoped-worker", url, app, str(i), str(events)] for i in range(processes)]
    start_at, reports = run_workers(__file__, argvs, timeout=900)
    span = max(r["end"] for r in reports) - start_at
    asyncio.run(check_scopes(url, app, processes, events))
    return processes * events / span


async def check_scopes(url: str, app: str, processes: int, events: int) -> None:
    """Every process's own keys hold its last value; the shared key one process's last."""
    async with ZidaneSessionService(store=url) as service:
        user = await service.get_user_state(app_name=app, user_id="u")
        session = await service.get_session(app_name=app, user_id="u", session_id="p0")
        assert session is not None
    last = events - 1
    want = {f"p{p}": last for p in range(processes)}
    assert {k: v for k, v in user.items() if k != "last"} == want, "user: state lost a write"
    assert user["last"] in [[p, last] for p in range(processes)], "user:last is not a last write"
    app_state = {k[4:]: v for k, v in session.state.items() if k.startswith("app:")}
    assert app_state == want, "app: state lost a write"


def scoped_processes(rounds: int, events: int) -> None:
    """1, 2 and 4 processes on SQLite and PostgreSQL: events/s and the ratios to 1."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict

    dsn = (
        os.environ.get("ZIDANE_TEST_POSTGRES")
        or "host=127.0.0.1 port=5432 user=postgres dbname=test"
    )
    database = f"bench_adk_{uuid.uuid4().hex[:12]}"
    parts = conninfo_to_dict(dsn)
    user = f"{parts['user']}@" if parts.get("user") else ""
    pg_url = f"postgresql://{user}{parts.get('host') or '127.0.0.1'}:{parts.get('port') or 5432}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    print(f"{events} events per process, each on a fresh get_session, user:/app: deltas")
    rates: dict[str, dict[int, list[float]]] = {"sqlite": {}, "postgres": {}}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(rounds):
                order = PROCESSES[r % 3 :] + PROCESSES[: r % 3]
                for kind in ("postgres", "sqlite") if r % 2 else ("sqlite", "postgres"):
                    for n in order:
                        where = Path(tmp) / f"{kind}-{r}-{n}.db"
                        url = f"sqlite:{where}" if kind == "sqlite" else f"{pg_url}/{database}"
                        rates[kind].setdefault(n, []).append(scoped_run(url, n, events))
                print(
                    f"round {r + 1}: "
                    + "; ".join(
                        f"{kind} "
                        + ", ".join(f"{n}p {rates[kind][n][-1]:.0f}/s" for n in PROCESSES)
                        for kind in rates
                    )
                )
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(database)))
    print(f"\nmedian of {rounds} rounds, events/s in total (ratio to 1 process: median of rounds)")
    for kind, by_n in rates.items():
        ratios = {
            n: statistics.median(a / b for a, b in zip(by_n[n], by_n[1], strict=True))
            for n in PROCESSES
        }
        print(
            f"  {kind:9}"
            + "".join(
                f"  {n}p {statistics.median(by_n[n]):6.1f}/s ({ratios[n]:.2f}x)" for n in PROCESSES
            )
        )
    pg = statistics.median(
        a / b for a, b in zip(rates["postgres"][4], rates["postgres"][1], strict=True)
    )
    print(f"\npostgres 4 processes / 1 process: {pg:.2f}x (target >= {SCOPED_TARGET:.1f}x)")
    if pg < SCOPED_TARGET:
        sys.exit(1)


def main() -> None:
    if sys.argv[1:2] == ["--scoped-worker"]:
        url, app, index, events = sys.argv[2:6]
        asyncio.run(scoped_worker(url, app, int(index), int(events)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--long-session", type=int, default=0, metavar="N")
    parser.add_argument("--scoped-processes", action="store_true")
    parser.add_argument("--events", type=int, default=40, help="per process (--scoped-processes)")
    args = parser.parse_args()
    gc.freeze()  # google-adk's imports track ~200k objects: keep them out of every collection
    if args.scoped_processes:
        scoped_processes(args.rounds, args.events)
        return
    if args.long_session:
        asyncio.run(long_session(args.long_session))
        return
    by_variant: dict[str, list[Run]] = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        runs = asyncio.run(one_round(args.sessions, r % len(VARIANTS)))
        for name, run in runs.items():
            by_variant[name].append(run)
        print(
            f"round {r + 1}: "
            + ", ".join(
                f"{n} {x.appends_per_s:,.0f}/s ({x.errors} errors)" for n, x in runs.items()
            )
        )
    rate = {n: statistics.median(x.appends_per_s for x in rs) for n, rs in by_variant.items()}
    cpu = {n: statistics.median(x.cpu_us for x in rs) for n, rs in by_variant.items()}
    errors = {n: sum(x.errors for x in rs) for n, rs in by_variant.items()}
    database = rate["adk DatabaseSessionService"]
    memory = rate["adk InMemorySessionService"]
    print(
        f"\n{args.sessions} concurrent sessions, {INVOCATIONS} invocations x 4 events each,"
        f" median of {args.rounds} rounds:"
    )
    for name in VARIANTS:
        print(
            f"  {name:28} {rate[name]:>9,.0f} appends/s  {rate[name] / database:7.2f}x database"
            f"  {rate[name] / memory:6.2f}x in-memory  {cpu[name]:6.0f} µs CPU/append"
            f"  errors {errors[name]}"
        )
    paired = sorted(
        z.appends_per_s / d.appends_per_s
        for z, d in zip(
            by_variant["zidane (sqlite)"], by_variant["adk DatabaseSessionService"], strict=True
        )
    )
    ratio = statistics.median(paired)
    ok = ratio >= TARGET and errors["zidane (sqlite)"] == 0
    print(
        f"\nzidane vs DatabaseSessionService, median of the rounds' ratios: {ratio:.1f}x"
        f" (rounds {paired[0]:.1f}x-{paired[-1]:.1f}x; target >= {TARGET:.0f}x, 0 errors)"
    )
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
