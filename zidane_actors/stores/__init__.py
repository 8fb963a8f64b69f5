"""Layer 3: the ``SessionStore`` protocol and the bundled stores.

Beside the stores, what every store shares: argument checks (``_validate``),
history edits (``_edits``), the background search indexer (``_indexer``),
forks on any store (``_forks``: the store's own or the generic copy) and the
model's view of a stored session (``_model_view``).

The PostgreSQL and remote stores are imported on first use of their names,
so a process that opens neither never loads psycopg or httpx (the server
imports only the REST bodies, ``stores.remote._bodies``).
"""

from typing import TYPE_CHECKING

from . import _protocol
from ._forks import fork_into, fork_session, list_forks
from ._lazy import lazy_names
from ._memory import MemoryStore, create_memory_store, open_memory_store
from ._protocol import *  # noqa: F403 (the protocol's public names: _protocol.__all__)
from .file_map import (
    DirectoryFileMapAdapter,
    FileMapAdapter,
    FileMapStore,
    FileMapStoreOptions,
    create_file_map_store,
    open_directory_adapter,
)
from .sqlite import Durability, SQLiteStore, SQLiteStoreStatistics, open_sqlite_store

if TYPE_CHECKING:
    from .postgres import PostgresStore, PostgresStoreStatistics, open_postgres_store
    from .remote._client import RemoteStore, RemoteStoreStatistics, create_remote_store

_LAZY = {
    "PostgresStore": ".postgres",
    "PostgresStoreStatistics": ".postgres",
    "open_postgres_store": ".postgres",
    "RemoteStore": ".remote._client",
    "RemoteStoreStatistics": ".remote._client",
    "create_remote_store": ".remote._client",
}


__getattr__, __dir__ = lazy_names(globals(), _LAZY)

__all__ = [
    "DirectoryFileMapAdapter",
    "Durability",
    "FileMapAdapter",
    "FileMapStore",
    "FileMapStoreOptions",
    "MemoryStore",
    "PostgresStore",
    "PostgresStoreStatistics",
    "RemoteStore",
    "RemoteStoreStatistics",
    "SQLiteStore",
    "SQLiteStoreStatistics",
    "create_file_map_store",
    "create_memory_store",
    "create_remote_store",
    "fork_into",
    "fork_session",
    "list_forks",
    "open_directory_adapter",
    "open_memory_store",
    "open_postgres_store",
    "open_sqlite_store",
]
__all__ += _protocol.__all__
