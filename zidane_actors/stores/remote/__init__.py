"""The remote store: a client of the REST session API, and that API's bodies.

:mod:`._bodies` (the request and response Structs the server imports too) loads
with this package; the client (:mod:`._client`, which needs httpx) loads on
first use of its names.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_names
from ._bodies import MAX_BATCH_WRITES, ErrorBody, ErrorDetail, history_rev

if TYPE_CHECKING:
    from ._client import RemoteStore, RemoteStoreStatistics, create_remote_store

_LAZY = dict.fromkeys(["RemoteStore", "RemoteStoreStatistics", "create_remote_store"], "._client")

__getattr__, __dir__ = lazy_names(globals(), _LAZY)

__all__ = [
    "MAX_BATCH_WRITES",
    "ErrorBody",
    "ErrorDetail",
    "RemoteStore",
    "RemoteStoreStatistics",
    "create_remote_store",
    "history_rev",
]
