"""Layer 3: the ``SessionStore`` protocol and the bundled stores.

The PostgreSQL and remote stores are imported on first use of their names,
so a process that opens neither never loads psycopg or httpx (the server
imports only the REST bodies, ``stores.remote._bodies``).
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._memory import MemoryStore, create_memory_store, open_memory_store
from ._protocol import (
    OPTIONAL_METHODS,
    READ_METHODS,
    VERSIONED_WRITES,
    WRITE_METHODS,
    BatchingStore,
    FullSessionStore,
    HistoryMutation,
    MutateResult,
    ReadBatchingStore,
    Revision,
    RunClaim,
    SessionStore,
    StoreWrite,
    TurnsMutation,
    VersionedStore,
    store_capabilities,
)
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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "OPTIONAL_METHODS",
    "READ_METHODS",
    "VERSIONED_WRITES",
    "WRITE_METHODS",
    "BatchingStore",
    "DirectoryFileMapAdapter",
    "Durability",
    "FileMapAdapter",
    "FileMapStore",
    "FileMapStoreOptions",
    "FullSessionStore",
    "HistoryMutation",
    "MemoryStore",
    "MutateResult",
    "PostgresStore",
    "PostgresStoreStatistics",
    "ReadBatchingStore",
    "RemoteStore",
    "RemoteStoreStatistics",
    "Revision",
    "RunClaim",
    "SQLiteStore",
    "SQLiteStoreStatistics",
    "SessionStore",
    "StoreWrite",
    "TurnsMutation",
    "VersionedStore",
    "create_file_map_store",
    "create_memory_store",
    "create_remote_store",
    "open_directory_adapter",
    "open_memory_store",
    "open_postgres_store",
    "open_sqlite_store",
    "store_capabilities",
]
