"""The remote store: a client of the REST session API, and that API's bodies.

:mod:`._bodies` (the request and response Structs the server imports too) loads
with this package; the client (:mod:`._client`, which needs httpx) loads on
first use of its names.
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._bodies import MAX_BATCH_WRITES, ErrorBody, ErrorDetail, history_rev

if TYPE_CHECKING:
    from ._client import RemoteStore, RemoteStoreStatistics, create_remote_store

_LAZY = frozenset({"RemoteStore", "RemoteStoreStatistics", "create_remote_store"})


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("._client", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "MAX_BATCH_WRITES",
    "ErrorBody",
    "ErrorDetail",
    "RemoteStore",
    "RemoteStoreStatistics",
    "create_remote_store",
    "history_rev",
]
