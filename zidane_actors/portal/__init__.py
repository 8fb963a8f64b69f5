"""Layer 7: a session host on its own trio loop, for asyncio and blocking callers.

``start_host(url)`` (blocking code) and ``open_host_async(url)`` (asyncio
code) open a store and a :class:`~zidane_actors.actors.SessionHost` in a
background thread running ``trio.run``; their handles expose the host and
``Session`` API as blocking methods or as coroutines that never block the
asyncio loop. See docs/integrations.md.
"""

from . import _api
from ._api import *  # noqa: F403 (the public names are _api.__all__, listed once there)

__all__ = _api.__all__
