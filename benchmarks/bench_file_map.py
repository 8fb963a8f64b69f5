"""File-map store (directory adapter) benchmark: ratios against baselines measured in this run.

1. One durable ``append_turns`` (one turn) to a session of 10k turns vs to an
   empty one: bytes handed to ``write`` (``wchar`` of ``/proc/self/io``;
   target: <= 1.2x — an append writes what it appends and the small
   ``meta.json``, never the whole ``turns.jsonl``) and latency (median;
   appends alternate between the two sessions so a slow spell of the machine
   hits both; the map is whole strings in memory, so the store still copies
   the turns text once per append: about a millisecond at 10k turns).
2. The same appends vs their floor: writing the turn's line at the end of a
   plain file and ``fsync``-ing it (what any durable append costs), timed
   interleaved with them.
3. Opening and loading the 10k-turn session vs the bare ``msgspec`` decode of
   its turns file: CPU time (every thread), alternating rounds, the median of
   the rounds' ratios.

Run: ``.venv/bin/python benchmarks/bench_file_map.py`` (about fifteen seconds).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import msgspec
import trio

from zidane_actors.model import SessionData, SessionTurn, TextBlock, encode_str
from zidane_actors.stores import DirectoryFileMapAdapter, FileMapStore, create_file_map_store

TURNS = 10_000
APPENDS = 150
LOAD_ROUNDS = 7
TEXT = "A durable turn of a conversation, about one line of text long. " * 2
TARGET = 1.2


def turn(tag: str) -> SessionTurn:
    return SessionTurn(id=tag, role="user", content=(TextBlock(text=TEXT),), created_at=1)


async def fresh(directory: Path, turns: int) -> FileMapStore:
    store = create_file_map_store(DirectoryFileMapAdapter(directory))
    data = SessionData(
        id="s", created_at=1, updated_at=1, turns=tuple(turn(f"t{i}") for i in range(turns))
    )
    await store.save(data)
    return store


def written() -> int:
    """Bytes this process handed to write calls so far."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


async def timed_append(store: FileMapStore, tag: str) -> tuple[float, int]:
    """Latency and bytes written of one append."""
    before, start = written(), time.perf_counter()
    await store.append_turns("s", [turn(tag)])
    return time.perf_counter() - start, written() - before


def floor_append(fd: int, line: bytes) -> float:
    """Time to append one line to a plain file and fsync it: the floor of a durable append."""
    start = time.perf_counter()
    os.write(fd, line)
    os.fsync(fd)
    return time.perf_counter() - start


async def cpu_load(directory: Path) -> float:
    """CPU time (every thread) to open the store over ``directory`` and load its session."""
    start = time.process_time()
    reopened = create_file_map_store(DirectoryFileMapAdapter(directory))
    loaded = await reopened.load("s")
    spent = time.process_time() - start
    await reopened.aclose()
    assert loaded is not None and len(loaded.turns) == TURNS + APPENDS
    return spent


def cpu_decode(raw: bytes) -> float:
    """CPU time of the floor: msgspec decoding each line of the turns file as a turn."""
    start = time.process_time()
    decoder = msgspec.json.Decoder(SessionTurn)
    for line in raw.splitlines():
        decoder.decode(line)
    return time.process_time() - start


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        empty = await fresh(root / "empty", 0)
        full = await fresh(root / "full", TURNS)
        at0, at10k, floors = [], [], []
        line = (encode_str(turn("floor")) + "\n").encode()
        fd = os.open(root / "floor.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for i in range(APPENDS):  # the three interleaved: a slow spell hits them alike
                at0.append(await timed_append(empty, f"a{i}"))
                at10k.append(await timed_append(full, f"a{i}"))
                floors.append(floor_append(fd, line))
        finally:
            os.close(fd)
        m0, m10 = (statistics.median(t for t, _ in times) for times in (at0, at10k))
        w0, w10 = (statistics.median(w for _, w in times) for times in (at0, at10k))
        floor = statistics.median(floors)
        size = (root / "full" / "turns.jsonl").stat().st_size
        print(f"1. durable append of one turn: median of {APPENDS}, alternating")
        verdict = "met" if w10 / w0 <= TARGET else "MISSED"
        print(f"  bytes written at 0: {w0:.0f}   at {TURNS // 1000}k: {w10:.0f}", end="")
        print(f" (turns.jsonl: {size} bytes)")
        print(f"  ratio: {w10 / w0:.2f}x (target <= {TARGET}x: {verdict})")
        print(f"  latency at 0: {m0 * 1e3:.2f} ms   at 10k: {m10 * 1e3:.2f} ms", end="")
        print(f"   ratio: {m10 / m0:.2f}x")
        print("\n2. vs the floor (append the line to a plain file + fsync, interleaved)")
        print(f"  floor: {floor * 1e3:.2f} ms   ratio at 0 / floor: {m0 / floor:.2f}x")

        await empty.aclose()
        await full.aclose()  # one store at a time has a directory open
        raw = (root / "full" / "turns.jsonl").read_bytes()
        loads, bares, ratios = [], [], []
        for r in range(LOAD_ROUNDS):  # alternating which goes first; CPU time, all threads
            pair: dict[str, float] = {}
            for name in ("load", "bare") if r % 2 else ("bare", "load"):
                if name == "load":
                    pair[name] = await cpu_load(root / "full")
                else:
                    pair[name] = cpu_decode(raw)
            loads.append(pair["load"])
            bares.append(pair["bare"])
            ratios.append(pair["load"] / pair["bare"])
        load, bare = statistics.median(loads), statistics.median(bares)
        print(
            f"\n3. open + load of the {TURNS // 1000}k-turn session, CPU medians of {LOAD_ROUNDS}"
        )
        print(f"  load: {load * 1e3:.1f} ms   msgspec decode floor: {bare * 1e3:.1f} ms")
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
        print(f"  ratio load / floor: {statistics.median(ratios):.2f}x (rounds {spread})")


if __name__ == "__main__":
    trio.run(main)
