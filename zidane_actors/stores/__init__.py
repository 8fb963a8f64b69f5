"""Layer 4: the ``SessionStore`` protocol and the bundled stores."""

from ._file_map import (
    DirectoryFileMapAdapter,
    FileMapAdapter,
    FileMapStore,
    FileMapStoreOptions,
    create_file_map_store,
    open_directory_adapter,
)
from ._memory import MemoryStore, create_memory_store, open_memory_store
from ._postgres import PostgresStore, PostgresStoreStatistics, open_postgres_store
from ._protocol import (
    OPTIONAL_METHODS,
    VERSIONED_WRITES,
    READ_METHODS,
    WRITE_METHODS,
    BatchingStore,
    FullSessionStore,
    HistoryMutation,
    MutateResult,
    Revision,
    RunClaim,
    SessionStore,
    StoreWrite,
    TurnsMutation,
    VersionedStore,
    store_capabilities,
)
from ._remote import RemoteStore, RemoteStoreStatistics, create_remote_store
from ._sqlite import Durability, SQLiteStore, SQLiteStoreStatistics, open_sqlite_store

__all__ = [
    "OPTIONAL_METHODS",
    "VERSIONED_WRITES",
    "READ_METHODS",
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
