"""One host running a seeded random program on shared sessions, recording its history.

Usage: ``python tests/_history_worker.py URL PROCESS SEED STEPS OUT START_AT SESSIONS SKIP``

Opens the store at ``URL`` (``sqlite:PATH`` or ``postgresql://…``) and a session
host on it, waits until the wall clock reaches ``START_AT`` (so every process
starts together), then runs ``STEPS`` steps drawn by ``random.Random(SEED)``,
each on one of the ``SESSIONS`` ids (comma-separated, created beforehand by the
parent), leaving out the kinds of step ``SKIP`` names (comma-separated, ``-``: none):

- ``load``: ``load_session``, recording the host's view with store reads and
  ``rev`` taken just before and after;
- ``append``: ``append_turns`` of one new turn, then the host's view;
- ``read``: a read of the store;
- ``grow`` / ``pop``: ``set_turns`` of the view plus a new turn / minus its last
  turn, then ``save`` (a write computed from the view);
- ``meta``: ``set_meta`` then ``save`` (the turns unchanged);
- ``zpop``: ``ZidaneSession.pop_item`` (the openai-agents integration, its own
  host in this process);
- ``claim``: ``claim_run`` on the ``claims`` session, and when claimed an append
  and ``update_status("idle")`` (the release);
- ``hold``: release the run this process holds, or claim one on the session
  (a shared one) and hold it across the next steps, which leave it alone;
- ``evict``: the host forgets its handle (actor evicted, handle dropped), so the
  next ``load`` reads the store afresh.

Every turn's id (and text) is ``PROCESS-N``, unique across processes. After
every step the store is read, so each acknowledged turn is checked step by
step. Events go to ``OUT``, one JSON object a line (``tests/_history.py``).
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from _history import Event, Recorder, load_events, pair

from zidane_actors.actors import Session, SessionHost, open_session_host
from zidane_actors.errors import ConflictError, StoreError, ValidationError
from zidane_actors.model import SessionData, SessionTurn, TextBlock
from zidane_actors.stores import FullSessionStore
from zidane_actors.stores._url import open_store_url

CLAIMS = "claims"
SESSIONS = ("s0", "s1", "s2")
ROOT = Path(__file__).resolve().parent.parent

STEPS: dict[str, int] = {
    "load": 18,
    "append": 24,
    "read": 8,
    "grow": 8,
    "pop": 8,
    "meta": 8,
    "zpop": 8,
    "claim": 6,
    "hold": 4,
    "evict": 8,
}


def turn(element: str) -> SessionTurn:
    return SessionTurn(
        id=element,
        role="user",
        content=(TextBlock(text=element),),
        created_at=time.time_ns() // 1_000_000,
    )


def ids(turns: Any) -> list[str]:
    return [t.id for t in turns]


def text_of(item: Any) -> str | None:
    """The first text in an openai-agents item (the element a popped item stood for)."""
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        if isinstance(item.get("text"), str):
            return str(item["text"])
        content = item.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            for part in content:
                found = text_of(part)
                if found is not None:
                    return found
    return None


def outcome_of(exc: BaseException) -> str:
    """``fail`` when the write was definitely not applied, else ``info``."""
    return "fail" if isinstance(exc, ConflictError | ValidationError) else "info"


class Program:
    def __init__(
        self,
        url: str,
        host: SessionHost,
        store: FullSessionStore,
        recorder: Recorder,
        rng: random.Random,
    ) -> None:
        self.url = url
        self.host = host
        self.store = store
        self.rec = recorder
        self.rng = rng
        self.handles: dict[str, Session] = {}
        self.zidane: dict[str, Any] = {}
        self.counter = 0
        self.meta = 0
        self.holding: str | None = None

    def element(self) -> str:
        self.counter += 1
        return f"{self.rec.process}-{self.counter}"

    async def store_read(self, sid: str) -> list[str]:
        i = self.rec.invoke("read", sid, source="store")
        turns = ids(await self.store.get_turns(sid))
        self.rec.ok(i, turns)
        return turns

    async def rev(self, sid: str) -> int | None:
        meta = await self.store.get_meta(sid)
        return None if meta is None else meta.rev

    async def load(self, sid: str) -> Session:
        rev_before = await self.rev(sid)
        store_before = ids(await self.store.get_turns(sid))
        i = self.rec.invoke("read", sid, source="load")
        session = await self.host.load_session(sid)
        assert session is not None, sid
        view = ids(session.turns)
        store_after = ids(await self.store.get_turns(sid))
        rev_after = await self.rev(sid)
        self.rec.ok(
            i,
            view,
            rev_before=rev_before,
            store_before=store_before,
            rev_after=rev_after,
            store_after=store_after,
        )
        self.handles[sid] = session
        return session

    async def handle(self, sid: str) -> Session:
        return self.handles.get(sid) or await self.load(sid)

    async def write(self, f: str, sid: str, value: Any, action: Any) -> int | None:
        """Record ``action``; its invocation time when it was applied, else ``None``."""
        i = self.rec.invoke(f, sid, value)
        try:
            await action()
        except (StoreError, ValidationError) as exc:
            self.rec.complete(i, outcome_of(exc), error=f"{type(exc).__name__}: {exc}")
            return None
        self.rec.ok(i)
        return self.rec.invoked[i]

    async def step(self, name: str, sid: str) -> None:
        if name == "load":
            await self.load(sid)
        elif name == "append":
            session = await self.handle(sid)
            x = self.element()
            began = await self.write("append", sid, [x], lambda: session.append_turns([turn(x)]))
            if began is not None:
                # The view the append left: a state of the store since the append began.
                i = self.rec.invoke("read", sid, source="append", at=began)
                self.rec.ok(i, ids(session.turns))
        elif name == "read":
            pass  # the store read every step ends with
        elif name in ("grow", "pop"):
            session = await self.handle(sid)
            view = list(session.turns)
            if name == "pop" and not view:
                return
            new = [*view, turn(self.element())] if name == "grow" else view[:-1]

            async def rewrite() -> None:
                await session.set_turns(new)
                await session.save()

            await self.write("rewrite", sid, {"from": ids(view), "to": ids(new)}, rewrite)
        elif name == "meta":
            session = await self.handle(sid)
            self.meta += 1
            key, value = self.rec.process, self.meta

            async def save_meta() -> None:
                await session.set_meta(key, value)
                await session.save()

            await self.write("save", sid, {"from": ids(session.turns), "meta": value}, save_meta)
        elif name == "zpop":
            await self.zpop(sid)
        elif name == "claim":
            await self.claim()
        elif name == "hold":
            await self.hold(sid)
        elif name == "evict":
            session = self.handles.pop(sid, None)
            if session is not None:
                self.host._evict(session)
                del session
                gc.collect()

    async def zpop(self, sid: str) -> None:
        from zidane_actors.integrations.openai_agents import ZidaneSession

        zs = self.zidane.get(sid)
        if zs is None:
            zs = self.zidane[sid] = await trio.to_thread.run_sync(
                lambda: ZidaneSession(sid, store=self.url)
            )
        i = self.rec.invoke("pop", sid)
        try:
            item = await trio.to_thread.run_sync(asyncio.run, zs.pop_item())
        except (StoreError, ValidationError) as exc:
            self.rec.complete(i, outcome_of(exc), error=f"{type(exc).__name__}: {exc}")
            return
        self.rec.ok(i, None if item is None else text_of(item))

    async def claim(self) -> None:
        i = self.rec.invoke("claim", CLAIMS)
        claim = await self.store.claim_run(CLAIMS, stale_at=0)
        self.rec.ok(i, claim.claimed)
        if not claim.claimed:
            return
        x = self.element()
        i = self.rec.invoke("append", CLAIMS, [x])
        await self.store.append_turns(CLAIMS, [turn(x)])
        self.rec.ok(i)
        i = self.rec.invoke("release", CLAIMS)
        await self.store.update_status(CLAIMS, "idle")
        self.rec.ok(i)
        await self.store_read(CLAIMS)

    async def hold(self, sid: str) -> None:
        """Release the claim this process holds, or claim ``sid`` and hold it for a while."""
        if self.holding is not None:
            held, self.holding = self.holding, None
            i = self.rec.invoke("release", held)
            await self.store.update_status(held, "idle")
            self.rec.ok(i)
            return
        i = self.rec.invoke("claim", sid)
        claim = await self.store.claim_run(sid, stale_at=0)
        self.rec.ok(i, claim.claimed)
        if claim.claimed:
            self.holding = sid

    async def run(self, steps: int, sessions: list[str], skip: list[str]) -> None:
        names = [name for name in STEPS if name not in skip]
        weights = [STEPS[name] for name in names]
        for _ in range(steps):
            name = self.rng.choices(names, weights)[0]
            # The session this process holds a run on is left to the other hosts.
            sid = self.rng.choice([s for s in sessions if s != self.holding] or sessions)
            await self.step(name, sid)
            await self.store_read(sid)
        if self.holding is not None:  # a claim ends with its process: say so in the history
            await self.hold(self.holding)

    def close(self) -> None:
        for zs in self.zidane.values():
            zs.close()


async def main(
    url: str,
    process: str,
    seed: int,
    steps: int,
    out: str,
    start_at: float,
    sessions: list[str],
    skip: list[str],
) -> None:
    async with open_store_url(url) as raw:
        store: Any = raw
        async with open_session_host(raw) as host:
            with open(out, "w") as stream:  # noqa: ASYNC230 (one small local file)
                program = Program(url, host, store, Recorder(process, stream), random.Random(seed))
                await trio.sleep(max(0.0, start_at - time.time()))
                try:
                    await program.run(steps, sessions, skip)
                finally:
                    await trio.to_thread.run_sync(program.close)


@dataclass(frozen=True)
class HistoryRun:
    events: list[Event]
    turns: dict[str, list[str]]
    """Each session's turn ids once every worker stopped."""
    metadata: dict[str, dict[str, Any]]
    """Each session's metadata then."""

    def meta_rollbacks(self) -> list[str]:
        """Metadata values older than a process's last acknowledged ``meta`` save.

        Each process writes the key named after it with growing values; the store
        must end with its last acknowledged value or a later one it tried.
        """
        last: dict[tuple[str, str], int] = {}
        for op in pair(self.events):
            if op.f == "save" and op.type == "ok":
                key = (op.session, op.process)
                last[key] = max(last.get(key, 0), op.value["meta"])
        found = []
        for (sid, process), value in sorted(last.items()):
            stored = self.metadata.get(sid, {}).get(process)
            if not isinstance(stored, int) or stored < value:
                found.append(f"{sid}: {process} acknowledged {value}, the store holds {stored}")
        return found


def run_processes(
    url: str,
    out_dir: Path,
    *,
    processes: int,
    steps: int,
    seed: int,
    sessions: Sequence[str] = SESSIONS,
    skip: Sequence[str] = (),
    timeout: float = 600.0,
) -> HistoryRun:
    """Run ``processes`` workers on fresh sessions of ``url``; their events and the final state.

    Worker ``k`` runs the program of seed ``seed * 1000 + k``, without the kinds of
    step named in ``skip``. Raises when a worker fails.
    """
    every = [*sessions, CLAIMS]

    async def prepare() -> None:
        async with open_store_url(url) as store:
            for sid in every:
                await store.save(SessionData(id=sid, created_at=1, updated_at=1))

    trio.run(prepare)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    start_at = time.time() + 2.0  # every worker imports and opens its store first
    outs = [out_dir / f"p{k}.jsonl" for k in range(processes)]
    children = [
        subprocess.Popen(
            [
                *(sys.executable, __file__, url, f"p{k}", str(seed * 1000 + k), str(steps)),
                *(str(outs[k]), str(start_at), ",".join(sessions), ",".join(skip) or "-"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(processes)
    ]
    try:
        results = [child.communicate(timeout=timeout) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    for k, (child, (_, err)) in enumerate(zip(children, results, strict=True)):
        if child.returncode != 0:
            raise RuntimeError(f"worker p{k} exited with {child.returncode}:\n{err[-4000:]}")

    async def final() -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
        async with open_store_url(url) as store:
            loaded = {sid: await store.load(sid) for sid in every}
        turns = {sid: ids(data.turns) if data else [] for sid, data in loaded.items()}
        meta = {sid: dict(data.metadata or {}) if data else {} for sid, data in loaded.items()}
        return turns, meta

    turns, meta = trio.run(final)
    return HistoryRun(load_events(outs), turns, meta)


if __name__ == "__main__":
    url, process, seed, steps, out, start_at, sessions, skip = sys.argv[1:]
    trio.run(
        main,
        url,
        process,
        int(seed),
        int(steps),
        out,
        float(start_at),
        sessions.split(","),
        [] if skip == "-" else skip.split(","),
    )
