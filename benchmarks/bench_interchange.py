"""What reading documents as written costs on ``load``: ratios against msgspec measured in this run.

A 10k-turn session of realistic turns (``bench_codec``'s) is loaded:

1. decoded by ``model.decode`` (the codec every store uses: msgspec's decoder
   plus the paths for unknown fields and lone surrogates) against msgspec's
   own decoder of the same type (the floor: what the codec did before);
2. the same through a SQLite store's ``load`` against a bare msgspec decode
   of the rows it reads;
3. opened as a ``Session`` against ``store.load`` alone, and the first read
   of its ``turns`` (what freezing the memory it hands out costs, once);
4. for scale, the slow paths: the same document with an unknown field in
   every turn, and with a lone surrogate in every turn.

Run: ``.venv/bin/python benchmarks/bench_interchange.py`` (about a minute).
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import trio
from bench_codec import build_session

from zidane_actors.actors._session import Session
from zidane_actors.model import SessionData, SessionTurn, decode, encode
from zidane_actors.stores import open_sqlite_store

ROUNDS = 9


def cpu(fn: Callable[[], Any], rounds: int = ROUNDS) -> tuple[float, float]:
    """Median and spread (max - min) of ``fn``'s CPU time over ``rounds``."""
    times = []
    for _ in range(rounds):
        gc.collect()
        gc.disable()  # a collection landing in one round is not the code's cost
        try:
            start = time.process_time()
            fn()
            times.append(time.process_time() - start)
        finally:
            gc.enable()
    return statistics.median(times), max(times) - min(times)


def alternate(a: Callable[[], Any], b: Callable[[], Any]) -> tuple[float, float, float]:
    """Median CPU of ``a`` and ``b`` measured in alternating rounds, and the ratio's spread."""
    ta, tb, ratios = [], [], []
    for _ in range(ROUNDS):
        x, _ = cpu(a, 1)
        y, _ = cpu(b, 1)
        ta.append(x)
        tb.append(y)
        ratios.append(x / y)
    return statistics.median(ta), statistics.median(tb), max(ratios) - min(ratios)


def show(label: str, ours: float, floor: float, spread: float) -> None:
    print(
        f"  {label:<44} {ours * 1e3:8.1f} ms vs {floor * 1e3:8.1f} ms"
        f"   {ours / floor:5.3f}x (ratio spread {spread:.3f})"
    )


def main() -> None:
    session = build_session()
    raw = encode(session)
    floor_decoder = msgspec.json.Decoder(SessionData)
    print(f"{len(session.turns)} turns, {len(raw) / 1e6:.1f} MB of JSON, CPU medians")

    ours, floor, spread = alternate(
        lambda: decode(raw, SessionData), lambda: floor_decoder.decode(raw)
    )
    show("1. model.decode vs msgspec decoder", ours, floor, spread)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"

        async def fill() -> None:
            async with open_sqlite_store(path, durability="off") as store:
                await store.save(session)

        trio.run(fill)
        rows = [msgspec.json.encode(turn) for turn in session.turns]  # the turns' JSON
        turn_floor = msgspec.json.Decoder(SessionTurn)

        def load() -> SessionData | None:
            async def go() -> SessionData | None:
                async with open_sqlite_store(path, durability="off") as store:
                    return await store.load(session.id)

            return trio.run(go)

        def bare() -> None:
            trio.run(trio.sleep, 0)  # the same run set-up
            [turn_floor.decode(body) for body in rows]

        ours, floor, spread = alternate(load, bare)
        show("2. SQLite store.load vs msgspec on its turns", ours, floor, spread)

        loaded = load()
        assert loaded is not None

        def open_session() -> None:
            Session(loaded, store=None, runner=None)  # type: ignore[arg-type]

        def first_read() -> None:
            _ = Session(loaded, store=None, runner=None).turns  # type: ignore[arg-type]

        opened, _ = cpu(open_session)
        read, _ = cpu(first_read)
        load_s, _ = cpu(load)
        print(
            f"  3. Session over the loaded data: {opened * 1e3:.2f} ms ({opened / load_s:.3f}x of"
            f" store.load, {load_s * 1e3:.1f} ms); its first `turns` (memory frozen once):"
            f" {read * 1e3:.1f} ms"
        )

    doc = msgspec.json.decode(raw)
    for turn in doc["turns"]:
        turn["parentTurnId"] = "t0"
    unknown = msgspec.json.encode(doc)
    ours, floor, spread = alternate(
        lambda: decode(unknown, SessionData), lambda: floor_decoder.decode(raw)
    )
    show("4a. unknown field in every turn (slow path)", ours, floor, spread)
    surrogate = raw.replace(b'"role":"user"', b'"role":"user","metadata":{"t":"\\ud83d"}')
    ours, floor, spread = alternate(
        lambda: decode(surrogate, SessionData), lambda: floor_decoder.decode(raw)
    )
    show("4b. lone surrogate in a quarter of the turns", ours, floor, spread)


if __name__ == "__main__":
    main()
