"""The declared types of model values built in Python, checked where they are first used.

msgspec checks a value's types when it decodes one, never when Python code
builds one: ``SessionTurn(content=None)`` constructs, and the first code
that iterates its content raises a bare ``TypeError`` deep inside.
:func:`check_shape` checks what a decoder would check of the types (a field
of the wrong type, a block that is not a content block, a literal outside its
values, an empty required text) and refuses the first mismatch with a
:class:`~zidane_actors.errors.ValidationError` locating it
(``$.turns[3].content``). Free-form values (``JsonValue`` fields) are not
walked: :func:`~zidane_actors.model.check_json` is their check.

The checks of each model type are built once from ``msgspec.inspect``; a
valid value costs one exact type test per field (paths are only built for a
mismatch, while it unwinds). A strict check asks msgspec first (the value as
builtins, converted back: C speed, and every constraint a store checks); only
a value it refuses is walked, for the located mismatch.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Final, cast

import msgspec
import msgspec.inspect as mi

from ..errors import ValidationError
from ._codec import _located, decoder
from ._extra import EXTRA_KEY, ExtraFields
from ._preview import preview

__all__ = ["check_shape"]

_Check = Callable[[Any], None]
"""The slow check of one value whose exact type was not enough; raises :class:`_Mismatch`."""

_astuple: Final = msgspec.structs.astuple


class _Mismatch(Exception):
    """Internal: a value is not of its declared type; ``steps`` are collected while unwinding."""

    def __init__(self, expected: str, value: object) -> None:
        super().__init__(expected)
        self.expected = expected
        self.value = value
        self.steps: list[str] = []


def _name(info: mi.Type) -> str:
    if isinstance(info, mi.StructType):
        return info.cls.__name__
    if isinstance(info, mi.UnionType):
        return " | ".join(_name(t) for t in info.types)
    if isinstance(info, mi.LiteralType):
        return " | ".join(repr(v) for v in info.values)
    if isinstance(info, (mi.ListType, mi.VarTupleType, mi.TupleType)):
        return "an array"
    if isinstance(info, mi.DictType):
        return "an object"
    if isinstance(info, mi.StrType) and info.min_length:
        least = info.min_length
        return "a non-empty string" if least == 1 else f"a string of {least}+ characters"
    names = {
        mi.StrType: "a string",
        mi.IntType: "an integer",
        mi.FloatType: "a number",
        mi.BoolType: "a boolean",
        mi.NoneType: "null",
    }
    return names.get(type(info), type(info).__name__)


class _Builder:
    """Builds the checks of one mode (``loose``: an object may stand for a model value)."""

    def __init__(self, loose: bool) -> None:
        self.loose = loose
        self.structs: dict[type, tuple[tuple[frozenset[type], _Check | None, str], ...]] = {}

    def fields(self, cls: type) -> tuple[tuple[frozenset[type], _Check | None, str], ...]:
        """``(exact types, slow check, step)`` for each field of ``cls``, in order."""
        found = self.structs.get(cls)
        if found is None:
            info = mi.type_info(cls)
            assert isinstance(info, mi.StructType)
            built = []
            for field in info.fields:
                exact, check = self.of(field.type, field)
                built.append((exact, check, f".{field.encode_name}"))
            found = self.structs[cls] = tuple(built)
        return found

    def struct(self, cls: type, expected: str) -> _Check:
        loose = self.loose

        def check(value: Any) -> None:
            if not isinstance(value, cls):
                if loose and isinstance(value, Mapping):
                    return  # decoding reads it (and checks it) as the model value
                raise _Mismatch(expected, value)
            self.check_struct(value)

        return check

    def check_struct(self, value: Any) -> None:
        fields = self.structs.get(type(value)) or self.fields(type(value))
        for item, (exact, check, step) in zip(_astuple(value), fields, strict=True):
            if type(item) in exact:
                continue
            try:
                if check is None:
                    raise _Mismatch("", item)
                check(item)
            except _Mismatch as exc:
                exc.steps.append(step)
                if not exc.expected:
                    exc.expected = self.expected_of(type(value), step)
                raise

    def expected_of(self, cls: type, step: str) -> str:
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        for field in info.fields:
            if f".{field.encode_name}" == step:
                return _name(field.type)
        return "another type"

    def of(
        self, info: mi.Type, field: mi.Field | None = None
    ) -> tuple[frozenset[type], _Check | None]:
        """Exact types that need no further look, and the check of anything else."""
        exact, check = self._of(info)
        if field is not None and field.encode_name == EXTRA_KEY:
            return frozenset({type(None), ExtraFields}), None
        unset_default = (
            field is not None
            and not field.required
            and field.default is msgspec.NODEFAULT
            and field.default_factory is msgspec.NODEFAULT
        )
        if unset_default:  # a field whose default is UNSET
            exact = exact | {type(msgspec.UNSET)}
        return exact, check

    def _of(self, info: mi.Type) -> tuple[frozenset[type], _Check | None]:
        if isinstance(info, (mi.AnyType, mi.CustomType)):
            return frozenset(), lambda value: None
        expected = _name(info)
        if isinstance(info, mi.NoneType):
            return frozenset({type(None)}), None
        if isinstance(info, mi.BoolType):
            return frozenset({bool}), None
        if isinstance(info, mi.IntType):
            return frozenset({int}), _instance(int, expected, but=bool)
        if isinstance(info, mi.FloatType):
            return frozenset({int, float}), _instance((int, float), expected, but=bool)
        if isinstance(info, mi.StrType):
            if info.min_length:
                least = info.min_length

                def text(value: Any) -> None:
                    if not isinstance(value, str) or len(value) < least:
                        raise _Mismatch(expected, value)

                return frozenset(), text
            return frozenset({str}), _instance(str, expected)
        if isinstance(info, mi.LiteralType):
            allowed = frozenset(info.values)

            def literal(value: Any) -> None:
                if not isinstance(value, (str, int)) or value not in allowed:
                    raise _Mismatch(expected, value)

            return frozenset(), literal
        if isinstance(info, mi.DictType):
            return frozenset({dict}), _instance(Mapping, expected)
        if isinstance(info, mi.StructType):
            return frozenset(), self.struct(info.cls, expected)
        if isinstance(info, (mi.ListType, mi.VarTupleType)):
            return frozenset(), self.array(info.item_type, expected)
        if isinstance(info, mi.UnionType):
            return self.union(info, expected)
        return frozenset(), lambda value: None  # a type the model does not use: not checked

    def array(self, item_info: mi.Type, expected: str) -> _Check:
        exact, check = self._of(item_info)

        def array(value: Any) -> None:
            if type(value) is not tuple and not isinstance(value, (list, tuple)):
                raise _Mismatch(expected, value)
            for index, item in enumerate(value):
                if type(item) in exact:
                    continue
                try:
                    if check is None:
                        raise _Mismatch(_name(item_info), item)
                    check(item)
                except _Mismatch as exc:
                    exc.steps.append(f"[{index}]")
                    raise

        return array

    def union(self, info: mi.UnionType, expected: str) -> tuple[frozenset[type], _Check | None]:
        exact: set[type] = set()
        structs: dict[type, str] = {}
        others: list[tuple[frozenset[type], _Check | None]] = []
        for member in info.types:
            if isinstance(member, mi.StructType):
                structs[member.cls] = member.cls.__name__
                continue
            member_exact, member_check = self._of(member)
            if member_check is None:
                exact |= member_exact
            else:
                others.append((member_exact, member_check))
        loose = self.loose

        def union(value: Any) -> None:
            cls = type(value)
            if cls in structs or any(isinstance(value, s) for s in structs):
                self.check_struct(value)
                return
            if any(cls in member_exact for member_exact, _ in others):
                return
            for _, member_check in others:
                try:
                    member_check(value)  # type: ignore[misc]
                    return
                except _Mismatch:
                    continue
            if loose and structs and isinstance(value, Mapping):
                return
            raise _Mismatch(expected, value)

        if not structs and not others:
            return frozenset(exact), None
        return frozenset(exact), union


def _instance(kind: type | tuple[type, ...], expected: str, *, but: type | None = None) -> _Check:
    def check(value: Any) -> None:
        if not isinstance(value, kind) or (but is not None and isinstance(value, but)):
            raise _Mismatch(expected, value)

    return check


_BUILDERS: Final = {False: _Builder(False), True: _Builder(True)}
_SLOTS: Final[dict[type, tuple[tuple[int, bool], ...]]] = {}


def _holds_struct(info: mi.Type) -> bool:
    if isinstance(info, mi.StructType):
        return True
    return isinstance(info, mi.UnionType) and any(_holds_struct(t) for t in info.types)


def _slots(cls: type) -> tuple[tuple[int, bool], ...]:
    """``(field index, holds an array)`` of each field of ``cls`` declared to hold model values."""
    found = _SLOTS.get(cls)
    if found is None:
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        slots = []
        for index, field in enumerate(info.fields):
            members = field.type.types if isinstance(field.type, mi.UnionType) else (field.type,)
            for member in members:
                if isinstance(member, mi.StructType):
                    slots.append((index, False))
                elif isinstance(member, (mi.ListType, mi.VarTupleType)) and _holds_struct(
                    member.item_type
                ):
                    slots.append((index, True))
        found = _SLOTS[cls] = tuple(slots)
    return found


def _model_values_are_structs(value: Any) -> bool:
    """Whether every position declared to hold a model value holds one, not an object.

    msgspec, checking a value through its builtins, reads an object (a dict) where a model
    value is declared as that value: a strict check wants the value itself.
    """
    slots = _SLOTS.get(type(value)) or _slots(type(value))
    if not slots:
        return True
    items = _astuple(value)
    for index, many in slots:
        item = items[index]
        for entry in item if many and isinstance(item, (list, tuple)) else (item,):
            if isinstance(entry, msgspec.Struct):
                if not _model_values_are_structs(entry):
                    return False
            elif isinstance(entry, Mapping):
                return False
    return True


_KEPT: Final = (bytes, bytearray, memoryview)
"""Left as they are by ``to_builtins`` (not turned into base64 text a string field accepts)."""


def check_shape(
    values: object,
    types: type[msgspec.Struct] | tuple[type[msgspec.Struct], ...],
    *,
    what: str,
    path: str = "$",
    error: type[ValidationError] = ValidationError,
    loose: bool = False,
    one: bool = False,
    walk: bool = False,
) -> None:
    """Refuse ``values`` unless each is one of ``types`` with fields holding their declared types.

    ``values`` is a list or tuple of model values (``path`` locates it; an
    item is at ``{path}[i]``), or with ``one`` a single value at ``path``.
    Raises ``error`` (a :class:`ValidationError`) naming the expected type
    and what was found, at the field's path. With ``loose``, an object may
    stand for a nested model value (a store reads a content block given as
    a dict as the block it decodes to). A strict check asks msgspec first;
    ``walk`` skips that (msgspec reads a dict as a block: after a crash, the
    walk finds the dict that stood for one).
    """
    kinds = types if isinstance(types, tuple) else (types,)
    if one:
        items: Iterable[Any] = (values,)
    elif isinstance(values, (list, tuple)) or (
        isinstance(values, Sequence) and not isinstance(values, (str, bytes))
    ):
        items = values
    else:
        raise error(f"{what} must be a list, got {preview(values)}", path=path)
    builder = _BUILDERS[loose]
    index = 0
    try:
        for index, value in enumerate(items):
            if type(value) not in kinds and not isinstance(value, kinds):
                expected = " | ".join(k.__name__ for k in kinds)
                raise _Mismatch(expected, value)
            refused = None
            if not (loose or walk):
                try:
                    kind = cast(Hashable, type(value))
                    decoder(kind).convert(msgspec.to_builtins(value, builtin_types=_KEPT))
                    if _model_values_are_structs(value):
                        continue
                except msgspec.ValidationError as exc:
                    refused = exc  # a constraint, or a wrong type: the walk says which
                except Exception:  # a value msgspec cannot render (ExtraFields…): walk it
                    pass
            builder.check_struct(value)
            if refused is not None:  # the types hold; a constraint does not (an empty id…)
                where = path if one else f"{path}[{index}]"
                located = _located(refused, what)
                raise error(str(located).split(" (at ")[0], path=where + (located.path or "$")[1:])
    except _Mismatch as exc:
        where = (path if one else f"{path}[{index}]") + "".join(reversed(exc.steps))
        raise error(
            f"{what}: expected {exc.expected}, got {preview(exc.value)}", path=where
        ) from None
