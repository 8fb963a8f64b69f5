"""Layer 5: the REST session API (ASGI on hypercorn's trio worker) over any store."""

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
