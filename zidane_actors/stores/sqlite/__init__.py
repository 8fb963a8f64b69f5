"""The SQLite session store: the embedded default, safe for many processes on one file.

Every operation runs on one ``sqlite3`` connection owned by one worker
thread for the store's whole life (``_thread.WorkerThread``: FIFO, a caller
cancelled before its job is taken withdraws it; a lone write runs in the
trio thread itself while that thread and the run are idle), inside one
transaction: ``BEGIN IMMEDIATE`` for writes (so two processes never both
read-then-write), a deferred ``BEGIN`` for reads (a consistent WAL
snapshot). ``SQLITE_BUSY`` waits ``busy_timeout_ms`` inside SQLite, then is
retried with backoff; only an exhausted retry budget surfaces, as
:class:`~zidane_actors.errors.StoreUnavailableError`.
"""

from ._open import open_sqlite_store
from ._rows import Durability, SQLiteStoreStatistics
from ._store import SQLiteStore

__all__ = ["Durability", "SQLiteStore", "SQLiteStoreStatistics", "open_sqlite_store"]
