"""A session store on PostgreSQL, shared by many hosts.

psycopg 3's blocking API runs in worker threads (no trio-native driver
exists): every connection has its own ``CapacityLimiter(1)`` and no thread
is ever abandoned on cancel. Batches of writes (group commit) run on one
dedicated connection; reads and single writes take any idle connection of
the pool. Cross-host races (run claims,
schedule fires, send-request ids, appends) are settled by row locks and
conditional statements inside one transaction each.
"""

from ._conn import CHANGES_CHANNEL, ChangeListener, PostgresStoreStatistics
from ._open import open_postgres_store
from ._store import PostgresStore

__all__ = [
    "CHANGES_CHANNEL",
    "ChangeListener",
    "PostgresStore",
    "PostgresStoreStatistics",
    "open_postgres_store",
]
