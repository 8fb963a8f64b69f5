"""File names of a file map: the options naming them, and the check every name passes."""

from __future__ import annotations

import attrs

from ...errors import InvalidNameError
from ...model import preview

__all__ = ["FileMapStoreOptions", "check_file_name"]


def check_file_name(value: object, what: str) -> str:
    """A plain file name: no directory part, no ``..``, no hidden or control characters."""
    if not isinstance(value, str) or not value:
        raise InvalidNameError(f"{what} must be a non-empty string, got {preview(value)}")
    if (
        value in (".", "..")
        or value.startswith(".")
        or any(c in value for c in "/\\\0")
        or any(ord(c) < 32 for c in value)
        or len(value) > 255
    ):
        raise InvalidNameError(f"{what} {preview(value)} is not a plain file name")
    return value


def _validate_name(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    check_file_name(value, attribute.name)


@attrs.frozen
class FileMapStoreOptions:
    """File names of the map (plain, distinct names)."""

    meta_file: str = attrs.field(default="meta.json", validator=_validate_name)
    turns_file: str = attrs.field(default="turns.jsonl", validator=_validate_name)
    send_requests_file: str = attrs.field(default="send-requests.json", validator=_validate_name)

    def __attrs_post_init__(self) -> None:
        names = (self.meta_file, self.turns_file, self.send_requests_file)
        if len(set(names)) != len(names):
            raise InvalidNameError(f"file-map file names must be distinct, got {names}")
