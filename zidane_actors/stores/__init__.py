"""Layer 4: the ``SessionStore`` protocol and the bundled stores."""

from ._memory import MemoryStore, create_memory_store, open_memory_store
from ._protocol import (
    OPTIONAL_METHODS,
    WRITE_METHODS,
    BatchingStore,
    FullSessionStore,
    HistoryMutation,
    MutateResult,
    RunClaim,
    SessionStore,
    StoreWrite,
    TurnsMutation,
    store_capabilities,
)
from ._sqlite import Durability, SQLiteStore, SQLiteStoreStatistics, open_sqlite_store

__all__ = [
    "OPTIONAL_METHODS",
    "WRITE_METHODS",
    "BatchingStore",
    "Durability",
    "FullSessionStore",
    "HistoryMutation",
    "MemoryStore",
    "MutateResult",
    "RunClaim",
    "SQLiteStore",
    "SQLiteStoreStatistics",
    "SessionStore",
    "StoreWrite",
    "TurnsMutation",
    "create_memory_store",
    "open_memory_store",
    "open_sqlite_store",
    "store_capabilities",
]
