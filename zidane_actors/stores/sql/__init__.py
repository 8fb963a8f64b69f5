"""The SQL both SQL stores run, written once (layer 3, beneath ``sqlite`` and ``postgres``).

- :mod:`._dialect`: what differs between SQLite and PostgreSQL in a statement's
  text (the parameter mark, the insertion-order column, the lock clause).
- :mod:`._statements`: the statements both stores run, rendered per dialect.
- :mod:`._claims`: ``claim_run`` and ``demote_stale_run``.
- :mod:`._hooks`: what a store gives the shared methods (dialect, transactions).
- :mod:`._schedules`: the schedule methods, a mixin of both stores.
- :mod:`._send_requests`: finding, listing, settling and putting send requests.
- :mod:`._writes`: the single writes (``update_run`` … ``delete_artifact``), one step each.
- :mod:`._forks`: forks sharing their source's rows (the row ranges every read
  of turns follows, the runs a fork keeps, the copy before a rewrite).
- :mod:`._codec`: row decoding.
- :mod:`._where`: the ``WHERE`` conditions of ``list``/``list_meta``/``search_meta``
  (the rule itself, engine-free, stays in ``model``).
"""

from ._claims import SQLClaims
from ._codec import decode_row, meta_row
from ._dialect import POSTGRES, SQLITE, Dialect
from ._hooks import SQLHooks
from ._schedules import SQLSchedules
from ._send_requests import SQLSendRequests, send_record, settle_send_request
from ._statements import SharedSQL
from ._where import equal_sql, search_header_sql, search_words_sql, session_filter_sql
from ._writes import SQLWrites

__all__ = [
    "POSTGRES",
    "SQLITE",
    "Dialect",
    "SQLClaims",
    "SQLHooks",
    "SQLSchedules",
    "SQLSendRequests",
    "SQLWrites",
    "SharedSQL",
    "decode_row",
    "equal_sql",
    "meta_row",
    "search_header_sql",
    "search_words_sql",
    "send_record",
    "session_filter_sql",
    "settle_send_request",
]
