"""Layer 5: the REST session API (ASGI on hypercorn's trio worker) over any store.

The read-only session browser under ``/ui/`` is served beside it (``_ui*``;
``_ui_reshape``: compaction folds, fork and branch links on a session page).
"""

from ._app import create_app, served_capabilities
from ._faults import FaultInjection, parse_faults
from ._limits import DEFAULT_MAX_BODY_BYTES, ServerLimits
from ._serve import serve

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "FaultInjection",
    "ServerLimits",
    "create_app",
    "parse_faults",
    "serve",
    "served_capabilities",
]
