"""The trio side of the LangGraph door: one thread's checkpoints in one zidane session.

A thread's session holds, in store order:

* one turn per LangChain message (``_langgraph_messages``), stored once;
* one ``command`` turn per checkpoint and per ``put_writes`` call, holding a
  ``NativeBlock(provider="langgraph")`` record (its ``type`` is
  ``"checkpoint"`` or ``"writes"``): the checkpoint's fields, metadata and the
  values of the channels it wrote (LangGraph's serializer bytes, base64), a
  message channel's list as references to the message turns.

Everything is written with appends, the run record upserted in the same
write. Writes to one thread queue up; the one holding the thread's lock
appends every write queued by then in one ``append_turns`` (one commit),
each planned on what the ones before it leave; writes for the latest
checkpoint wait a moment for the next checkpoint, which LangGraph hands
over right after them, so a graph step costs one commit (from asyncio they
wait on the caller's side, ``_langgraph_pairing``, and come with it). Threads never
wait for each other (the store's group commit lets their appends share
commits). Removals (``prune``, ``delete_for_runs``) are ``mutate_history``
edits decided on the stored turns. Turn ids of records are digests of
their content, so a retried write is a no-op and two hosts writing the
same record store it once.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs
import msgspec
import trio
from langchain_core.messages import BaseMessage
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..actors import Session, SessionHost
from ..errors import (
    ActorClosed,
    ConflictError,
    InvalidNameError,
    SessionNotFoundError,
)
from ..model import (
    AppendTurnsOptions,
    SessionFilter,
    SessionHistory,
    SessionRun,
    SessionRunAgent,
    SessionTurn,
    preview,
    validate_id,
)
from ._langgraph_index import (
    _NO_CHANNEL,
    RECORD_PROVIDER,
    _digest,
    _fits_after,
    _Index,
    _now,
    _pruned,
    _record_key,
    _record_of,
    _record_turn,
    _run_of,
    _segments,
)
from ._langgraph_messages import (
    has_tool_blocks,
    is_message_turn,
    message_to_turn,
    messages_equal,
)

__all__ = [
    "AGENT_ID",
    "META_KEY",
    "RECORD_PROVIDER",
    "TaskWrites",
    "ThreadOps",
    "session_id_of",
    "thread_id_of",
]

AGENT_ID: Final = "langgraph"
"""The ``agentId`` of every thread's session (how the saver finds its threads)."""

META_KEY: Final = "langgraph"
"""The session metadata key of the door: ``{"thread": <thread id>}``."""

_RETRIES: Final = 8
CHECKPOINT_WAIT: Final = 1.0
"""Seconds ``put_writes`` of messages waits for its checkpoint (``_checkpoint_first``)."""
NEXT_CHECKPOINT_WAIT: Final = 0.002
"""Seconds writes for a thread's latest checkpoint wait for the next one, to share its append."""


def session_id_of(thread_id: str) -> str:
    """The zidane session id of a LangGraph thread (reversible, see docs/integrations.md).

    A thread id that is a safe zidane id and does not start with ``lg=`` is
    the session id itself; any other is ``lg=`` + its UTF-8 bytes in
    unpadded base64url (up to 147 bytes), or ``lgh=`` + their SHA-256 when
    longer (the thread id is then read from the session's metadata).
    """
    if not thread_id.startswith(("lg=", "lgh=")) and (safe := _safe_id(thread_id)) is not None:
        return safe
    import base64

    raw = thread_id.encode("utf-8", "surrogatepass")
    encoded = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    if len(encoded) + 3 <= 200:
        return "lg=" + encoded
    return "lgh=" + hashlib.sha256(raw).hexdigest()


def _safe_id(value: object) -> str | None:
    """``value`` when it is a safe zidane id (one a session, turn or run can take as is)."""
    try:
        return validate_id(value)
    except InvalidNameError:
        return None


def thread_id_of(session_id: str, metadata: Mapping[str, Any]) -> str:
    """The thread id a session holds (the inverse of :func:`session_id_of`)."""
    meta = metadata.get(META_KEY)
    if isinstance(meta, Mapping) and isinstance(meta.get("thread"), str):
        return str(meta["thread"])
    if session_id.startswith("lg="):
        import base64

        body = session_id[3:]
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        return raw.decode("utf-8", "surrogatepass")
    return session_id


@attrs.frozen
class TaskWrites:
    """One ``put_writes`` call, encoded: a message value stands apart, by entry position."""

    ns: str
    checkpoint: str
    task: str
    path: str
    entries: list[list[Any]]  # [index, channel, serializer blob or None]
    messages: dict[int, BaseMessage | list[BaseMessage]]
    error: str | None  # the ERROR write's repr, for the run record


class _Write:
    """A ``put`` or ``put_writes`` waiting in its thread's queue for an append."""

    __slots__ = ("checkpoint", "done", "error", "follows", "plan", "waited")

    def __init__(
        self,
        plan: Callable[[_Batch], _Planned],
        *,
        checkpoint: tuple[str, str] | None = None,
        follows: tuple[str, str] | None = None,
        waited: bool = False,
    ) -> None:
        self.plan = plan
        self.checkpoint = checkpoint  # the (ns, id) a put stores
        self.follows = follows  # the (ns, id) writes belong to
        self.waited = waited  # its caller waited for the next checkpoint already
        self.done = False
        self.error: BaseException | None = None

    def settle(self, error: BaseException | None = None) -> None:
        self.done = True
        self.error = error


_Planned = tuple[SessionRun | None, list[SessionTurn]] | None
"""A write's turns and the run as they leave it; ``None``: stored already."""


class _Batch:
    """The turns of queued writes planned for one append, each planned on what the ones
    before it leave (the index extended as they are planned, the runs as they update)."""

    def __init__(self, session: Session, index: _Index) -> None:
        self.session = session
        self.index = index
        self.now = _now()
        self.turns: list[SessionTurn] = []
        self.runs = {r.id: r for r in session._memory().runs}  # as the batch leaves them
        self.run: SessionRun | None = None
        self.writes: list[_Write] = []

    def known_run(self, run_id: str) -> SessionRun | None:
        return self.runs.get(run_id)

    def take(self, write: _Write, run: SessionRun | None, turns: list[SessionTurn]) -> bool:
        """Add ``write``'s turns; ``False`` when it updates another run than the batch's
        (an append updates one run: it waits for the next)."""
        if run is not None and self.run is not None and run.id != self.run.id:
            return False
        self.writes.append(write)
        if not turns:
            return True  # stored already: it lands with the batch
        # A run's lane is decided by the runs known: it changes with a new run only.
        lanes_change = self.index.lanes is None or (run is not None and run.id not in self.runs)
        if run is not None:
            self.runs[run.id] = self.run = run
        self.index.add_pending(turns, list(self.runs.values()) if lanes_change else None)
        self.turns.extend(turns)
        return True


class _Thread:
    """A thread's lock, index and write queue in one host (trio side)."""

    def __init__(self) -> None:
        self.lock = trio.Lock()
        self.index: _Index | None = None
        self.session: Session | None = None  # held: a host forgets a session nobody holds
        self.landed = trio.Event()  # set (and replaced) whenever a checkpoint lands
        self.queue: list[_Write] = []  # writes waiting for the lock's holder to append them
        self.put_queued = trio.Event()  # set when a checkpoint is queued
        self.landed_at: float | None = None  # when the last checkpoint landed
        self.next_gap = 0.0  # how long after it the next checkpoint came, last time
        self.absent = False  # the last read found no session: a write creates it first

    def checkpoint_landed(self) -> None:
        self.landed.set()
        self.landed = trio.Event()
        self.landed_at = trio.current_time()

    def checkpoint_queued(self) -> None:
        self.put_queued.set()
        if self.landed_at is not None:
            self.next_gap = trio.current_time() - self.landed_at
            self.landed_at = None

    async def appended(
        self, session: Session, new: list[SessionTurn], run: SessionRun | None
    ) -> bool:
        """``new`` appended in one step, or ``False`` (index and handle forgotten) when
        another writer came first or the session went away: the caller reads again."""
        try:
            await session.append_turns(
                new, AppendTurnsOptions(run=run) if run is not None else None
            )
        except (ConflictError, ActorClosed, SessionNotFoundError):
            self.index = None
            self.session = None
            return False
        return True


def _holds(thread: _Thread, key: tuple[str, str]) -> bool:
    """Whether the checkpoint ``key`` is queued in ``thread`` or indexed as stored."""
    return any(w.checkpoint == key for w in thread.queue) or (
        thread.index is not None and key in thread.index.records
    )


_threads: weakref.WeakKeyDictionary[SessionHost, OrderedDict[str, _Thread]] = (
    weakref.WeakKeyDictionary()
)


KEEP_THREADS: Final = 10_000
"""Threads whose session handle (and index) a host keeps, least recently used dropped."""


def _thread(host: SessionHost, session_id: str) -> _Thread:
    threads = _threads.get(host)
    if threads is None:
        threads = _threads[host] = OrderedDict()
    found = threads.get(session_id)
    if found is None:
        found = threads[session_id] = _Thread()
        if len(threads) > KEEP_THREADS:
            for key in list(itertools.islice(threads, len(threads) - KEEP_THREADS)):
                if not threads[key].lock.locked():
                    del threads[key]
    else:
        threads.move_to_end(session_id)
    return found


class ThreadOps:
    """The door's operations, run in the portal's trio thread (``await op(host, ...)``)."""

    def __init__(self, serde: SerializerProtocol) -> None:
        self.serde = serde

    # -- sessions -------------------------------------------------------------

    def _index(self, thread: _Thread, session: Session) -> _Index:
        memory = session._memory()  # read, never handed out: no frozen copy needed
        turns = memory.turns
        index = thread.index
        if index is None or index.serde is not self.serde or not index.fits(turns):
            index = thread.index = _Index(self.serde)
        if index.count != len(turns) or index.last is not (turns[-1] if turns else None):
            index.extend(turns, memory.runs)
        return index

    async def _session(self, host: SessionHost, thread_id: str, *, create: bool) -> Session | None:
        """The thread's session, created when absent and ``create``. A thread the last read
        found absent (a new one) is created first, read only when another writer came first."""
        sid = session_id_of(thread_id)
        thread = _thread(host, sid)
        session = None if create and thread.absent else await host.load_session(sid)
        if session is None and create:
            try:
                session = await host.create_session(
                    id=sid, agent_id=AGENT_ID, metadata={META_KEY: {"thread": thread_id}}
                )
            except ConflictError:
                session = await host.load_session(sid)
        thread.absent = session is None
        if (
            session is not None
            and sid.startswith("lgh=")
            and thread_id_of(sid, session.metadata) != thread_id
        ):
            raise ConflictError(f"session {sid} holds another thread than {preview(thread_id)}")
        thread.session = session
        return session

    async def _writable(self, host: SessionHost, thread: _Thread, thread_id: str) -> Session:
        """The session a write goes to: the held handle, without a store read.

        An append is unconditional: its answer tells the session when another
        writer moved the store (memory then folds their turns in), and a turn
        of ours another writer stored first makes it fail with
        ``ConflictError``, whereupon the handle is read again and the write
        decided anew.
        """
        if thread.session is not None:
            return thread.session
        session = await self._session(host, thread_id, create=True)
        assert session is not None
        return session

    # -- writes ---------------------------------------------------------------

    def _message_turns(
        self,
        index: _Index,
        messages: Sequence[BaseMessage],
        new: list[SessionTurn],
        fresh: dict[str, BaseMessage],
        run_id: str | None,
        now: int,
        channel: tuple[str, str] | None = None,
    ) -> list[str]:
        """The turn id of each message, new turns made (into ``new``) for the ones not stored.

        ``channel``: the messages are that channel's list (namespace, name), which mostly
        repeats its last one: the index proves the repeated part at once
        (:meth:`_Index.known_ids`).
        """
        out = index.known_ids(channel, messages) if channel is not None else []
        proven = len(out)
        for message in messages[proven:]:
            found = index.find(message)
            if found is None:
                found = next(
                    (t for t, held in fresh.items() if messages_equal(held, message)), None
                )
            if found is None:
                found = self._new_message_turn(index, message, new, fresh, run_id, now)
            out.append(found)
        if channel is not None:
            index.remember(channel, messages, out, proven)
        return out

    def _new_message_turn(
        self,
        index: _Index,
        message: BaseMessage,
        new: list[SessionTurn],
        fresh: dict[str, BaseMessage],
        run_id: str | None,
        now: int,
    ) -> str:
        ids, mine = index.ids, {t.id for t in new}
        turn_id = _safe_id(message.id)
        if turn_id is not None and (
            turn_id in ids or turn_id in mine or turn_id.startswith(("lgc-", "lgw-"))
        ):
            turn_id = None
        dumped: tuple[str, bytes] | None = None
        if turn_id is None:
            kind, raw = dumped = self.serde.dumps_typed(message)
            turn_id = (
                "lc-"
                + hashlib.sha256(
                    f"{message.id}\0{kind}\0".encode("utf-8", "surrogatepass") + raw
                ).hexdigest()[:32]
            )
            n = 0
            base = turn_id
            while turn_id in ids or turn_id in mine:
                n += 1
                turn_id = f"{base}.{n}"
        made = functools.partial(
            message_to_turn,
            message,
            self.serde,
            turn_id=turn_id,
            created_at=now,
            run_id=run_id,
            dumped=dumped,
        )
        turn, back = made()
        lane = index.lanes(run_id) if index.lanes is not None else "main"
        if has_tool_blocks(turn) and not _fits_after(index, new, turn, lane):
            turn, back = made(readable_only=True)
        if back is not None:
            index.rebuilt[id(turn)] = (turn, back)  # its message, read once already
        fresh[turn_id] = message
        new.append(turn)
        return turn_id

    @staticmethod
    def _run(
        batch: _Batch,
        run_id: Any,
        prompt: str | None,
        new: Sequence[SessionTurn],
        *,
        error: str | None = None,
    ) -> SessionRun | None:
        if _safe_id(run_id) is None:
            return None
        run = batch.known_run(run_id)
        if run is None:
            run = SessionRun(
                id=run_id,
                prompt=prompt or "",
                started_at=batch.now,
                status="completed",
                agent=SessionRunAgent(id=AGENT_ID, label="LangGraph"),
                tokens_in=0,
                tokens_out=0,
                turns=0,
            )
        tokens_in = run.tokens_in or 0
        tokens_out = run.tokens_out or 0
        turns = run.turns or 0
        for turn in new:
            if turn.role == "command":
                continue
            turns += 1
            if turn.usage is not None:
                tokens_in += turn.usage.input
                tokens_out += turn.usage.output
        changes: dict[str, Any] = {
            "ended_at": batch.now,
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "turns": turns,
        }
        if error is not None:
            changes["status"] = "error"
            changes["error"] = error
        return msgspec.structs.replace(run, **changes)

    async def put(
        self,
        host: SessionHost,
        thread_id: str,
        record: dict[str, Any],
        messages: dict[str, list[BaseMessage]],
        prompt: str | None,
        carried: Sequence[TaskWrites] = (),
    ) -> list[BaseException | None]:
        """Store one checkpoint record and the message turns it needs, with the
        ``carried`` writes (the caller held them for it: one append holds all):
        its own after it, those of stored checkpoints before it.

        Raises the checkpoint's own error; answers each carried write's.
        """
        key = (record["ns"], record["checkpoint"]["id"])
        writes = [
            _Write(functools.partial(self._plan_writes, w), follows=key, waited=True)
            if (w.ns, w.checkpoint) == key
            else await self._writes_write(host, thread_id, w, waited=True)
            for w in carried
        ]
        plan = functools.partial(self._plan_put, record, messages, prompt)
        put = _Write(plan, checkpoint=key)
        before = [w for w in writes if w.follows != key]
        await self._write(host, thread_id, [*before, put, *(w for w in writes if w.follows == key)])
        if put.error is not None:
            raise put.error
        return [w.error for w in writes]

    def _plan_put(
        self,
        record: dict[str, Any],
        messages: dict[str, list[BaseMessage]],
        prompt: str | None,
        batch: _Batch,
    ) -> _Planned:
        index = batch.index
        run_id = _run_of(index, record)
        turn_run = _safe_id(run_id)  # a run record is kept for a safe id only (_run)
        new: list[SessionTurn] = []
        fresh: dict[str, BaseMessage] = {}
        values = dict(record["values"])
        for channel, listed in messages.items():
            key = (record["ns"], channel)
            ids = self._message_turns(index, listed, new, fresh, turn_run, batch.now, key)
            values[channel] = {"turns": _segments(index, ids, new)}
        body = {**record, "values": values}
        if run_id is not None:
            body["run"] = run_id
        turn_id = "lgc-" + _digest(record["ns"], record["checkpoint"]["id"], body)
        if turn_id in index.ids and not new:
            return None  # the same checkpoint again: stored
        run = self._run(batch, run_id, prompt, new)
        new.append(_record_turn(turn_id, body, batch.now, run))
        return run, new

    async def put_writes(
        self, host: SessionHost, thread_id: str, writes: TaskWrites, waited: bool = False
    ) -> None:
        """Store one task's writes for a checkpoint; a write already stored is kept as it is.

        ``waited``: the caller held them for the next checkpoint already (none came).
        """
        write = await self._writes_write(host, thread_id, writes, waited=waited)
        await self._write(host, thread_id, [write])
        if write.error is not None:
            raise write.error

    async def _writes_write(
        self, host: SessionHost, thread_id: str, writes: TaskWrites, *, waited: bool
    ) -> _Write:
        """The queued form of ``writes``, once their checkpoint is stored (or queued)."""
        key = (writes.ns, writes.checkpoint)
        if writes.messages:
            thread = _thread(host, session_id_of(thread_id))
            await self._checkpoint_first(host, thread, thread_id, *key)
        plan = functools.partial(self._plan_writes, writes)
        return _Write(plan, follows=key, waited=waited)

    def _plan_writes(self, writes: TaskWrites, batch: _Batch) -> _Planned:
        ns, cid, task, messages = writes.ns, writes.checkpoint, writes.task, writes.messages
        index = batch.index
        held = index.write_keys(ns, cid, task)
        kept = [(i, e) for i, e in enumerate(writes.entries) if e[0] < 0 or e[0] not in held]
        if not kept:
            return None
        checkpoint = index.records.get((ns, cid))
        if checkpoint is None and (latest := index.latest(ns)) is not None:
            # Its checkpoint is still on its way (LangGraph writes both at
            # once): it continues the namespace's latest checkpoint's run.
            checkpoint = index.records[(ns, latest)]
        found = checkpoint.get("run") if checkpoint is not None else None
        run_id = found if isinstance(found, str) else None
        turn_run = _safe_id(run_id)  # a run record is kept for a safe id only (_run)
        new: list[SessionTurn] = []
        fresh: dict[str, BaseMessage] = {}
        stored = []
        for position, entry in kept:
            value = messages.get(position)
            if value is None:
                stored.append(entry)
            elif isinstance(value, BaseMessage):
                ids = self._message_turns(index, [value], new, fresh, turn_run, batch.now)
                stored.append([entry[0], entry[1], {"turn": ids[0]}])
            else:
                ids = self._message_turns(index, value, new, fresh, turn_run, batch.now)
                stored.append([entry[0], entry[1], {"turnIds": ids}])
        body: dict[str, Any] = {"type": "writes", "ns": ns, "checkpoint": cid, "task": task}
        if writes.path:
            body["path"] = writes.path
        body["writes"] = stored
        turn_id = "lgw-" + _digest(ns, cid, task, body)
        if turn_id in index.ids and not new:
            return None
        run = self._run(batch, run_id, None, new, error=writes.error)
        new.append(_record_turn(turn_id, body, batch.now, run))
        return run, new

    async def _write(self, host: SessionHost, thread_id: str, writes: list[_Write]) -> None:
        """Queue ``writes`` and wait until appends hold them (each settled with its error).

        Whoever holds the thread's lock appends every write queued by then that
        the append can take (one run's), in queue order, in one store write: a
        checkpoint and the writes LangGraph hands over with it share a commit.
        """
        thread = _thread(host, session_id_of(thread_id))
        thread.queue.extend(writes)
        if any(w.checkpoint is not None for w in writes):
            thread.checkpoint_queued()
        try:
            async with thread.lock:
                while not all(w.done for w in writes):
                    await self._next_checkpoint(thread)
                    await self._append_queued(host, thread, thread_id)
        finally:
            for write in writes:
                if not write.done and write in thread.queue:
                    thread.queue.remove(write)  # cancelled before any append took it

    @staticmethod
    async def _next_checkpoint(thread: _Thread) -> None:
        """When only writes for the latest checkpoint wait, wait (a little) for the next
        checkpoint: LangGraph hands it over next, and one append then holds both. Not
        when the next one came later than the wait the last time (a busy caller): the
        writes would only be held up."""
        queue = thread.queue
        index = thread.index
        if (
            not queue
            or thread.next_gap > NEXT_CHECKPOINT_WAIT
            or index is None
            or any(w.follows is None or w.waited for w in queue)
            or any(index.latest(w.follows[0]) != w.follows[1] for w in queue if w.follows)
        ):
            return
        thread.put_queued = trio.Event()
        with trio.move_on_after(NEXT_CHECKPOINT_WAIT):
            await thread.put_queued.wait()

    async def _append_queued(self, host: SessionHost, thread: _Thread, thread_id: str) -> None:
        """Append the writes at the head of the queue (at least the first), settling each."""
        for _attempt in range(_RETRIES):
            session = await self._writable(host, thread, thread_id)
            batch = _Batch(session, self._index(thread, session))
            try:
                stored = await self._append_batch(thread, batch)
            except BaseException as exc:
                thread.index = None  # it indexed the batch's turns
                self._settle(thread, batch.writes, exc)
                if not isinstance(exc, Exception):
                    raise
                return
            if stored:
                self._settle(thread, batch.writes, None)
                if any(w.checkpoint is not None for w in batch.writes):
                    thread.checkpoint_landed()
                return
        error = ConflictError(f"{_RETRIES} writers raced for the turns of these writes")
        self._settle(thread, batch.writes, error)

    async def _append_batch(self, thread: _Thread, batch: _Batch) -> bool:
        """Plan the queued writes into ``batch`` and append it; ``False`` when another
        writer came first (the index is dropped: plan again on what it wrote)."""
        for write in list(thread.queue):
            try:
                planned = write.plan(batch)
            except Exception as exc:  # this write's own fault: the others go on
                self._settle(thread, [write], exc)
                continue
            if not batch.take(write, *(planned or (None, []))):
                break
        batch.index.rebuilt.clear()  # the turns of writes no append took
        if not batch.turns:
            return True  # each stored already (or refused)
        if not await thread.appended(batch.session, batch.turns, batch.run):
            return False
        if not batch.index.landed(batch.session._memory().turns, batch.turns):
            thread.index = None
        return True

    @staticmethod
    def _settle(thread: _Thread, writes: list[_Write], error: BaseException | None) -> None:
        if isinstance(error, trio.Cancelled):
            error = ActorClosed("the portal closed while the write was being stored")
        for write in writes:
            if write in thread.queue:
                thread.queue.remove(write)
            write.settle(error)

    async def _checkpoint_first(
        self, host: SessionHost, thread: _Thread, thread_id: str, ns: str, cid: str
    ) -> None:
        """Wait (a while) for the checkpoint writes belong to, when it is not stored yet.

        LangGraph hands a checkpoint to its saver before the writes of the tasks
        that follow it, but it does not wait for it: both may arrive at once.
        The messages of the writes are stored after the checkpoint's own (a
        checkpoint queued or being appended is as good: the writes go after it),
        so a session's turns keep the conversation's order.
        """
        key = (ns, cid)
        if _holds(thread, key):
            return
        with trio.move_on_after(CHECKPOINT_WAIT):
            while True:
                async with thread.lock:
                    landed = thread.landed
                    session = thread.session or await self._session(host, thread_id, create=False)
                    if session is not None and key in self._index(thread, session).records:
                        return
                await landed.wait()
                if _holds(thread, key):
                    return

    # -- reads ----------------------------------------------------------------

    async def get(
        self, host: SessionHost, thread_id: str, ns: str, cid: str | None
    ) -> dict[str, Any] | None:
        thread = _thread(host, session_id_of(thread_id))
        async with thread.lock:
            session = await self._session(host, thread_id, create=False)
            if session is None:
                return None
            index = self._index(thread, session)
            if cid is None:
                cid = index.latest(ns)
                if cid is None:
                    return None
            elif (ns, cid) not in index.records:
                return None
            raw = index.raw_tuple(ns, cid)
            raw["thread"] = thread_id
            return raw

    async def listing(
        self,
        host: SessionHost,
        thread_id: str | None,
        ns: str | None,
        before: str | None,
        filter: Mapping[str, Any] | None,
        limit: int | None,
    ) -> list[dict[str, Any]]:
        """Checkpoints newest first; ``filter`` applied here to plain metadata (the caller
        applies it to metadata kept as serializer bytes, and the limit then)."""
        if thread_id is not None:
            threads = [thread_id]
        else:
            ids = await host.store.list(SessionFilter(agent_id=AGENT_ID))
            threads = []
            for sid in ids:
                session = await host.load_session(sid)
                if session is not None:
                    threads.append(thread_id_of(sid, session.metadata))
        out: list[dict[str, Any]] = []
        exact = True
        for tid in threads:
            thread = _thread(host, session_id_of(tid))
            async with thread.lock:
                session = await self._session(host, tid, create=False)
                if session is None:
                    continue
                index = self._index(thread, session)
                keys = [
                    (n, c)
                    for n, cids in index.namespaces.items()
                    if ns is None or n == ns
                    for c in cids
                    if before is None or c < before
                ]
                keys.sort(key=lambda k: k[1], reverse=True)
                for key in keys:
                    record = index.records[key]
                    metadata = record.get("metadata")
                    if filter:
                        if isinstance(metadata, Mapping):
                            if any(metadata.get(k, _NO_CHANNEL) != v for k, v in filter.items()):
                                continue
                        else:
                            exact = False
                    raw = index.raw_tuple(*key)
                    raw["thread"] = tid
                    out.append(raw)
                    if exact and limit is not None and len(out) >= limit:
                        return out
        return out

    # -- deletions and copies -----------------------------------------------------

    async def delete_thread(self, host: SessionHost, thread_id: str) -> None:
        sid = session_id_of(thread_id)
        thread = _thread(host, sid)
        async with thread.lock:
            await host.delete_session(sid)
            thread.index = None

    async def delete_for_runs(self, host: SessionHost, run_ids: list[str]) -> None:
        runs = set(run_ids)
        for sid in await host.store.list(SessionFilter(agent_id=AGENT_ID)):
            session = await host.load_session(sid)
            if session is None:
                continue
            thread = _thread(host, sid)
            async with thread.lock:
                index = self._index(thread, session)
                if not any(
                    isinstance(r.get("metadata"), Mapping) and r["metadata"].get("run_id") in runs
                    for r in index.records.values()
                ):
                    continue

                def drop(history: SessionHistory) -> SessionHistory | None:
                    gone: set[tuple[str, str]] = set()
                    for turn in history.turns:
                        record = _record_of(turn)
                        if record is not None and record.get("type") == "checkpoint":
                            metadata = record.get("metadata")
                            if isinstance(metadata, Mapping) and metadata.get("run_id") in runs:
                                gone.add((record["ns"], record["checkpoint"]["id"]))
                    if not gone:
                        return None
                    kept = tuple(t for t in history.turns if _record_key(t) not in gone)
                    return SessionHistory(turns=kept, runs=history.runs)

                await session.mutate_history(drop)
                thread.index = None

    async def prune(self, host: SessionHost, thread_ids: list[str], strategy: str) -> None:
        for thread_id in thread_ids:
            session = await self._session(host, thread_id, create=False)
            if session is None:
                continue
            thread = _thread(host, session.id)
            async with thread.lock:
                await session.mutate_history(
                    functools.partial(_pruned, strategy=strategy, serde=self.serde)
                )
                thread.index = None

    async def copy_thread(self, host: SessionHost, source: str, target: str) -> None:
        src = await self._session(host, source, create=False)
        if src is None:
            return
        dst = await self._session(host, target, create=True)
        assert dst is not None
        theirs = _thread(host, dst.id)
        async with theirs.lock:
            index = self._index(theirs, dst)
            if index.records or index.writes:
                raise ConflictError(
                    f"thread {preview(target)} already has checkpoints:"
                    " copy_thread fills new threads"
                )
            ours = [t for t in src.turns if is_message_turn(t) or _record_of(t) is not None]
            known = {r.id for r in dst.runs}
            run_ids = {t.run_id for t in ours if t.run_id is not None}
            runs = [r for r in src.runs if r.id in run_ids and r.id not in known]
            # Turns first with no run that is not stored yet; then each run alone.
            for run in runs:
                await dst.update_run(run)
            if ours:
                await dst.append_turns(ours)
            theirs.index = None
