"""LangGraph checkpoints kept in zidane sessions: ``ZidaneSaver``.

``ZidaneSaver(store=URL)`` is a ``langgraph.checkpoint.base.BaseCheckpointSaver``
over any zidane store URL (``sqlite:PATH``, ``memory:``, ``postgres://…``,
``http(s)://…``). A thread is a zidane session (the thread id is the session
id when it is a safe one; see :func:`session_id_of`): the messages a graph
writes to its ``messages`` channel are stored once each, as turns the
session browser, the CLI and the other doors read; checkpoints and pending
writes are ``command`` turns that refer to those message turns instead of
repeating the list, and keep every other channel value as LangGraph's
serializer's bytes. Each graph run (``metadata.run_id``) is a run record of
the session. Requires the ``langgraph`` extra.

Use it as ``async with ZidaneSaver(store=...) as saver`` from asyncio or
``with ZidaneSaver(store=...) as saver`` from blocking code (LangGraph calls
the sync methods from ``invoke`` and the async ones from ``ainvoke``); every
saver and door of one store URL shares one portal per process.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import random
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Final, TypeVar, cast

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import ERROR

from ..errors import ValidationError
from ..portal._thread import wait_future
from . import _shared
from ._langgraph_messages import copy_message, first_text, plain_json
from ._langgraph_pairing import ALONE, Held, Pairing
from ._langgraph_thread import (
    AGENT_ID,
    META_KEY,
    RECORD_PROVIDER,
    TaskWrites,
    ThreadOps,
    session_id_of,
    thread_id_of,
)

__all__ = [
    "AGENT_ID",
    "DEFAULT_STORE",
    "META_KEY",
    "RECORD_PROVIDER",
    "ZidaneSaver",
    "session_id_of",
    "thread_id_of",
]

DEFAULT_STORE: Final = _shared.DEFAULT_STORE
PRUNE_STRATEGIES: Final = ("keep_latest", "delete")

T = TypeVar("T")


def _blob(serde: SerializerProtocol, value: Any) -> list[str]:
    kind, raw = serde.dumps_typed(value)
    if kind == "null" and not raw:
        return ["null"]
    return [kind, base64.b64encode(raw).decode("ascii")]


def _unblob(serde: SerializerProtocol, blob: Sequence[str]) -> Any:
    if blob[0] == "null" and len(blob) == 1:
        return serde.loads_typed(("null", b""))
    return serde.loads_typed((blob[0], base64.b64decode(blob[1])))


def _messages(value: Any) -> bool:
    return type(value) is list and all(map(isinstance, value, itertools.repeat(BaseMessage)))


def _configurable(config: RunnableConfig | None, what: str) -> Mapping[str, Any]:
    conf = (config or {}).get("configurable")
    if not isinstance(conf, Mapping):
        raise ValidationError(f"{what} has no configurable mapping", path="$.configurable")
    return conf


def _thread(conf: Mapping[str, Any]) -> str:
    tid = conf.get("thread_id")
    if tid is None or tid == "":
        raise ValidationError("a thread_id is required", path="$.configurable.thread_id")
    return str(tid)


def _ns(conf: Mapping[str, Any]) -> str:
    ns = conf.get("checkpoint_ns", "")
    if not isinstance(ns, str):
        raise ValidationError(
            f"checkpoint_ns must be a string, got {type(ns).__name__}",
            path="$.configurable.checkpoint_ns",
        )
    return ns


def _prompt(checkpoint: Checkpoint) -> str | None:
    """The run's prompt: the first human message of a checkpoint's input, if any."""
    start = checkpoint["channel_values"].get("__start__")
    if not isinstance(start, Mapping):
        return None
    for value in start.values():
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, HumanMessage):
                return first_text(item.content)
            if isinstance(item, tuple) and len(item) == 2 and item[0] in ("human", "user"):
                return str(item[1])
            if isinstance(item, str):
                return item
    return None


class ZidaneSaver(BaseCheckpointSaver[float], _shared.Share):
    """A LangGraph checkpointer over a zidane store.

    ``store`` is a store URL as the CLI takes it (``sqlite:PATH``, ``memory:``,
    ``postgres://…``, ``http(s)://…``; not ``file:DIR``, which holds one
    session: :class:`~zidane_actors.errors.ValidationError`). ``serde`` is
    LangGraph's serializer (default ``JsonPlusSerializer``).
    ``message_channels`` names the channels whose list of LangChain messages
    is stored as turns (default ``("messages",)``, ``MessagesState``'s).
    """

    def __init__(
        self,
        *,
        store: str = DEFAULT_STORE,
        serde: SerializerProtocol | None = None,
        message_channels: Sequence[str] = ("messages",),
    ) -> None:
        super().__init__(serde=serde)
        if store.startswith("file:"):
            raise ValidationError(
                "a file: store holds one zidane session; a LangGraph saver keeps one per"
                " thread (use sqlite:PATH, memory:, postgres://… or http(s)://…)",
                path="store",
            )
        self.store_url = store
        self.message_channels = frozenset(message_channels)
        self._ops = ThreadOps(self.serde)
        self._pairing = Pairing()
        self._shared: _shared.SharedPortal | None = _shared.acquire(store)

    def __repr__(self) -> str:
        return f"ZidaneSaver(store={self.store_url!r})"

    # -- lifetime ---------------------------------------------------------------

    def close(self) -> None:
        """Release this saver's share of the portal (the last share closes the store)."""
        self._let_go_blocking()

    async def aclose(self) -> None:
        """:meth:`close`, awaited without blocking the event loop."""
        await self._let_go_async()

    def _call(self, fn: Any, *args: Any) -> Any:
        shared = self._open()
        shared.ready.result()
        return shared.portal.call(fn, shared.portal.host, *args)

    async def _acall(self, fn: Any, *args: Any) -> Any:
        shared = self._open()
        await wait_future(shared.ready)
        return await shared.portal.call_async(fn, shared.portal.host, *args)

    # -- versions -----------------------------------------------------------------

    def get_next_version(self, current: float | None, channel: None) -> float:
        """The next version of a channel: one more than ``current``'s whole part, plus a
        random fraction (two forks of one checkpoint never share a version)."""
        if current is None:
            base = 0
        elif isinstance(current, str):
            base = int(current.split(".")[0])
        else:
            base = int(current)
        return base + 1 + random.random() * 0.999

    # -- encoding (the caller's thread) -------------------------------------------

    def _put_args(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[str, dict[str, Any], dict[str, list[BaseMessage]], str | None]:
        conf = _configurable(config, "config")
        tid, ns = _thread(conf), _ns(conf)
        parent = conf.get("checkpoint_id")
        fields = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        # Every key in its place (values kept apart stand in as null): read back in order.
        plain = {
            k: (v if k != "channel_values" and plain_json(v) else None)
            for k, v in checkpoint.items()
        }
        if "channel_versions" not in plain or not isinstance(plain.get("id"), str):
            raise ValidationError(
                "a checkpoint needs a string id and channel versions that are strings or numbers",
                path="$.checkpoint",
            )
        record: dict[str, Any] = {"type": "checkpoint", "ns": ns, "checkpoint": plain}
        odd = {
            k: _blob(self.serde, v) for k, v in fields.items() if plain[k] is None and v is not None
        }
        if odd:
            record["checkpointSerde"] = odd
        if parent is not None:
            record["parent"] = str(parent)
        md = dict(get_checkpoint_metadata(config, metadata))
        run = md.get("run_id", config.get("run_id"))
        if run is not None:
            record["run"] = str(run)
        if plain_json(md):
            record["metadata"] = md
        else:
            record["metadataSerde"] = _blob(self.serde, md)
        values: dict[str, Any] = {}
        messages: dict[str, list[BaseMessage]] = {}
        channel_values = checkpoint["channel_values"]
        for channel in new_versions:
            if channel not in channel_values:
                values[channel] = ["empty"]
                continue
            value = channel_values[channel]
            if channel in self.message_channels and _messages(value):
                messages[channel] = value
            else:
                values[channel] = _blob(self.serde, value)
        record["values"] = values
        order = list(channel_values)
        if order != [c for c in checkpoint["channel_versions"] if c in channel_values]:
            record["valuesOrder"] = order  # read back in the order they were put
        return tid, record, messages, _prompt(checkpoint)

    def _writes_args(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> tuple[str, TaskWrites]:
        conf = _configurable(config, "config")
        tid, ns = _thread(conf), _ns(conf)
        cid = conf.get("checkpoint_id")
        if not isinstance(cid, str):
            raise ValidationError(
                "put_writes needs the checkpoint_id its writes belong to",
                path="$.configurable.checkpoint_id",
            )
        entries: list[list[Any]] = []
        messages: dict[int, BaseMessage | list[BaseMessage]] = {}
        error: str | None = None
        for i, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, i)
            if channel in self.message_channels and (
                (isinstance(value, BaseMessage) and value.id is not None)
                or (_messages(value) and value and all(m.id is not None for m in value))
            ):
                messages[len(entries)] = value
                entries.append([idx, channel, None])
            else:
                entries.append([idx, channel, _blob(self.serde, value)])
            if channel == ERROR:
                error = repr(value)[:2000]
        return tid, TaskWrites(ns, cid, str(task_id), task_path or "", entries, messages, error)

    def _tuple(self, raw: dict[str, Any]) -> CheckpointTuple:
        serde = self.serde
        checkpoint = dict(raw["checkpoint"])
        for key, blob in (raw.get("checkpointSerde") or {}).items():
            checkpoint[key] = _unblob(serde, blob)
        stored = raw["values"]
        order = raw.get("valuesOrder") or stored
        values = {c: self._value(*stored[c]) for c in order if c in stored}
        checkpoint["channel_values"] = values
        if raw.get("metadataSerde") is not None:
            metadata = _unblob(serde, raw["metadataSerde"])
        else:
            metadata = raw["metadata"] or {}
        tid, ns = raw["thread"], raw["ns"]
        config: RunnableConfig = {
            "configurable": {
                "thread_id": tid,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }
        parent: RunnableConfig | None = None
        if raw.get("parent") is not None:
            parent = {
                "configurable": {
                    "thread_id": tid,
                    "checkpoint_ns": ns,
                    "checkpoint_id": raw["parent"],
                }
            }
        writes = [
            (task, channel, self._value(*value)) for task, channel, value, _, _ in raw["writes"]
        ]
        return CheckpointTuple(
            config=config,
            checkpoint=cast(Checkpoint, checkpoint),
            metadata=cast(CheckpointMetadata, metadata),
            parent_config=parent,
            pending_writes=writes,
        )

    def _value(self, kind: str, value: Any) -> Any:
        if kind == "blob":
            return _unblob(self.serde, value)
        if kind == "message":
            return copy_message(value)
        return [copy_message(m) for m in value]

    @staticmethod
    def _get_args(config: RunnableConfig) -> tuple[str, str, str | None]:
        conf = _configurable(config, "config")
        return _thread(conf), _ns(conf), get_checkpoint_id(config)

    def _list_args(
        self,
        config: RunnableConfig | None,
        before: RunnableConfig | None,
        filter: dict[str, Any] | None,
        limit: int | None,
    ) -> tuple[Any, ...]:
        tid: str | None = None
        ns: str | None = None
        if config is not None:
            conf = _configurable(config, "config")
            if conf.get("thread_id") is not None:
                tid = _thread(conf)
            if "checkpoint_ns" in conf:
                ns = _ns(conf)
        before_id = get_checkpoint_id(before) if before is not None else None
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise ValidationError(f"limit must be a non-negative int, got {limit!r}", path="limit")
        return tid, ns, before_id, filter, limit

    def _listed(
        self, raws: list[dict[str, Any]], filter: dict[str, Any] | None, limit: int | None
    ) -> Iterator[CheckpointTuple]:
        count = 0
        for raw in raws:
            if limit is not None and count >= limit:
                return
            tup = self._tuple(raw)
            metadata = cast(Mapping[str, Any], tup.metadata)
            if (
                filter
                and raw.get("metadataSerde") is not None
                and any(metadata.get(k) != v for k, v in filter.items())
            ):
                continue
            count += 1
            yield tup

    @staticmethod
    def _prune_args(thread_ids: Sequence[str], strategy: str) -> list[str]:
        if isinstance(thread_ids, str):
            raise ValidationError(
                "thread_ids must be a sequence of thread ids, not a str", path="thread_ids"
            )
        if strategy not in PRUNE_STRATEGIES:
            raise ValidationError(
                f"unknown prune strategy {strategy!r} (keep_latest or delete)", path="strategy"
            )
        return [str(t) for t in thread_ids]

    # -- BaseCheckpointSaver: blocking ---------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        raw = self._call(self._ops.get, *self._get_args(config))
        return None if raw is None else self._tuple(raw)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        args = self._list_args(config, before, filter, limit)
        raws = self._call(self._ops.listing, *args)
        yield from self._listed(raws, filter, limit)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        tid, record, messages, prompt = self._put_args(config, checkpoint, metadata, new_versions)
        self._call(self._ops.put, tid, record, messages, prompt)
        return self._put_answer(tid, record)

    @staticmethod
    def _put_answer(tid: str, record: Mapping[str, Any]) -> RunnableConfig:
        return {
            "configurable": {
                "thread_id": tid,
                "checkpoint_ns": record["ns"],
                "checkpoint_id": record["checkpoint"]["id"],
            }
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._call(self._ops.put_writes, *self._writes_args(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._call(self._ops.delete_thread, str(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = [str(r) for r in run_ids]
        if runs:
            self._call(self._ops.delete_for_runs, runs)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._call(self._ops.copy_thread, str(source_thread_id), str(target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        ids = self._prune_args(thread_ids, strategy)
        if ids:
            self._call(self._ops.prune, ids, strategy)

    # -- BaseCheckpointSaver: asyncio ----------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        raw = await self._acall(self._ops.get, *self._get_args(config))
        return None if raw is None else self._tuple(raw)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        args = self._list_args(config, before, filter, limit)
        raws = await self._acall(self._ops.listing, *args)
        for tup in self._listed(raws, filter, limit):
            yield tup

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        tid, record, messages, prompt = self._put_args(config, checkpoint, metadata, new_versions)
        ns, cid = record["ns"], record["checkpoint"]["id"]
        delta = "counters_since_delta_snapshot" in metadata
        carried = self._pairing.take(tid, ns, cid, delta=delta)
        try:
            verdicts = await self._acall(
                self._ops.put, tid, record, messages, prompt, [h.writes for h in carried]
            )
        except BaseException:
            self._pairing.landed(tid, ns, cid, stored=False)
            for held in carried:
                held.settle(ALONE)  # stored or not, each stores itself (a no-op if stored)
            raise
        self._pairing.landed(tid, ns, cid, stored=True)
        for held, verdict in zip(carried, verdicts, strict=True):
            held.settle(verdict)
        return self._put_answer(tid, record)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        tid, encoded = self._writes_args(config, writes, task_id, task_path)
        held = self._pairing.hold(tid, encoded)
        if held is not None:
            verdict = await self._carried(tid, held)
            if isinstance(verdict, BaseException):
                raise verdict
            if verdict is not ALONE:
                return
        await self._acall(self._ops.put_writes, tid, encoded, True)

    async def _carried(self, tid: str, held: Held) -> object:
        """The verdict on writes held for the next checkpoint. Cancelled while held: taken
        back (never stored); once a checkpoint carries them, its verdict comes first."""
        try:
            return await asyncio.shield(held.future)
        except asyncio.CancelledError:
            if not self._pairing.withdraw(tid, held):
                while not held.future.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.shield(held.future)
            raise

    async def adelete_thread(self, thread_id: str) -> None:
        await self._acall(self._ops.delete_thread, str(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = [str(r) for r in run_ids]
        if runs:
            await self._acall(self._ops.delete_for_runs, runs)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._acall(self._ops.copy_thread, str(source_thread_id), str(target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        ids = self._prune_args(thread_ids, strategy)
        if ids:
            await self._acall(self._ops.prune, ids, strategy)
