"""Values nobody else can change: what a session keeps in memory.

Model values are frozen, but their free-form JSON (a tool ``input``,
``metadata``, ``providerData``) is plain dicts and lists: a caller holding
one could change a session's memory after the store acknowledged it. A
session keeps :func:`frozen` copies instead: every dict is a
:class:`FrozenDict` and every list a :class:`FrozenList`, equal to (and
encoded like) the plain ones, refusing changes with ``TypeError`` as a
tuple does. :class:`FrozenView` keeps such a copy of a session's memory
up to date as it changes.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any, Final, NoReturn, TypeVar

import msgspec

from ._extra import ExtraFields
from ._types import (
    FileBlock,
    ImageBlock,
    NativeBlock,
    ReasoningBlock,
    SessionData,
    SessionRun,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    TurnUsage,
)

__all__ = ["FrozenDict", "FrozenList", "FrozenView", "frozen", "frozen_json", "plain_turn"]

T = TypeVar("T")


def _refuse(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(f"a session's {type(self).__name__} cannot be changed (copy it first)")


class FrozenDict(dict[str, Any]):
    """A JSON object that refuses changes; ``dict(x)`` is a changeable copy."""

    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        raise TypeError("unhashable type: 'FrozenDict'")

    def __reduce__(self) -> tuple[type[dict[str, Any]], tuple[dict[str, Any]]]:
        return dict, (dict(self),)


class FrozenList(list[Any]):
    """A JSON array that refuses changes; ``list(x)`` is a changeable copy."""

    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = clear = extend = insert = pop = remove = reverse = sort = _refuse

    def __reduce__(self) -> tuple[type[list[Any]], tuple[list[Any]]]:
        return list, (list(self),)


_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def frozen_json(value: Any) -> Any:
    """A deep copy of a JSON value with every dict and list frozen (scalars shared)."""
    kind = type(value)
    # Copied whole at C speed, then each nested container replaced by its frozen copy
    # (through the base class: the copy refuses changes): scalars cost no call each.
    if kind is dict or kind is FrozenDict or (kind is not list and isinstance(value, dict)):
        if not value:
            return _EMPTY_DICT
        frozen_dict = FrozenDict(value)
        if _SCALARS.issuperset(map(type, value.values())):  # a leaf: nothing nested to copy
            return frozen_dict
        for key, item in value.items():
            if type(item) not in _SCALARS:
                _set_item(frozen_dict, key, frozen_json(item))
        return frozen_dict
    if kind is list or kind is FrozenList or isinstance(value, list):
        if not value:
            return _EMPTY_LIST
        frozen_list = FrozenList(value)
        if _SCALARS.issuperset(map(type, value)):
            return frozen_list
        for index, item in enumerate(value):
            if type(item) not in _SCALARS:
                _set_index(frozen_list, index, frozen_json(item))
        return frozen_list
    if kind is tuple:
        return tuple(frozen_json(v) for v in value)
    return value


# Empty ones are shared: nothing can change them, and each one less is one object
# less for the garbage collector to track (ADK events hold several per turn).
_EMPTY_DICT: Final = FrozenDict()
_EMPTY_LIST: Final = FrozenList()
_set_item: Final = dict.__setitem__
_set_index: Final = list.__setitem__
_NAMES: Final[dict[type, tuple[str, ...]]] = {}


def _names(cls: type[msgspec.Struct]) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:
        names = tuple(f.name for f in msgspec.structs.fields(cls))
        _NAMES[cls] = names
    return names


_SKIPPED: Final = _SCALARS | {FrozenDict, FrozenList}
_astuple: Final = msgspec.structs.astuple
_BLOCKS: Final = frozenset(
    {TextBlock, ImageBlock, FileBlock, ToolCallBlock, ToolResultBlock, ReasoningBlock, NativeBlock}
)


def plain_turn(turn: SessionTurn) -> bool:
    """Whether ``turn`` holds no dict or list (its blocks and usage only scalars, a tool
    result's parts too): then ``frozen(turn) is turn``.

    A few attribute reads for most turns, where :func:`frozen` would walk each
    field; ``False`` only means :func:`frozen` must look.
    """
    usage = turn.usage
    content: Any = turn.content
    if (
        turn.metadata is not None
        or turn.provider_data is not None
        or turn.extra_fields is not None
        or type(content) is not tuple
        or not _SCALARS.issuperset(
            (type(turn.id), type(turn.role), type(turn.created_at), type(turn.run_id))
        )
        or (
            usage is not None
            and (
                type(usage) is not TurnUsage or not _SCALARS.issuperset(map(type, _astuple(usage)))
            )
        )
    ):
        return False
    for block in content:
        kind = type(block)
        if kind not in _BLOCKS:
            return False
        fields = _astuple(block)
        if not _SCALARS.issuperset(map(type, fields)):
            if kind is not ToolResultBlock:
                return False
            output = fields[_OUTPUT]  # a tool result's parts: each plain too
            if (
                type(output) is not tuple
                or not _SCALARS.issuperset(map(type, fields[:_OUTPUT] + fields[_OUTPUT + 1 :]))
                or not all(map(_plain_part, output))
            ):
                return False
    return True


_OUTPUT: Final = _names(ToolResultBlock).index("output")


def _plain_part(part: Any) -> bool:
    return type(part) in _BLOCKS and _SCALARS.issuperset(map(type, _astuple(part)))


def frozen(value: T) -> T:
    """``value`` (a model value or a tuple of them) with its free-form JSON frozen.

    Structs without a dict or list inside are returned as they are (no copy).
    """
    if type(value) is SessionTurn and plain_turn(value):  # type: ignore[arg-type]  # no walk
        return value
    return _walked(value)


def _walked(value: T) -> T:
    """:func:`frozen`, walking every field of ``value``."""
    if isinstance(value, tuple):
        items = []
        changed = False
        for item in value:
            new_item = frozen(item)
            changed = changed or new_item is not item
            items.append(new_item)
        if not changed:
            return value
        return type(value)(items) if type(value) is tuple else tuple(items)  # type: ignore[return-value]
    if not isinstance(value, msgspec.Struct):
        return value
    fields = _astuple(value)
    if _SKIPPED.issuperset(map(type, fields)):  # only scalars and frozen JSON: as it is
        return value
    changes: dict[str, Any] = {}
    kind = type(value)
    # The field values in one call (astuple), the names beside them: most are skipped
    # on their type alone.
    for name, item in zip(_NAMES.get(kind) or _names(kind), fields, strict=True):
        item_kind = type(item)
        if item_kind in _SKIPPED:
            continue
        new: Any
        if isinstance(item, (msgspec.Struct, tuple)):
            new = frozen(item)
        elif item_kind is ExtraFields:
            new = ExtraFields({k: frozen_json(v) for k, v in item.items()})
        elif isinstance(item, (dict, list)):
            new = frozen_json(item)
        else:
            continue
        if new is not item:
            changes[name] = new
    return msgspec.structs.replace(value, **changes) if changes else value


class FrozenView:
    """A frozen copy of a changing ``SessionData``, kept up to date at little cost.

    :meth:`of` answers ``data`` with its free-form JSON frozen, reusing what
    it froze for the previous value: turns appended since are the only ones
    frozen again, and unchanged runs or metadata are reused as they are. So
    memory loads at full speed, and what a session hands out costs a walk of
    each turn once.
    """

    __slots__ = ("_source", "_view")

    def __init__(self) -> None:
        self._source: SessionData | None = None
        self._view: SessionData | None = None

    def shown(self) -> SessionData | None:
        """The last frozen value :meth:`of` answered (what callers may hold), if any."""
        return self._view

    def metadata_of(self, data: SessionData) -> Mapping[str, Any]:
        """``data.metadata``, frozen: while it is the metadata :meth:`of` froze last, that copy
        as it is, without freezing the turns and runs written since (a header read)."""
        source, view = self._source, self._view
        if source is not None and view is not None and data.metadata is source.metadata:
            return view.metadata
        return self.of(data).metadata

    def runs_of(self, data: SessionData) -> tuple[SessionRun, ...]:
        """``data.runs``, frozen: while they are the runs :meth:`of` froze last, that copy as
        it is, without freezing the turns written since."""
        source, view = self._source, self._view
        if source is not None and view is not None and data.runs is source.runs:
            return view.runs
        return self.of(data).runs

    def of(self, data: SessionData) -> SessionData:
        """``data``, frozen (the same object each call while ``data`` is unchanged)."""
        source, view = self._source, self._view
        if source is data and view is not None:
            return view
        if source is None or view is None:
            turns, runs, metadata = frozen(data.turns), frozen(data.runs), None
        else:
            turns = _extended(source.turns, view.turns, data.turns)
            runs = (
                view.runs
                if data.runs is source.runs
                else _refrozen(source.runs, view.runs, data.runs)
            )
            metadata = view.metadata if data.metadata is source.metadata else None
        extra = data.extra_fields
        view = msgspec.structs.replace(
            data,
            turns=turns,
            runs=runs,
            metadata=frozen_json(data.metadata) if metadata is None else metadata,
            extra_fields=None if extra is None else ExtraFields(frozen_json(dict(extra))),
        )
        self._source, self._view = data, view
        return view


def _refrozen(old: tuple[T, ...], old_view: tuple[T, ...], new: tuple[T, ...]) -> tuple[T, ...]:
    """``new`` frozen, each item that is one of ``old`` answered by its ``old_view`` twin
    (an upsert replaces one run: the others are not walked again)."""
    seen = {id(item): twin for item, twin in zip(old, old_view, strict=True)}
    return tuple(seen[id(item)] if id(item) in seen else frozen(item) for item in new)


def _extended(
    old: tuple[SessionTurn, ...], old_view: tuple[SessionTurn, ...], new: tuple[SessionTurn, ...]
) -> tuple[SessionTurn, ...]:
    """``new`` frozen, reusing ``old_view`` when ``new`` starts with the very turns of ``old``."""
    if new is old:
        return old_view
    n = len(old)
    if len(new) >= n and all(map(operator.is_, old, new[:n])):
        return old_view + frozen(new[n:])
    return frozen(new)
