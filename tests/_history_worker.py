"""One host running a seeded random program on shared sessions, recording its history.

Usage: ``python tests/_history_worker.py URL PROCESS SEED STEPS OUT START_AT SESSIONS SKIP
OPTIONS``

Opens the store at ``URL`` (``sqlite:PATH`` or ``postgresql://…``) and a session
host on it, waits until the wall clock reaches ``START_AT`` (so every process
starts together), then runs ``STEPS`` steps drawn by ``random.Random(SEED)``,
each on one of the ``SESSIONS`` ids (comma-separated, created beforehand by the
parent), leaving out the kinds of step ``SKIP`` names (comma-separated, ``-``: none).
``OPTIONS`` (comma-separated, ``-``: none):

- ``listen``: a PostgreSQL store is opened with ``listen=True``, so the host
  refreshes the sessions it holds when another writer changes them;
- ``refresh``: another task of the host loads sessions (so refreshes them) at
  random moments and on request (recorded as ``refresh``, which the checker
  leaves alone), and the steps below marked (refresh) are drawn too;
- ``faults``: store failures (the server restarting, backends terminated) are
  part of the run: a failed read is recorded as such, the memory of a handle
  whose write had an unknown outcome is made the store's state again (a no-op
  ``mutate_history``), and the worker goes on.

The steps:

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
  next ``load`` reads the store afresh;
- ``late_grow`` / ``late_pop`` (refresh): ``grow`` / ``pop`` computed from a view
  taken before awaits: the view, the store's ``rev`` read right after it (the
  view reflects that rev or an older one), then a ``trio.sleep(0)``, a store
  read, or a ``load_session`` of the same id by the other task (after a short
  pause, or none), and only then ``set_turns`` and ``save``; a refused write is
  followed by a read of the handle's view (it must be the store's again);
- ``agent`` (refresh): ``set_agent_id`` to a new value then ``save``, sometimes
  after a ``patch_meta`` through the store or an ``add_artifact`` of the session
  (each moves the store's rev);
- ``patch`` (refresh): ``patch_meta`` of this process's ``PROCESS.patch`` key
  through the store (another writer, to the host).

Every turn's id (and text) is ``PROCESS-N``, unique across processes, and so
is every agent id set. After every step the store is read (turns, ``rev``,
agent id and metadata in one snapshot), so each acknowledged change is
checked step by step. Events go to ``OUT``, one JSON object a line
(``tests/_history.py``).
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import trio
import trio.lowlevel
from _history import Anomaly, Event, Recorder, check, load_events, pair

from zidane_actors.actors import Session, SessionHost, open_session_host
from zidane_actors.errors import ActorClosed, ActorError, ConflictError, StoreError, ValidationError
from zidane_actors.model import SessionArtifactInput, SessionData, SessionTurn, TextBlock
from zidane_actors.stores import FullSessionStore, SessionStore, VersionedStore
from zidane_actors.stores._url import open_store_url

CLAIMS = "claims"
SESSIONS = ("s0", "s1", "s2")
ROOT = Path(__file__).resolve().parent.parent
OPTIONS = ("listen", "refresh", "faults")

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
REFRESH_STEPS: dict[str, int] = {
    "late_grow": 10,
    "late_pop": 6,
    "agent": 10,
    "patch": 4,
}
"""Drawn too with the ``refresh`` option (so the other programs stay as they were)."""


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


def error_of(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class Skipped(Exception):
    """A step's session could not be loaded (a store failure in a run with faults)."""


class Program:
    def __init__(
        self,
        url: str,
        host: SessionHost,
        store: FullSessionStore,
        recorder: Recorder,
        rng: random.Random,
        options: Sequence[str] = (),
    ) -> None:
        self.url = url
        self.host = host
        self.store = store
        self.rec = recorder
        self.rng = rng
        self.refresh = "refresh" in options
        # What a step may meet and go on after: store failures only in a run with faults.
        self.tolerated: tuple[type[Exception], ...] = (
            (StoreError, ActorError) if "faults" in options else ()
        )
        self.refused: tuple[type[Exception], ...] = (StoreError, ValidationError, *self.tolerated)
        """What a recorded write may raise (recorded as its outcome)."""
        self.handles: dict[str, Session] = {}
        self.zidane: dict[str, Any] = {}
        self.counter = 0
        self.meta = 0
        self.patches = 0
        self.holding: str | None = None
        self.unsettled: set[str] = set()
        """Handles to settle once the step ends (a write of unknown outcome went through them)."""
        self.requests: trio.MemorySendChannel[tuple[str, trio.Event]] | None = None

    def element(self) -> str:
        self.counter += 1
        return f"{self.rec.process}-{self.counter}"

    async def store_read(self, sid: str, **extra: Any) -> list[str] | None:
        """The store's turns, ``rev``, agent id and metadata, read in one snapshot and recorded."""
        i = self.rec.invoke("read", sid, source="store", **extra)
        try:
            loaded = await cast(VersionedStore, self.store).load_versioned(sid)
        except self.tolerated as exc:
            self.rec.fail(i, error=error_of(exc))
            return None
        assert loaded is not None, sid
        data, rev = loaded
        turns = ids(data.turns)
        self.rec.ok(i, turns, rev=rev, agent_id=data.agent_id, metadata=dict(data.metadata))
        return turns

    async def rev(self, sid: str) -> int | None:
        try:
            meta = await self.store.get_meta(sid)
        except self.tolerated:
            return None
        return None if meta is None else meta.rev

    async def load(self, sid: str, **extra: Any) -> Session | None:
        """``load_session``, recorded with store reads just before and after (``None``: failed)."""
        rev_before = await self.rev(sid)
        try:
            store_before: list[str] | None = ids(await self.store.get_turns(sid))
        except self.tolerated:
            store_before = None
        i = self.rec.invoke("read", sid, source="load", **extra)
        try:
            session = await self.host.load_session(sid)
        except self.tolerated as exc:
            self.rec.fail(i, error=error_of(exc))
            return None
        assert session is not None, sid
        view = ids(session.turns)
        try:
            store_after: list[str] | None = ids(await self.store.get_turns(sid))
        except self.tolerated:
            store_after = None
        rev_after = await self.rev(sid)
        bracket = store_before is not None and store_after is not None
        self.rec.ok(
            i,
            view,
            rev_before=rev_before if bracket else None,
            store_before=store_before,
            rev_after=rev_after if bracket else None,
            store_after=store_after,
        )
        self.handles[sid] = session
        return session

    async def handle(self, sid: str) -> Session:
        """The handle this process holds, else a load; raises :class:`Skipped` when that failed."""
        session = self.handles.get(sid) or await self.load(sid)
        if session is None:
            raise Skipped(sid)
        return session

    async def write(
        self, f: str, sid: str, value: Any, action: Callable[[], Awaitable[Any]]
    ) -> tuple[str, int]:
        """Record ``action``: how it completed (``ok``, ``fail``, ``info``) and when it began."""
        i = self.rec.invoke(f, sid, value)
        began = self.rec.invoked[i]
        try:
            await action()
        except self.refused as exc:
            outcome = outcome_of(exc)
            self.rec.complete(i, outcome, error=error_of(exc))
            if outcome == "info" and self.tolerated:
                self.unsettled.add(sid)  # its memory may hold what the store lacks
            return outcome, began
        self.rec.ok(i)
        return "ok", began

    async def step(self, name: str, sid: str) -> None:
        if name == "load":
            await self.load(sid)
        elif name == "append":
            session = await self.handle(sid)
            x = self.element()
            outcome, began = await self.write(
                "append", sid, [x], lambda: session.append_turns([turn(x)])
            )
            if outcome == "ok":
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
            self.evict(sid)
        elif name in ("late_grow", "late_pop"):
            await self.late_rewrite(sid, grow=name == "late_grow")
        elif name == "agent":
            await self.agent(sid)
        elif name == "patch":
            await self.patch(sid)

    def evict(self, sid: str) -> None:
        session = self.handles.pop(sid, None)
        if session is not None:
            self.host._evict(session)
            del session
            gc.collect()

    async def settle(self, sid: str) -> None:
        """After a write of unknown outcome: the handle's memory becomes the store's state.

        A failed save leaves its changes in memory (to be saved again), and a
        load of the handle answers them, so a no-op ``mutate_history`` drops
        them (retried while the store is away; dropping the handle would not
        do: a refresh under way revives it in the host).
        """
        session = self.handles.get(sid)
        for _ in range(100):
            if session is None:
                return
            try:
                await session.mutate_history(lambda history: None)
                return
            except self.tolerated:
                await trio.sleep(0.2)
        raise RuntimeError(f"the store stayed away for 20 s: handle {sid!r} is left unsettled")

    async def late_rewrite(self, sid: str, *, grow: bool) -> None:
        """``set_turns`` + ``save`` of a view taken before awaits (its ``rev`` read right after)."""
        how = self.rng.choice(("sleep", "read", "elsewhere", "pause"))
        pause = self.rng.choice((0.002, 0.01, 0.03))
        session = await self.handle(sid)
        view = list(session.turns)
        try:
            # Memory reflects this rev or an older one.
            rev = await cast(VersionedStore, self.store).get_rev(sid)
        except self.tolerated:
            rev = None
        rev_at = self.rec.now()
        if not grow and not view:
            return
        if how == "sleep":
            await trio.lowlevel.checkpoint()  # trio.sleep(0)
        elif how == "read":
            await self.store_read(sid)
        else:
            if how == "pause":
                await trio.sleep(pause)  # other hosts write meanwhile
            await self.load_elsewhere(sid)
        new = [*view, turn(self.element())] if grow else view[:-1]
        value: dict[str, Any] = {"from": ids(view), "to": ids(new)}
        if rev is not None:
            value.update(rev=rev, rev_at=rev_at)

        async def rewrite() -> None:
            await session.set_turns(new)
            await session.save()

        outcome, began = await self.write("rewrite", sid, value, rewrite)
        if outcome == "fail":
            # Refused: memory is the store's state again, not the refused view.
            i = self.rec.invoke("read", sid, source="refused", at=began)
            self.rec.ok(i, ids(session.turns))

    async def load_elsewhere(self, sid: str) -> None:
        """Have the other task of this host load ``sid`` (refreshing the handle) and wait for it."""
        assert self.requests is not None
        done = trio.Event()
        await self.requests.send((sid, done))
        await done.wait()

    async def elsewhere(
        self,
        requests: trio.MemoryReceiveChannel[tuple[str, trio.Event]],
        rng: random.Random,
        sessions: list[str],
    ) -> None:
        """Another task of the host: ``load_session`` on request (recorded), else at random.

        Each only loads (refreshing a held handle). It never reads the turns: the
        view the main task computes from is the main task's (and a view taken
        here could hold what the main task has not saved yet: no state of the store).
        """
        while True:
            request = None
            with trio.move_on_after(rng.uniform(0.002, 0.02)):
                request = await requests.receive()
            if request is None:
                # An ``evict`` step may close the handle's actor under this load.
                with suppress(ActorClosed, *self.tolerated):
                    await self.host.load_session(rng.choice(sessions))
                continue
            sid, done = request
            i = self.rec.invoke("refresh", sid, task="elsewhere")
            try:
                await self.host.load_session(sid)
            except self.tolerated as exc:
                self.rec.fail(i, error=error_of(exc))
            else:
                self.rec.ok(i)
            finally:
                done.set()

    async def agent(self, sid: str) -> None:
        """``set_agent_id`` of a new value then ``save``, at times after the store moved."""
        before = self.rng.choice(("none", "patch", "artifact"))
        session = await self.handle(sid)
        if before == "patch":
            await self.patch(sid)
        elif before == "artifact":
            x = self.element()
            note = SessionArtifactInput(kind="note", uri=f"note:{x}", label=x)
            await self.write("artifact", sid, {"uri": note.uri}, lambda: session.add_artifact(note))
        value = self.element()

        async def relabel() -> None:
            await session.set_agent_id(value)
            await session.save()

        await self.write("agent", sid, {"agent": value}, relabel)

    async def patch(self, sid: str) -> None:
        self.patches += 1
        key, value = f"{self.rec.process}.patch", self.patches
        await self.write(
            "patch",
            sid,
            {"key": key, "meta": value},
            lambda: self.store.patch_meta(sid, {key: value}),
        )

    async def zpop(self, sid: str) -> None:
        from zidane_actors.integrations.openai_agents import ZidaneSession

        zs = self.zidane.get(sid)
        if zs is None:
            try:
                zs = self.zidane[sid] = await trio.to_thread.run_sync(
                    lambda: ZidaneSession(sid, store=self.url)
                )
            except self.tolerated:
                return
        i = self.rec.invoke("pop", sid)
        try:
            item = await trio.to_thread.run_sync(asyncio.run, zs.pop_item())
        except (StoreError, ValidationError) as exc:
            self.rec.complete(i, outcome_of(exc), error=error_of(exc))
            return
        self.rec.ok(i, None if item is None else text_of(item))

    async def claim(self) -> None:
        i = self.rec.invoke("claim", CLAIMS)
        try:
            claim = await self.store.claim_run(CLAIMS, stale_at=0)
        except self.tolerated as exc:
            self.rec.info(i, error=error_of(exc))
            await self.adopt(CLAIMS)
            return
        self.rec.ok(i, claim.claimed)
        if not claim.claimed:
            return
        x = self.element()
        i = self.rec.invoke("append", CLAIMS, [x])
        try:
            await self.store.append_turns(CLAIMS, [turn(x)])
        except self.tolerated as exc:
            self.rec.complete(i, outcome_of(exc), error=error_of(exc))
        else:
            self.rec.ok(i)
        await self.release(CLAIMS)
        await self.store_read(CLAIMS)

    async def release(self, sid: str) -> None:
        i = self.rec.invoke("release", sid)
        try:
            await self.store.update_status(sid, "idle")
        except self.tolerated as exc:
            self.rec.info(i, error=error_of(exc))
            await self.adopt(sid)
            return
        self.rec.ok(i)

    async def adopt(self, sid: str) -> None:
        """After a claim or release of unknown outcome: a run the store says is ours is released.

        The stored owner names this process: the run is ours (recorded as a
        claim seen now) until a release succeeds; else nothing is ours.
        """
        for _ in range(3):
            try:
                data = await self.store.load(sid)
            except self.tolerated:
                await trio.sleep(0.2)
                continue
            owner = None if data is None or data.status != "running" else data.run_owner
            if owner is None or owner.pid != os.getpid():
                return
            i = self.rec.invoke("claim", sid, adopted=True)
            self.rec.ok(i, True)
            i = self.rec.invoke("release", sid)
            try:
                await self.store.update_status(sid, "idle")
            except self.tolerated as exc:
                self.rec.info(i, error=error_of(exc))
                await trio.sleep(0.2)
                continue
            self.rec.ok(i)
            return

    async def hold(self, sid: str) -> None:
        """Release the claim this process holds, or claim ``sid`` and hold it for a while."""
        if self.holding is not None:
            held, self.holding = self.holding, None
            await self.release(held)
            return
        i = self.rec.invoke("claim", sid)
        try:
            claim = await self.store.claim_run(sid, stale_at=0)
        except self.tolerated as exc:
            self.rec.info(i, error=error_of(exc))
            await self.adopt(sid)
            return
        self.rec.ok(i, claim.claimed)
        if claim.claimed:
            self.holding = sid

    async def run(self, steps: int, sessions: list[str], skip: list[str]) -> None:
        drawn = {**STEPS, **(REFRESH_STEPS if self.refresh else {})}
        names = [name for name in drawn if name not in skip]
        weights = [drawn[name] for name in names]
        async with trio.open_nursery() as nursery:
            if self.refresh:
                send, receive = trio.open_memory_channel[tuple[str, trio.Event]](0)
                self.requests = send
                other = random.Random(self.rng.getrandbits(64))
                nursery.start_soon(self.elsewhere, receive, other, sessions)
            for _ in range(steps):
                name = self.rng.choices(names, weights)[0]
                # The session this process holds a run on is left to the other hosts.
                sid = self.rng.choice([s for s in sessions if s != self.holding] or sessions)
                with suppress(Skipped):
                    await self.step(name, sid)
                for unsettled in sorted(self.unsettled):
                    await self.settle(unsettled)
                self.unsettled.clear()
                await self.store_read(sid, after=name)  # the step named, for the reader
            if self.holding is not None:  # a claim ends with its process: say so in the history
                await self.hold(self.holding)
            nursery.cancel_scope.cancel()

    def close(self) -> None:
        for zs in self.zidane.values():
            zs.close()


@asynccontextmanager
async def open_history_store(url: str, *, listen: bool = False) -> AsyncIterator[SessionStore]:
    """The store at ``url``; a PostgreSQL one listening for changes with ``listen``."""
    if listen and url.startswith(("postgres://", "postgresql://")):
        from zidane_actors.stores import open_postgres_store

        async with open_postgres_store(url, listen=True) as store:
            yield store
    else:
        async with open_store_url(url) as store:
            yield store


async def main(
    url: str,
    process: str,
    seed: int,
    steps: int,
    out: str,
    start_at: float,
    sessions: list[str],
    skip: list[str],
    options: list[str],
) -> None:
    async with open_history_store(url, listen="listen" in options) as raw:
        store: Any = raw
        async with open_session_host(raw) as host:
            with open(out, "w") as stream:  # noqa: ASYNC230 (one small local file)
                rng = random.Random(seed)
                program = Program(url, host, store, Recorder(process, stream), rng, options)
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
    agents: dict[str, str | None]
    """Each session's agent id then."""

    def anomalies(self) -> list[Anomaly]:
        """What :func:`_history.check` finds, the final turns and agent ids included."""
        fields = {sid: {"agent_id": agent} for sid, agent in self.agents.items()}
        return check(self.events, self.turns, final_fields=fields)

    def meta_rollbacks(self) -> list[str]:
        """Metadata values older than a process's last acknowledged ``meta`` save or ``patch``.

        Each process writes the key named after it (``save``) and its
        ``PROCESS.patch`` key (``patch``) with growing values; the store must
        end with its last acknowledged value of each or a later one it tried.
        """
        last: dict[tuple[str, str], int] = {}
        for op in pair(self.events):
            if op.f in ("save", "patch") and op.type == "ok" and "meta" in op.value:
                which = (op.session, op.value.get("key", op.process))
                last[which] = max(last.get(which, 0), op.value["meta"])
        found = []
        for (sid, key), value in sorted(last.items()):
            stored = self.metadata.get(sid, {}).get(key)
            if not isinstance(stored, int) or stored < value:
                found.append(f"{sid}: {key} acknowledged {value}, the store holds {stored}")
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
    options: Sequence[str] = (),
    during: Callable[[Callable[[], bool]], None] | None = None,
    timeout: float = 600.0,
) -> HistoryRun:
    """Run ``processes`` workers on fresh sessions of ``url``; their events and the final state.

    Worker ``k`` runs the program of seed ``seed * 1000 + k``, without the kinds of
    step named in ``skip``, with the worker ``options`` (``listen``, ``refresh``,
    ``faults``). ``during(running)``, when given, is called once the workers
    started their programs and must return once ``running()`` is false (it
    injects faults meanwhile). Raises when a worker fails.
    """
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise ValueError(f"unknown worker options {sorted(unknown)}")
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
                ",".join(options) or "-",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(processes)
    ]
    try:
        if during is not None:
            time.sleep(max(0.0, start_at - time.time()))
            during(lambda: any(child.poll() is None for child in children))
        results = [child.communicate(timeout=timeout) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    for k, (child, (_, err)) in enumerate(zip(children, results, strict=True)):
        if child.returncode != 0:
            raise RuntimeError(f"worker p{k} exited with {child.returncode}:\n{err[-4000:]}")

    async def final() -> tuple[
        dict[str, list[str]], dict[str, dict[str, Any]], dict[str, str | None]
    ]:
        async with open_store_url(url) as store:
            loaded = {sid: await store.load(sid) for sid in every}
        turns = {sid: ids(data.turns) if data else [] for sid, data in loaded.items()}
        meta = {sid: dict(data.metadata or {}) if data else {} for sid, data in loaded.items()}
        agents = {sid: data.agent_id if data else None for sid, data in loaded.items()}
        return turns, meta, agents

    turns, meta, agents = trio.run(final)
    return HistoryRun(load_events(outs), turns, meta, agents)


if __name__ == "__main__":
    url, process, seed, steps, out, start_at, sessions, skip, options = sys.argv[1:]
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
        [] if options == "-" else options.split(","),
    )
