"""Where the SQLite store lived: it is now the package :mod:`.sqlite`.

Kept only for the row codecs ``file_map`` still imports from here (to move to
``.sqlite._rows`` or ``.sql`` with that package's next change).
"""

from .sqlite import Durability, SQLiteStore, SQLiteStoreStatistics, open_sqlite_store
from .sqlite._rows import (
    _metadata_json,
    _now,
    _run_body,
    _turn_rows_of,
    _valid_body,
    _valid_header,
)

__all__ = [
    "Durability",
    "SQLiteStore",
    "SQLiteStoreStatistics",
    "_metadata_json",
    "_now",
    "_run_body",
    "_turn_rows_of",
    "_valid_body",
    "_valid_header",
    "open_sqlite_store",
]
