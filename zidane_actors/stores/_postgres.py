"""Where the PostgreSQL store lived: it is now the package :mod:`.postgres`."""

from .postgres import (
    CHANGES_CHANNEL,
    ChangeListener,
    PostgresStore,
    PostgresStoreStatistics,
    open_postgres_store,
)

__all__ = [
    "CHANGES_CHANNEL",
    "ChangeListener",
    "PostgresStore",
    "PostgresStoreStatistics",
    "open_postgres_store",
]
