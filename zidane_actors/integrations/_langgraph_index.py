"""What a LangGraph thread's session holds, indexed: its records, messages and runs."""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec
from langchain_core.messages import BaseMessage
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..actors._repairs import _lane_for_run
from ..errors import (
    CorruptDataError,
    UnsupportedOperationError,
)
from ..model import (
    NativeBlock,
    SessionHistory,
    SessionRun,
    SessionTurn,
    ToolCallBlock,
    ToolResultBlock,
    preview,
)
from ._langgraph_messages import (
    is_message_turn,
    message_state,
    messages_equal,
    same_states,
    strict_state,
    thaw,
    turn_to_message,
)

RECORD_PROVIDER: Final = "langgraph"
"""The ``provider`` of the native blocks holding checkpoint and writes records."""

_NO_CHANNEL: Final = object()


def _now() -> int:
    import time

    return int(time.time() * 1000)


def _digest(*parts: object) -> str:
    return hashlib.sha256(_ENCODER.encode(parts)).hexdigest()[:32]


_ENCODER: Final = msgspec.json.Encoder()


def _version_key(version: Any) -> tuple[str, Any]:
    return (type(version).__name__, version)


class _Pairing:
    """zidane's load-time pairing rules, followed turn by turn (nothing a load would drop)."""

    def __init__(self) -> None:
        self.seen: dict[str, set[str]] = {}
        self.preceding: dict[str, set[str]] = {}

    def fits(self, turn: SessionTurn, lane: str) -> bool:
        seen = self.seen.get(lane, set())
        calls: set[str] = set()
        results: set[str] = set()
        preceding = self.preceding.get(lane, set())
        for block in turn.content:
            if isinstance(block, ToolCallBlock):
                if block.id in seen or block.id in calls:
                    return False
                calls.add(block.id)
            elif isinstance(block, ToolResultBlock):
                if block.call_id in results or block.call_id not in preceding:
                    return False
                results.add(block.call_id)
        return True

    def add(self, turn: SessionTurn, lane: str) -> None:
        seen = self.seen.setdefault(lane, set())
        fresh: set[str] = set()
        for block in turn.content:
            if isinstance(block, ToolCallBlock) and block.id not in seen:
                fresh.add(block.id)
                seen.add(block.id)
        if turn.role == "assistant":
            self.preceding[lane] = fresh


class _Known:
    """The leading messages of a channel's last list that :meth:`_Index.find` answered
    with a turn holding the very same value: their turn ids, snapshots of their states
    taken then (:func:`message_state`), the JSON of their turns' messages
    (:func:`strict_state`), and the message objects the list held."""

    __slots__ = ("ids", "objects", "states", "stricts")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.states: list[Any] = []
        self.stricts: list[bytes | None] = []
        self.objects: list[BaseMessage] = []


class _Index:
    """What one session's turns hold for the door, extended as turns are appended."""

    def __init__(self, serde: SerializerProtocol) -> None:
        self.serde = serde
        self.count = 0
        self.last: SessionTurn | None = None
        self.ids: set[str] = set()
        self.msg_order: list[str] = []
        self.msg_pos: dict[str, int] = {}
        self.msg_turn: dict[str, SessionTurn] = {}
        self.by_message_id: dict[str | None, list[str]] = {}
        self.cache: dict[str, BaseMessage] = {}
        # The message each planned turn gives back (by the turn's identity), for the cache.
        self.rebuilt: dict[int, tuple[SessionTurn, BaseMessage]] = {}
        self.records: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.order: dict[tuple[str, str], int] = {}
        self.namespaces: dict[str, set[str]] = {}
        self.writes: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
        self.blobs: dict[tuple[str, str, tuple[str, Any]], list[str]] = {}
        self.pairing = _Pairing()
        self.lanes: Any = None
        self.known: dict[tuple[str, str], _Known] = {}  # by namespace and channel

    def fits(self, turns: tuple[SessionTurn, ...]) -> bool:
        return len(turns) >= self.count and (self.count == 0 or turns[self.count - 1] is self.last)

    def extend(self, turns: Sequence[SessionTurn], runs: Sequence[SessionRun]) -> None:
        self.lanes = _lane_for_run(runs)
        for turn in turns[self.count :]:
            self._add(turn)
        self.count = len(turns)
        self.last = turns[-1] if turns else None

    def add_pending(self, turns: Sequence[SessionTurn], runs: Sequence[SessionRun] | None) -> None:
        """Index turns planned for an append not made yet (``runs``: the runs as it
        leaves them, when it adds one; a run's lane depends on the runs it knows).

        ``count`` and ``last`` still describe the session's stored turns: once the
        append lands, :meth:`landed` moves them past these; if it fails, the whole
        index is dropped.
        """
        if runs is not None:
            self.lanes = _lane_for_run(runs)
        for turn in turns:
            self._add(turn)

    def landed(self, turns: Sequence[SessionTurn], pending: Sequence[SessionTurn]) -> bool:
        """``pending`` (indexed by :meth:`add_pending`) are the session's last ``turns``:
        the index now covers them. ``False`` when the session holds others too."""
        start = len(turns) - len(pending)
        if start != self.count or any(
            turns[start + i].id != turn.id for i, turn in enumerate(pending)
        ):
            return False
        self.count = len(turns)
        self.last = turns[-1] if turns else None
        return True

    def _add(self, turn: SessionTurn) -> None:
        self.ids.add(turn.id)
        self.pairing.add(turn, self.lanes(turn.run_id))
        if is_message_turn(turn):
            self.msg_pos[turn.id] = len(self.msg_order)
            self.msg_order.append(turn.id)
            self.msg_turn[turn.id] = turn
            rebuilt = self.rebuilt.pop(id(turn), None)
            if rebuilt is not None and rebuilt[0] is turn:
                self.cache[turn.id] = rebuilt[1]
            self.by_message_id.setdefault(self._message_id(turn), []).append(turn.id)
            return
        if turn.role != "command" or len(turn.content) != 1:
            return
        block = turn.content[0]
        if not isinstance(block, NativeBlock) or block.provider != RECORD_PROVIDER:
            return
        record = block.data
        kind = record.get("type")
        ns = record.get("ns")
        if not isinstance(ns, str):
            raise CorruptDataError(f"turn {preview(turn.id)}: a LangGraph record without its ns")
        if kind == "checkpoint":
            checkpoint = record.get("checkpoint")
            cid = checkpoint.get("id") if isinstance(checkpoint, Mapping) else None
            versions = (
                checkpoint.get("channel_versions") if isinstance(checkpoint, Mapping) else None
            )
            if not isinstance(cid, str) or not isinstance(versions, Mapping):
                raise CorruptDataError(
                    f"turn {preview(turn.id)}: a checkpoint record without its id"
                )
            key = (ns, cid)
            self.records[key] = record
            self.order[key] = len(self.order)
            self.namespaces.setdefault(ns, set()).add(cid)
            for channel in record.get("values") or ():
                version = versions.get(channel, _NO_CHANNEL)
                if version is not _NO_CHANNEL:
                    self.blobs.setdefault((ns, channel, _version_key(version)), []).append(cid)
        elif kind == "writes":
            cid = record.get("checkpoint")
            if not isinstance(cid, str):
                raise CorruptDataError(
                    f"turn {preview(turn.id)}: a writes record without its checkpoint"
                )
            self.writes.setdefault((ns, cid), []).append(record)

    def _message_id(self, turn: SessionTurn) -> str | None:
        data = turn.provider_data or {}
        rest = data.get("message")
        if isinstance(rest, Mapping):
            found = rest.get("id", turn.id)
            return found if isinstance(found, str) or found is None else None
        return self.message(turn.id).id

    # -- messages -----------------------------------------------------------

    def message(self, turn_id: str) -> BaseMessage:
        """The message a message turn holds (the index's own object: copy before handing out)."""
        found = self.cache.get(turn_id)
        if found is None:
            found = self.cache[turn_id] = turn_to_message(self.msg_turn[turn_id], self.serde)
        return found

    def find(self, message: BaseMessage) -> str | None:
        """The turn holding ``message`` exactly, if one does."""
        for turn_id in self.by_message_id.get(message.id, ()):
            if messages_equal(self.message(turn_id), message):
                return turn_id
        return None

    def known_ids(self, channel: tuple[str, str], messages: Sequence[BaseMessage]) -> list[str]:
        """The turn ids :meth:`find` answers for the leading messages of ``messages`` that
        the channel's last list had (``channel``: its namespace and name), proven in one
        pass: each holds the very value of its turn's message now (as when it was found:
        a turn's message never changes, and the first turn holding a value stays the
        first). Empty when any differs."""
        known = self.known.get(channel)
        if known is None or len(messages) < len(known.ids):
            return []
        head = messages[: len(known.ids)]
        if not same_states(head, known.states):
            return []
        if not all(map(operator.is_, head, known.objects)):
            # Other objects (a list read back, a message replaced by an equal one): ``==``
            # takes 1, 1.0 and True alike, their JSON does not.
            for i, message in enumerate(head):
                if message is not known.objects[i]:
                    if strict_state(message) != known.stricts[i]:
                        return []
                    known.objects[i] = message
        return list(known.ids)

    def remember(
        self,
        channel: tuple[str, str],
        messages: Sequence[BaseMessage],
        ids: Sequence[str],
        proven: int,
    ) -> None:
        """Keep, for :meth:`known_ids`, the channel's messages (``ids`` their turns, the first
        ``proven`` of them from :meth:`known_ids`) up to the first one not holding the very
        value of a turn's message the index has."""
        known = self.known.get(channel) if proven else None
        if known is None:
            known = self.known[channel] = _Known()
        for message, turn_id in zip(messages[proven:], ids[proven:], strict=True):
            held = self.cache.get(turn_id)
            if held is None or not messages_equal(message, held):
                return
            known.ids.append(turn_id)
            known.states.append(message_state(message))  # equal to ``held``'s, proven
            known.stricts.append(strict_state(held))
            known.objects.append(message)

    def resolve(self, segments: Any, where: str) -> list[BaseMessage]:
        out: list[BaseMessage] = []
        for segment in segments:
            first, count = segment[0], segment[1]
            start = self.msg_pos.get(first)
            if start is None or start + count > len(self.msg_order):
                raise CorruptDataError(
                    f"{where} refers to message turn {preview(first)} (+{count}),"
                    " which the session no longer holds"
                )
            out.extend(self.message(t) for t in self.msg_order[start : start + count])
        return out

    def resolve_ids(self, turn_ids: Iterable[str], where: str) -> list[BaseMessage]:
        out = []
        for turn_id in turn_ids:
            if turn_id not in self.msg_turn:
                raise CorruptDataError(f"{where} refers to message turn {preview(turn_id)}, gone")
            out.append(self.message(turn_id))
        return out

    # -- checkpoints ----------------------------------------------------------

    def latest(self, ns: str) -> str | None:
        cids = self.namespaces.get(ns)
        return max(cids) if cids else None

    def value(self, ns: str, cid: str, channel: str, version: Any) -> Any:
        """The stored value of ``channel`` at ``version`` as checkpoint ``cid`` sees it."""
        holders = self.blobs.get((ns, channel, _version_key(version)))
        if not holders:
            return None
        if len(holders) == 1:
            return self.records[(ns, holders[0])]["values"][channel]
        # Several checkpoints wrote this version: the nearest ancestor's is the one.
        mine = set(holders)
        seen: set[str] = set()
        cursor: str | None = cid
        while cursor is not None and cursor not in seen:
            seen.add(cursor)
            if cursor in mine:
                return self.records[(ns, cursor)]["values"][channel]
            record = self.records.get((ns, cursor))
            parent = record.get("parent") if record is not None else None
            cursor = parent if isinstance(parent, str) else None
        latest = max(holders, key=lambda c: self.order[(ns, c)])
        return self.records[(ns, latest)]["values"][channel]

    def raw_tuple(self, ns: str, cid: str) -> dict[str, Any]:
        """One checkpoint as the caller decodes it: record fields, values, writes."""
        record = self.records[(ns, cid)]
        checkpoint = record["checkpoint"]
        values: dict[str, Any] = {}
        own = record.get("values") or {}
        for channel, version in checkpoint["channel_versions"].items():
            stored = own.get(channel) if channel in own else self.value(ns, cid, channel, version)
            if stored is None or (not isinstance(stored, Mapping) and stored[0] == "empty"):
                continue
            values[channel] = self._decoded_value(stored, f"checkpoint {cid} channel {channel}")
        return {
            "ns": ns,
            "checkpoint": thaw(checkpoint),
            "checkpointSerde": thaw(record.get("checkpointSerde")),
            "metadata": thaw(record.get("metadata")),
            "metadataSerde": thaw(record.get("metadataSerde")),
            "parent": record.get("parent"),
            "values": values,
            "valuesOrder": thaw(record.get("valuesOrder")),
            "writes": self.pending(ns, cid),
        }

    def _decoded_value(self, stored: Any, where: str) -> Any:
        if isinstance(stored, Mapping):
            if "turns" in stored:
                return ("messages", self.resolve(stored["turns"], where))
            if "turnIds" in stored:
                return ("messages", self.resolve_ids(stored["turnIds"], where))
            if "turn" in stored:
                return ("message", self.resolve_ids([stored["turn"]], where)[0])
            raise CorruptDataError(f"{where}: unknown value form {sorted(stored)}")
        return ("blob", list(stored))

    def pending(self, ns: str, cid: str) -> list[tuple[str, str, Any, str, int]]:
        """The writes of a checkpoint: first for a regular index, last for a special one."""
        chosen: dict[tuple[str, int], tuple[str, str, Any, str, int]] = {}
        for record in self.writes.get((ns, cid), ()):
            task, path = record["task"], record.get("path", "")
            for entry in record["writes"]:
                idx, channel, stored = entry[0], entry[1], entry[2]
                key = (task, idx)
                if key in chosen and idx >= 0:
                    continue
                value = self._decoded_value(stored, f"writes of checkpoint {cid}")
                chosen[key] = (task, channel, value, path, idx)
        return sorted(chosen.values(), key=lambda w: (w[3], w[0], w[4]))

    def write_keys(self, ns: str, cid: str, task: str) -> set[int]:
        return {
            entry[0]
            for record in self.writes.get((ns, cid), ())
            if record["task"] == task
            for entry in record["writes"]
        }


def _run_of(index: _Index, record: Mapping[str, Any]) -> str | None:
    """The run a checkpoint belongs to: the one LangGraph names (``metadata.run_id``, or the
    config's ``run_id``), else a run per graph input, followed along the parents."""
    named = record.get("run")
    if isinstance(named, str):
        return named
    metadata = record.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    ns = record["ns"]
    parents = metadata.get("parents")
    if ns and isinstance(parents, Mapping) and isinstance(parents.get(""), str):
        root = index.records.get(("", parents[""]))
        if root is not None and isinstance(root.get("run"), str):
            return str(root["run"])
    if metadata.get("source") == "input":
        return "lg-run-" + str(record["checkpoint"]["id"])
    parent = index.records.get((ns, record.get("parent") or ""))
    found = parent.get("run") if parent is not None else None
    return found if isinstance(found, str) else None


def _fits_after(index: _Index, new: Sequence[SessionTurn], turn: SessionTurn, lane: str) -> bool:
    if not new:
        return index.pairing.fits(turn, lane)
    # The turns of this write come first: follow them on a copy of the rules.
    pairing = _Pairing()
    pairing.seen = {k: set(v) for k, v in index.pairing.seen.items()}
    pairing.preceding = {k: set(v) for k, v in index.pairing.preceding.items()}
    for earlier in new:
        pairing.add(earlier, index.lanes(earlier.run_id) if index.lanes is not None else "main")
    return pairing.fits(turn, lane)


def _segments(
    index: _Index, turn_ids: Sequence[str], new: Sequence[SessionTurn]
) -> list[list[Any]]:
    """Message turn ids as runs of consecutive message turns: ``[[first id, count], ...]``."""
    base = len(index.msg_order)
    extra = {t.id: base + i for i, t in enumerate(t for t in new if is_message_turn(t))}
    out: list[list[Any]] = []
    previous = -2
    for turn_id in turn_ids:
        position = index.msg_pos.get(turn_id)
        if position is None:
            position = extra[turn_id]
        if out and position == previous + 1:
            out[-1][1] += 1
        else:
            out.append([turn_id, 1])
        previous = position
    return out


def _record_turn(
    turn_id: str, body: dict[str, Any], now: int, run: SessionRun | None
) -> SessionTurn:
    return SessionTurn(
        id=turn_id,
        role="command",
        content=(NativeBlock(provider=RECORD_PROVIDER, data=body),),
        created_at=now,
        run_id=run.id if run is not None else None,
    )


def _record_of(turn: SessionTurn) -> Mapping[str, Any] | None:
    if turn.role != "command" or len(turn.content) != 1:
        return None
    block = turn.content[0]
    if isinstance(block, NativeBlock) and block.provider == RECORD_PROVIDER:
        return block.data
    return None


def _record_key(turn: SessionTurn) -> tuple[str, str] | None:
    record = _record_of(turn)
    if record is None:
        return None
    if record.get("type") == "checkpoint":
        return (record["ns"], record["checkpoint"]["id"])
    return (record["ns"], record.get("checkpoint"))  # type: ignore[return-value]


def _pruned(
    history: SessionHistory, strategy: str, serde: SerializerProtocol
) -> SessionHistory | None:
    """The history with the records ``strategy`` drops (``keep_latest``: all but each
    namespace's latest checkpoint and its writes, its values made its own)."""
    index = _Index(serde)
    index.extend(history.turns, history.runs)
    if not index.records and not index.writes:
        return None
    if strategy == "keep_latest" and any(
        isinstance(r.get("metadata"), Mapping) and "counters_since_delta_snapshot" in r["metadata"]
        for r in index.records.values()
    ):
        raise UnsupportedOperationError(
            "keep_latest cannot prune a thread that uses a DeltaChannel (its latest value is"
            " rebuilt from older checkpoints)"
        )
    if strategy == "delete":
        turns = tuple(t for t in history.turns if _record_of(t) is None)
        return SessionHistory(turns=turns, runs=history.runs)
    keep: dict[tuple[str, str], SessionTurn] = {}
    for ns in index.namespaces:
        cid = index.latest(ns)
        assert cid is not None
        record = index.records[(ns, cid)]
        values = dict(record.get("values") or {})
        for channel, version in record["checkpoint"]["channel_versions"].items():
            if channel not in values:
                found = index.value(ns, cid, channel, version)
                if found is not None:
                    values[channel] = found
        body = thaw({k: v for k, v in record.items() if k != "parent"})
        body["values"] = thaw(values)
        turn_id = "lgc-" + _digest(ns, cid, body)
        keep[(ns, cid)] = _record_turn(turn_id, body, _now(), None)
    out: list[SessionTurn] = []
    latest_turn: dict[tuple[str, str], SessionTurn] = {}
    for turn in history.turns:
        found = _record_of(turn)
        if found is not None and found.get("type") == "checkpoint":
            latest_turn[(found["ns"], found["checkpoint"]["id"])] = turn
    for turn in history.turns:
        found = _record_of(turn)
        if found is None:
            out.append(turn)
            continue
        key = _record_key(turn)
        if key is None or key not in keep:
            continue
        if found.get("type") == "writes":
            out.append(turn)
        elif latest_turn.get(key) is turn:
            kept = msgspec.structs.replace(
                keep[key], run_id=turn.run_id, created_at=turn.created_at
            )
            out.append(kept)
    return SessionHistory(turns=tuple(out), runs=history.runs)
